"""What Linux's ``/proc`` says about another process: whether it handles a signal before one is sent.

Shared by the node bootstrap (a stop's USR1 to the driver) and the stall watchdog (its stack-dump
signal to a worker): sending a signal a process does not handle would kill it (their default action).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["catches"]


def catches(pid: int, sig: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``sig`` (``SigCgt`` in /proc; None: cannot tell)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return None
