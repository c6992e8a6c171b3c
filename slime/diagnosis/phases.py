"""The phases the stall watchdog times, and how long each may go without progress.

``cluster.stall_timeout_s``: null = each phase's default below; a number = that for every phase,
twice it where first-time work is expected (engine start, the first train step); 0 = no watchdog.
The trainer ranks' collective timeout is the train phase's, so a hung all-reduce ends with a message.
"""

from __future__ import annotations

__all__ = ["DEFAULT_TIMEOUT_S", "PHASES", "beat_key", "collective_timeout_s", "phase_timeout_s"]

#: phase -> default seconds without progress (sized for real GPU jobs: model loads, long rollouts)
DEFAULT_TIMEOUT_S: dict[str, float] = {
    "engine start": 1800.0,
    "rollout": 3600.0,
    "first train step": 3600.0,  # kernels compile, allocators warm up
    "train step": 1800.0,
    "weight sync": 900.0,
    "checkpoint save": 1800.0,
    "eval": 3600.0,
}
PHASES = tuple(DEFAULT_TIMEOUT_S)
_OFF = 0.0
#: phases that do first-time work (loads, compiles, allocator warm-up): twice a single setting
FIRST_TIME = ("engine start", "first train step")


def phase_timeout_s(setting: float | None, phase: str) -> float | None:
    """Seconds ``phase`` may go without progress under ``cluster.stall_timeout_s`` = ``setting`` (None: off)."""
    if setting is not None and setting <= _OFF:
        return None
    if setting is None:
        return DEFAULT_TIMEOUT_S[phase]
    return float(setting) * (2 if phase in FIRST_TIME else 1)


def beat_key(phase: str | None) -> str | None:
    """The name progress in ``phase`` is reported under (``beats.beat``): both train steps are "train step"."""
    return "train step" if phase == "first train step" else phase


def collective_timeout_s(setting: float | None) -> float:
    """The trainer process groups' timeout: the train step's (the first step's, which is the longest)."""
    return phase_timeout_s(setting, "first train step") or DEFAULT_TIMEOUT_S["first train step"]
