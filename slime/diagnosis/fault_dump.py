"""The stack dump a worker writes itself (``faulthandler``), for where py-spy is missing or cannot attach.

A run's worker processes (trainer ranks, engine hosts, the rollout manager) call :func:`arm` at start:
``FAULT_SIGNAL`` then makes the process write every thread's Python stack to its own file on its node.
:func:`request` sends the signal, only to a process that handles it (the signal's default action would
kill it), and reads what it wrote within a bounded wait. Not guaranteed: a dump from a stopped process,
or one whose C code blocks the signal; thread names (ids only; the signalled one is taken as main).
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import tempfile
import time
from pathlib import Path
from typing import IO

from slime.core.procfs import catches

__all__ = ["FAULT_SIGNAL", "arm", "fault_file", "parse", "request"]

# SIGUSR1 is the run's checkpoint-and-stop signal (slime.runtime.state, SLURM's pre-timeout warning);
# SIGUSR2 is free in our workers (Ray handles it only in its dashboard agent).
FAULT_SIGNAL = signal.SIGUSR2
_armed: IO[str] | None = None  # this process's open dump file (faulthandler writes to its descriptor)
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def fault_file(pid: int) -> Path:
    """Where process ``pid`` on this node writes its dump: node-local, read by the same node's dump task."""
    return Path(tempfile.gettempdir()) / f"slime-stacks-{os.getuid()}" / f"{pid}.txt"


def arm() -> Path | None:
    """Make ``FAULT_SIGNAL`` dump this process's threads to :func:`fault_file` (once; None if it cannot)."""
    global _armed
    path = fault_file(os.getpid())
    if _armed is not None:
        return path
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fh = path.open("w")
        faulthandler.register(FAULT_SIGNAL, file=fh, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError):
        return None  # best effort: py-spy is the main way
    _armed = fh
    return path


def request(pid: int, *, timeout_s: float = 5.0) -> list[dict] | str:
    """Process ``pid``'s threads (py-spy's JSON shape), dumped by its faulthandler; else why not."""
    path = fault_file(pid)
    if catches(pid, FAULT_SIGNAL) is not True or not path.is_file():
        return "it has no faulthandler dump armed (not a slime worker, or it started before this version)"
    start = path.stat().st_size
    try:
        os.kill(pid, FAULT_SIGNAL)
    except OSError as exc:
        return f"cannot signal it: {exc}"
    deadline, last = time.monotonic() + timeout_s, start
    while time.monotonic() < deadline:
        time.sleep(0.05)
        size = path.stat().st_size
        if size > start and size == last:  # written, and no longer growing
            break
        last = size
    else:
        return f"no dump within {timeout_s:g}s (stopped, or blocked in C with the signal masked)"
    with path.open() as fh:
        fh.seek(start)
        threads = parse(fh.read())
    return threads or "its dump had no Python frames"


def parse(text: str) -> list[dict]:
    """faulthandler's text as py-spy's JSON: ``[{thread_id, thread_name, frames: [innermost first]}]``."""
    threads: list[dict] = []
    for line in text.splitlines():
        if m := _THREAD.match(line):
            # the thread that ran the handler: Linux hands a process's signal to its main thread unless
            # that one blocks it or already has one pending
            name = "MainThread" if m.group(1) == "Current thread" else None
            threads.append({"thread_id": int(m.group(2), 16), "thread_name": name, "frames": []})
        elif (m := _FRAME.match(line)) and threads:
            threads[-1]["frames"].append({"name": m.group(3), "filename": m.group(1), "line": int(m.group(2))})
    return threads
