"""One memory cgroup per :class:`~slime.agent.sandbox.local.LocalSandbox`: a cap on all its processes together.

rlimits bound each process; the cgroup bounds the sum, tmpfs pages and swap included. Every
``exec`` joins it before the command runs; past the cap the OOM killer acts inside it only.
:func:`find_parent` picks cgroup v2 (``$SLIME_SANDBOX_CGROUP`` or the hierarchy root) or v1;
without either there is no total cap and the caller says so. Leftovers of a dead process are
removed by the next sandbox. Why no library: it is a handful of cgroupfs files, and the Python
packages cover v1 only or need systemd/D-Bus. Placement rules: docs/design-notes.md.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ENV_PARENT", "MemoryCgroup", "Parent", "find_parent", "owner_alive", "owner_tag", "sweep"]

ENV_PARENT = "SLIME_SANDBOX_CGROUP"
PREFIX = "slime-sandbox-"
MIB = 1024 * 1024


@dataclass(frozen=True)
class Parent:
    """Where sandbox cgroups are created."""

    path: Path
    version: int  # 1 or 2


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of each cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, tail = pre.split(), post.split()
            if len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
                out.append((fields[3], fields[4], tail[0], set(tail[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: '' for v2, else the controller list."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _join(mount_root: str, mount_point: str, path: str) -> Path:
    if mount_root != "/" and path.startswith(mount_root):
        path = path[len(mount_root) :]
    return Path(mount_point) / path.lstrip("/")


def _v2_parent(mount_root: str, mount_point: str, own: str) -> Parent | str:
    explicit = os.environ.get(ENV_PARENT)
    if explicit:
        path = Path(explicit)
        if "memory" not in _read(path / "cgroup.subtree_control", "").split():
            return f"${ENV_PARENT}={explicit} has no memory controller in its cgroup.subtree_control"
        return Parent(path, 2)
    root = _join(mount_root, mount_point, "/")
    if "memory" not in _read(root / "cgroup.controllers", "").split():
        return "cgroup v2 has no memory controller here"
    if _join(mount_root, mount_point, own) != root:
        return (
            f"this process is in cgroup {own}, which cannot hold sandbox cgroups beside its processes; "
            f"set ${ENV_PARENT} to a delegated cgroup with memory in its cgroup.subtree_control"
        )
    try:
        _enable_memory(root)
        parent = root / "slime-sandboxes"
        parent.mkdir(exist_ok=True)
        _enable_memory(parent)
    except OSError as exc:
        return f"cannot prepare {root}/slime-sandboxes: {exc.strerror}"
    return Parent(parent, 2)


def _enable_memory(path: Path) -> None:
    if "memory" not in _read(path / "cgroup.subtree_control", "").split():
        (path / "cgroup.subtree_control").write_text("+memory")


def find_parent() -> Parent | str:
    """Where this process can create memory cgroups, or why it cannot."""
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError as exc:
        return f"cannot read this process's cgroups: {exc}"
    for mount_root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            found = _v2_parent(mount_root, point, own[""])
            if isinstance(found, Parent):
                return found
            v2_reason = found
            break
    else:
        v2_reason = "no cgroup v2 hierarchy"
    for mount_root, point, fstype, opts in mounts:
        if fstype == "cgroup" and "memory" in opts and "memory" in own:
            path = _join(mount_root, point, own["memory"])
            if os.access(path, os.W_OK):
                return Parent(path, 1)
            return f"{v2_reason}; the cgroup v1 memory controller at {path} is not writable (not root?)"
    return f"{v2_reason}, and no cgroup v1 memory controller is mounted"


def _read(path: Path, default: str | None = None) -> str:
    try:
        return path.read_text()
    except OSError:
        if default is None:
            raise
        return default


def owner_tag() -> str:
    """This process as '<pid>-<start time>' (pids are reused; the pair is not)."""
    return f"{os.getpid()}-{_start_time(os.getpid())}"


def owner_alive(tag: str) -> bool:
    pid, _, start = tag.partition("-")
    return pid.isdigit() and _start_time(int(pid)) == start


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class MemoryCgroup:
    """A cgroup with a memory cap (see the module docstring)."""

    def __init__(self, parent: Parent, name: str, limit_bytes: int) -> None:
        self.version = parent.version
        self.limit_bytes = limit_bytes
        self.path = parent.path / f"{PREFIX}{owner_tag()}-{name}"
        self.path.mkdir()
        try:
            self._set_limits()
        except BaseException:
            self.remove()
            raise

    def _set_limits(self) -> None:
        limit = str(self.limit_bytes)
        if self.version == 2:
            (self.path / "memory.max").write_text(limit)
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (self.path / name).exists():
                    (self.path / name).write_text(value)
        else:
            (self.path / "memory.limit_in_bytes").write_text(limit)
            if (self.path / "memory.memsw.limit_in_bytes").exists():  # swap accounting on
                (self.path / "memory.memsw.limit_in_bytes").write_text(limit)

    def add(self, pid: int) -> None:
        """Move ``pid`` (one process, not its existing children) into the cgroup."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def peak_bytes(self) -> int | None:
        """The most memory the cgroup held at once (None where the kernel does not say)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        text = _read(self.path / name, "").strip()
        return int(text) if text.isdigit() else None

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in this cgroup."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in _read(self.path / name, "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def pids(self) -> list[int]:
        return [int(p) for p in _read(self.path / "cgroup.procs", "").split()]

    def remove(self) -> None:
        """Kill what is left in the cgroup and remove it (errors are swallowed: best effort)."""
        for _ in range(50):
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    return
            time.sleep(0.02)  # killed processes leave the cgroup once reaped


def sweep(parent: Parent) -> None:
    """Remove empty sandbox cgroups whose owner process is gone."""
    try:
        names = [n for n in os.listdir(parent.path) if n.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        pid, _, rest = name[len(PREFIX) :].partition("-")
        start = rest.partition("-")[0]
        if not owner_alive(f"{pid}-{start}"):
            try:
                (parent.path / name).rmdir()
            except OSError:
                pass
