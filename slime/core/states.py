"""The one run-state vocabulary: what a task is doing, whatever runs it (SLURM, local, the runtime).

``RunState`` is a ``StrEnum``, so a state compares equal to its text and is written to JSON
(``state.json``, ``jobs.json``, ``status --json``) as that text. The runtime writes
``running``/``succeeded``/``failed``/``preempted`` into ``state.json``; job views (``status``,
``list``) map a scheduler's own words onto the same enum (``launchers.slurm.jobs.STATE_MAP``) and
show ``preempted`` as ``requeued``.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RunState"]


class RunState(StrEnum):
    PENDING = "pending"  # queued, not started
    RUNNING = "running"
    REQUEUED = "requeued"  # stopped and queued again (preemption, time limit, a counted failure)
    SUSPENDED = "suspended"
    PREEMPTED = "preempted"  # the runtime stopped after saving a checkpoint, to be requeued (state.json)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"  # no source knows the job any more

    @property
    def is_terminal(self) -> bool:
        """The task will do no more work on its own (a requeued or preempted one will)."""
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        """The task may still do work: a duplicate submit is refused, ``logs -f`` keeps following."""
        return self in _ACTIVE

    @classmethod
    def parse(cls, text: str | None) -> RunState:
        """``text`` as a state; anything unknown (or ``None``) is :attr:`UNKNOWN`."""
        try:
            return cls(text)
        except ValueError:
            return cls.UNKNOWN


_TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.TIMEOUT, RunState.CANCELLED})
_ACTIVE = frozenset({RunState.PENDING, RunState.RUNNING, RunState.REQUEUED, RunState.SUSPENDED, RunState.PREEMPTED})
