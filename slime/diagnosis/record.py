"""One record per failure of a task, in ``tasks/<i>/diagnosis.json`` (a JSON list, oldest first).

Written by the driver (every failure, and the watchdog's stall) with :func:`append`; read by
``status`` and ``slime-submit why`` with :func:`read`. An unreadable file reads as no records, so a
damaged record never hides the run's state. Paths inside are relative to the run dir (a copied run
dir still resolves them).
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from slime.core.paths import TaskPaths, atomic_write

__all__ = ["Diagnosis", "append", "read"]


class Diagnosis(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What happened, where, the evidence and what to change."""

    cause: str  # a key of slime.diagnosis.causes.CAUSES
    title: str  # one line: what happened
    fix: str  # what to change
    exit_code: int
    phase: str | None = None
    who: str | None = None  # the rank, engine or process that is behind or died
    node: str | None = None
    pid: int | None = None
    frame: str | None = None  # the frame it waits in (a stall) or the user's frame (an error)
    rollout: int | None = None
    step: int | None = None
    evidence: tuple[str, ...] = ()  # the lines that matter, at most five
    stacks: str | None = None  # the stack-dump folder, relative to the run dir
    message: str = ""  # the full error message
    time: float = 0.0


def read(tp: TaskPaths) -> list[Diagnosis]:
    try:
        return msgspec.json.decode(tp.diagnosis.read_bytes(), type=list[Diagnosis])
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return []


def append(tp: TaskPaths, record: Diagnosis) -> Diagnosis:
    if not record.time:
        record = msgspec.structs.replace(record, time=time.time())
    records = [*read(tp), record]
    atomic_write(tp.diagnosis, msgspec.json.format(msgspec.json.encode(records), indent=1).decode() + "\n")
    return record


def relative(path: Path, root: Path) -> str:
    """``path`` relative to the run dir ``root`` where it lies inside it, else as it is."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)
