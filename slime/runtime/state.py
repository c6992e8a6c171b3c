"""The task's own status file and the graceful-stop flag.

``tasks/<i>/state.json`` (state, last rollout, newest checkpoint, exit code, error, ...) is rewritten
atomically on every change; job management reads it, resuming never needs it. SIGUSR1 (SLURM's
time-limit warning) and SIGTERM set a flag: the loop finishes its rollout, saves a checkpoint and
exits with :data:`ExitCode.REQUEUE` (75, BSD's EX_TEMPFAIL), which launchers map to "requeue me".
A second signal does not abort the checkpoint being written.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from slime.core.paths import atomic_write

__all__ = [
    "StopFlag",
    "TaskState",
]


class StopFlag:
    """Set by SIGUSR1/SIGTERM (or :meth:`request`); polled by the loop between rollouts."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> StopFlag:
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed from the main thread
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.request(signal.Signals(signum).name)

    def request(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


class TaskState:
    """Writes ``TaskPaths.state``."""

    def __init__(self, path: Path, *, num_rollouts: int) -> None:
        self.path = path
        self.doc: dict[str, Any] = {
            "state": "running",
            "rollout_id": -1,
            "num_rollouts": num_rollouts,
            "checkpoint": None,
            "exit_code": None,
            "error": None,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.time(),
        }

    def update(self, **fields: Any) -> None:
        self.doc.update(fields)
        self.doc["updated"] = time.time()
        atomic_write(self.path, json.dumps(self.doc, indent=1, sort_keys=True) + "\n")

    @staticmethod
    def read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
