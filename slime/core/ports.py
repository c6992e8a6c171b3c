"""Per-job port blocks, so two jobs on the same nodes never share (or join) a Ray cluster.

Every port a Ray node opens (and the preflight's rendezvous ports) comes from one block of
``BLOCK`` ports, chosen by hashing the job key into ``SLIME_RAY_PORT_RANGE`` (default below Linux's
ephemeral range), checked free by binding, falling back to the next block. :func:`claim_block` also
takes an atomic claim file per host and block, so two bootstraps on one node never pick the same one.
Guaranteed: deterministic per key; a claimed block was free when checked and is not claimed by
another bootstrap on this host. Not guaranteed: a non-slime process grabbing a port before Ray binds
it (the bootstrap then retries with the next block).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BLOCK",
    "Claim",
    "PortBlock",
    "PortsExhausted",
    "candidates",
    "choose_block",
    "claim_block",
    "port_free",
    "port_range",
    "shared_dir",
]

BLOCK = 200
_WORKER_FIRST = 12  # offsets 0..11 are the fixed ports below; workers get the rest of the block
_DEFAULT_RANGE = (20000, 32000)


class PortsExhausted(RuntimeError):
    """No candidate block was entirely free."""


@dataclass(frozen=True, slots=True)
class PortBlock:
    base: int

    gcs = property(lambda self: self.base)
    node_manager = property(lambda self: self.base + 1)
    object_manager = property(lambda self: self.base + 2)
    dashboard_agent_grpc = property(lambda self: self.base + 3)
    dashboard_agent_listen = property(lambda self: self.base + 4)
    metrics_export = property(lambda self: self.base + 5)
    runtime_env_agent = property(lambda self: self.base + 6)
    dashboard = property(lambda self: self.base + 7)
    client_server = property(lambda self: self.base + 8)
    gloo = property(lambda self: self.base + 9)  # the preflight's collective rendezvous (TCPStore) on node 0
    nccl = property(lambda self: self.base + 10)
    min_worker = property(lambda self: self.base + _WORKER_FIRST)
    max_worker = property(lambda self: self.base + BLOCK - 1)

    def all_ports(self) -> range:
        return range(self.base, self.base + BLOCK)

    def to_json(self) -> dict[str, int]:
        return {
            "gcs": self.gcs,
            "node_manager": self.node_manager,
            "object_manager": self.object_manager,
            "gloo": self.gloo,
            "nccl": self.nccl,
            "min_worker": self.min_worker,
            "max_worker": self.max_worker,
        }


def port_range() -> tuple[int, int]:
    """[low, high) from ``SLIME_RAY_PORT_RANGE=LOW-HIGH`` (default 20000-32000)."""
    text = os.environ.get("SLIME_RAY_PORT_RANGE", "").strip()
    if not text:
        return _DEFAULT_RANGE
    try:
        low, high = (int(x) for x in text.split("-"))
    except ValueError:
        raise ValueError(f"SLIME_RAY_PORT_RANGE={text!r}: expected LOW-HIGH, e.g. 20000-32000") from None
    if not (low >= 1024 and high <= 65536 and high - low >= BLOCK):
        raise ValueError(f"SLIME_RAY_PORT_RANGE={text!r}: need 1024 <= LOW, HIGH <= 65536 and at least {BLOCK} ports")
    return low, high


def candidates(key: str, low_high: tuple[int, int] | None = None) -> Iterator[PortBlock]:
    """Every block of the range, starting at the one ``key`` hashes to, wrapping around."""
    low, high = low_high or port_range()
    n = (high - low) // BLOCK
    first = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % n
    for i in range(n):
        yield PortBlock(low + ((first + i) % n) * BLOCK)


def port_free(port: int, host: str = "") -> bool:
    """True if a TCP socket can bind ``host:port`` right now (no SO_REUSEADDR: TIME_WAIT counts as taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def choose_block(
    key: str,
    *,
    skip: set[int] = frozenset(),
    is_free: Callable[[int], bool] = port_free,
    low_high: tuple[int, int] | None = None,
    max_tries: int = 64,
) -> PortBlock:
    """The first candidate block for ``key`` whose ports are all free (blocks in ``skip`` are passed over)."""
    for i, block in enumerate(candidates(key, low_high)):
        if i >= max_tries:
            break
        if block.base in skip:
            continue
        if all(is_free(p) for p in block.all_ports()):
            return block
    raise PortsExhausted(
        f"no free block of {BLOCK} ports for {key!r} in {low_high or port_range()} after "
        f"{max_tries} candidates; set SLIME_RAY_PORT_RANGE to a less busy range"
    )


# --------------------------------------------------------------------------- claims
def shared_dir(path: Path) -> Path:
    """Create ``path`` (and parents) world-writable and sticky, like /tmp, for every user's jobs."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        try:
            os.chmod(path, 0o1777)
        except PermissionError:  # someone else created it first
            pass
    return path


@dataclass(frozen=True, slots=True)
class Claim:
    block: PortBlock
    path: Path

    def release(self) -> None:
        if _owner(self.path) == os.getpid():
            self.path.unlink(missing_ok=True)


def _owner(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stale(path: Path) -> bool:
    """The claiming bootstrap is gone (its PID is dead or now runs something else)."""
    pid = _owner(path)
    if pid is None:
        return True
    if pid == os.getpid():
        return False
    try:
        return b"launchers.node.bootstrap" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _take(path: Path, key: str) -> bool:
    """Create the claim file atomically (content complete before it is visible)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".claim-")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"pid": os.getpid(), "key": key}, fh)
        for _ in range(2):
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                if not _stale(path):
                    return False
                try:
                    path.unlink()
                except OSError:  # another user's stale claim: leave the block alone
                    return False
        return False
    finally:
        os.unlink(tmp)


def claim_block(
    key: str,
    *,
    host: str,
    directory: Path,
    skip: set[int] = frozenset(),
    is_free: Callable[[int], bool] = port_free,
    low_high: tuple[int, int] | None = None,
    max_tries: int = 64,
) -> Claim:
    """Like :func:`choose_block`, and the block is claimed for this process on ``host``."""
    shared_dir(directory)
    why: list[str] = []  # per block tried: what stopped it (for the error)
    for i, block in enumerate(candidates(key, low_high)):
        if i >= max_tries:
            break
        if block.base in skip:
            continue
        path = directory / f"{host}-{block.base}"
        if not _take(path, key):
            why.append(f"{block.base}: claimed by another job")
            continue
        busy = next((p for p in block.all_ports() if not is_free(p)), None)
        if busy is None:
            return Claim(block, path)
        why.append(f"{block.base}: port {busy} in use")
        path.unlink(missing_ok=True)
    shown = "; ".join(why[:4]) + (f"; ... ({len(why)} blocks)" if len(why) > 4 else "")
    raise PortsExhausted(
        f"no free block of {BLOCK} ports for {key!r} in {low_high or port_range()} on {host} "
        f"({shown or 'no block fits in the range'}); set SLIME_RAY_PORT_RANGE to a less busy "
        "range, or free the ports named"
    )
