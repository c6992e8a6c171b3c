"""Progress beats: a long phase says "still moving" from whichever process does the work.

``beat(phase)`` is the one call, in any process of a run. In the driver it reaches the stall watchdog
(``Watchdog.beat``) directly; in a Ray worker (trainer rank, engine host, rollout manager) it adds one
to the phase's count on the job's :class:`BeatBoard` actor (``slime.runtime.watchdog.start_board``),
which the watchdog reads every poll and turns into a beat of the phase it times. A worker sends at
most one beat per phase per ``SEND_EVERY_S``. A beat of another phase than the one timed is ignored (an
async rollout's progress does not hide a hung weight sync). Without Ray or a board (unit tests, the
watchdog off) a worker's beat does nothing. Not covered: processes that are not Ray workers.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BOARD", "SEND_EVERY_S", "BeatBoard", "beat", "set_local"]

BOARD = "slime-beats"  # the board's actor name, in the job's Ray namespace
SEND_EVERY_S = 1.0  # a worker's beats of one phase, at most this often (phase timeouts are far longer)
_LOOKUP_EVERY_S = 10.0  # a worker without a board looks again this often

_local: Callable[[str], None] | None = None  # this process's watchdog (the driver's)
_sent: dict[str, float] = {}
_board: Any = None
_looked = -math.inf


def beat(phase: str) -> None:
    """Progress in ``phase`` (a name of ``slime.diagnosis.phases.PHASES``; "train step" for either step)."""
    global _looked
    if _local is not None:
        _local(phase)
        return
    now = time.monotonic()
    if now - _sent.get(phase, -math.inf) < SEND_EVERY_S:
        return
    _sent[phase] = now
    board = _board
    if board is None and now - _looked >= _LOOKUP_EVERY_S:
        _looked = now
        board = _find_board()
    if board is not None:
        try:
            board.beat.remote(phase)
        except Exception:  # noqa: BLE001 - a beat must never fail the work it reports on
            pass


def set_local(fn: Callable[[str], None] | None) -> None:
    """Make ``fn`` (the driver's ``Watchdog.beat``) receive this process's beats; None: undo."""
    global _local
    _local = fn


def _find_board() -> Any:
    global _board
    # Ray only where this process loaded it already (a Ray worker): the control plane never loads it
    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            _board = ray.get_actor(BOARD)
    except Exception:  # noqa: BLE001 - no board (the watchdog is off): beats do nothing
        return None
    return _board


class BeatBoard:
    """Ray actor body: the beats each phase got from the workers, counted."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def beat(self, phase: str) -> None:
        self.counts[phase] = self.counts.get(phase, 0) + 1

    def read(self) -> dict[str, int]:
        return dict(self.counts)
