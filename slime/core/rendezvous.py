"""How the nodes of one job meet: small JSON files in ``tasks/<i>/rendezvous/`` of the run dir.

The one owner of this file protocol, shared by the node side (``launchers.node``), the batch script
(the stop file) and the SLURM restart helper (failed nodes). The run dir is on a filesystem every
node sees, so it is the simplest reliable channel. Files: ``head-``, ``node-<rank>``,
``preflight-``, ``collective-<rank>``, ``done-`` and ``stop-`` per ``<instance>`` (``<job
id>.<restart count>``, so an earlier run's files are never taken for the current one's).
Guaranteed: writes are atomic (write + rename); polling is bounded by the caller's deadline and
stop event. What each file holds and why stop is a file: docs/design-notes.md.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from slime.core.paths import atomic_write

__all__ = ["FAILED_STATES", "HEAD_READS_PER_S", "Rendezvous", "head_poll_s"]

#: node record states of a node that failed (its Ray did not start or join) or was lost (its Ray died)
FAILED_STATES = ("failed", "lost")
#: how often all of a job's waiting nodes together read the head record, at most (past 100 nodes)
HEAD_READS_PER_S = 1000.0


def head_poll_s(num_nodes: int) -> float:
    """Seconds between one waiting node's reads of the head record: 0.1 up to 100 nodes, then longer,
    so that a big job's nodes do not flood the shared filesystem's metadata server while the head
    starts (tests/bench/rendezvous_scale.py)."""
    return max(0.1, num_nodes / HEAD_READS_PER_S)


class Rendezvous:
    def __init__(self, directory: Path, instance: str) -> None:
        self.dir = directory
        self.instance = instance

    # ------------------------------------------------------------------ paths
    @property
    def head_file(self) -> Path:
        return self.dir / f"head-{self.instance}.json"

    @property
    def done_file(self) -> Path:
        return self.dir / f"done-{self.instance}"

    @property
    def go_file(self) -> Path:
        """Written by the head when the preflight starts: the nodes' collective may begin."""
        return self.dir / f"preflight-{self.instance}"

    @property
    def stop_file(self) -> Path:
        return self.dir / f"stop-{self.instance}"

    def collective_file(self, rank: int) -> Path:
        return self.dir / f"collective-{self.instance}-{rank}.json"

    def node_file(self, rank: int) -> Path:
        return self.dir / f"node-{self.instance}-{rank}.json"

    # ------------------------------------------------------------------ writes
    def _write(self, path: Path, data: dict[str, Any]) -> None:
        atomic_write(path, json.dumps({**data, "instance": self.instance, "time": time.time()}, indent=1) + "\n")

    def clean_stale(self) -> None:
        """Remove files of other instances (earlier runs of a requeued job)."""
        if not self.dir.is_dir():
            return
        for p in self.dir.iterdir():
            if self.instance not in p.name:
                p.unlink(missing_ok=True)

    def publish_head(self, **info: Any) -> None:
        self._write(self.head_file, info)

    def write_node(self, rank: int, **info: Any) -> None:
        self._write(self.node_file(rank), {"rank": rank, **info})

    def go(self) -> None:
        self._write(self.go_file, {})

    def mark_done(self, rc: int) -> None:
        self._write(self.done_file, {"rc": rc})

    # ------------------------------------------------------------------ reads
    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def head(self) -> dict[str, Any] | None:
        return self._read(self.head_file)

    def node(self, rank: int) -> dict[str, Any] | None:
        return self._read(self.node_file(rank))

    def nodes(self, num_nodes: int) -> dict[int, dict[str, Any]]:
        return {r: info for r in range(num_nodes) if (info := self.node(r)) is not None}

    def node_records(self) -> list[dict[str, Any]]:
        """Every node record of this instance, whatever the number of nodes (by file name)."""
        records = (self._read(p) for p in sorted(self.dir.glob(f"node-{self.instance}-*.json")))
        return [r for r in records if isinstance(r, dict)]

    def failed_hosts(self) -> list[str]:
        """Hosts whose node recorded itself failed or lost in this instance."""
        return [str(r["host"]) for r in self.node_records() if r.get("state") in FAILED_STATES and r.get("host")]

    def collectives(self, num_nodes: int) -> dict[int, dict[str, Any]]:
        return {r: info for r in range(num_nodes) if (info := self._read(self.collective_file(r))) is not None}

    def done(self) -> bool:
        return self.done_file.exists()

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def done_rc(self) -> int | None:
        """The head's exit code once it is done (None before, or if unreadable)."""
        rc = (self._read(self.done_file) or {}).get("rc")
        return rc if isinstance(rc, int) else None

    def wait_head(self, deadline: float, stop: threading.Event, poll: float = 0.1) -> dict[str, Any] | None:
        """The head's record, or None when the deadline passes, the job is done, or ``stop`` is set."""
        while time.monotonic() < deadline and not stop.is_set():
            info = self.head()
            if info is not None:
                return info
            if self.done():
                return None
            stop.wait(poll)
        return None
