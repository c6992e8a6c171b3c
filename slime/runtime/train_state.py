"""The loop's own state, and what a checkpoint of the run holds: save, choose, restore.

:class:`TrainState` counts rollouts, optimizer steps and the served weight version, plus the
rollout manager's data state; its ``state_dict`` is the checkpoint's ``state.json`` (older
checkpoints load). :meth:`ResumePoint.find` picks the run's newest checkpoint, else
``train.checkpoint.load``, and checks it before Ray starts; :func:`restore_checkpoint` loads it.
Guaranteed: a failed save leaves no partial checkpoint, and an ``OSError`` there is exit 2, not a
bug. Not done: falling back to an older checkpoint when the newest is damaged (the error says which).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.runtime.checkpoint import CheckpointError, CheckpointStore, damaged_checkpoint

if TYPE_CHECKING:
    from slime.runtime.trainer_group import TrainerGroup

__all__ = ["ResumePoint", "TrainState", "restore_checkpoint", "save_checkpoint"]

FORMAT = 1


@dataclass
class TrainState:
    rollout_id: int = -1  # the last completed rollout (-1: none)
    step: int = 0  # optimizer steps done
    weight_version: int = 0  # the version the engines serve (0: the initial weights)
    data: dict[str, Any] = field(default_factory=dict)  # the rollout manager's state_dict
    prefetched: int | None = None  # async: the rollout generated ahead, saved beside state.json (rollout_feed)

    KEYS = ("rollout_id", "step", "weight_version", "manager")  # required ("prefetched" is optional)

    def state_dict(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "step": self.step,
            "weight_version": self.weight_version,
            "manager": self.data,
            "prefetched": self.prefetched,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from a ``state_dict`` (or a checkpoint's ``state.json``); ``ValueError`` if incomplete."""
        missing = self.missing(state)
        if missing:
            raise ValueError(f"a train state needs {list(self.KEYS)}; missing {missing}")
        self.rollout_id, self.step = int(state["rollout_id"]), int(state["step"])
        self.weight_version, self.data = int(state["weight_version"]), dict(state["manager"])
        prefetched = state.get("prefetched")
        self.prefetched = None if prefetched is None else int(prefetched)

    @classmethod
    def missing(cls, state: dict[str, Any]) -> list[str]:
        return sorted(set(cls.KEYS) - set(state))


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run resumes from and its ``state.json`` (read and checked)."""

    path: Path
    state: dict[str, Any]
    from_load: bool  # it is ``train.checkpoint.load`` (the run has no checkpoint of its own)

    @classmethod
    def find(cls, store: CheckpointStore, load: str | None) -> ResumePoint | None:
        """The run's own newest checkpoint, else ``load``, else None (a fresh start).

        Raises ``CheckpointError`` naming the usable checkpoints when its ``state.json`` is damaged."""
        path = store.resume_point(load)
        if path is None:
            return None
        from_load = path != store.latest()
        state = CheckpointStore.read_state(path, from_load=from_load)
        missing = TrainState.missing(state)
        if missing:
            raise damaged_checkpoint(path, f"its state.json lacks {missing}", from_load=from_load)
        return cls(path, state, from_load)


def save_checkpoint(
    store: CheckpointStore, state: TrainState, groups: Sequence[TrainerGroup], files: Mapping[str, str] | None = None
) -> Path:
    """Checkpoint ``state`` and every rank of ``groups`` (actor first) as rollout ``state.rollout_id``;
    ``files`` (name → text) are written beside ``state.json`` (an async run's prefetched rollout)."""
    from slime.core.paths import atomic_write
    from slime.diagnosis.beats import beat
    from slime.runtime.failures import checkpoint_save_error

    tmp = None
    try:
        tmp = store.begin(state.rollout_id)
        for group in groups:
            group.call("save", str(tmp))
            beat("checkpoint save")  # a long save of many groups and files is progress, not a stall
        for name, text in (files or {}).items():
            atomic_write(tmp / name, text)
            beat("checkpoint save")
        world = len(groups[0].ranks) if groups else 0  # 0: debug.mode rollout_only has no trainer ranks
        doc = {"format": FORMAT, **state.state_dict(), "world_size": world, "saved_at": time.time()}
        return store.commit(tmp, state.rollout_id, doc)
    except BaseException as exc:
        if tmp is not None:
            store.abort(tmp)
        mapped = checkpoint_save_error(exc, store.root, state.rollout_id)  # disk full: no bug
        if mapped is not None:
            raise mapped from exc
        raise


def restore_checkpoint(point: ResumePoint, state: TrainState, groups: Sequence[TrainerGroup]) -> None:
    """Load every rank of ``groups`` (actor first) and ``state`` from ``point``.

    A rank file that is truncated or missing becomes a ``CheckpointError`` naming the checkpoint and
    the usable ones; other errors from the ranks pass unchanged."""
    from slime.runtime.failures import root_cause

    saved, world = point.state.get("world_size"), len(groups[0].ranks) if groups else 0
    if saved not in (None, world):
        raise ValueError(
            f"checkpoint {point.path} was saved by {saved} trainer ranks, this job has "
            f"{world}; resume with the same train.nodes/gpus_per_node and debug.mode"
        )
    try:
        for group in groups:
            group.call("load", str(point.path))
    except Exception as exc:
        cause = root_cause(exc)
        if isinstance(cause, (CheckpointError, FileNotFoundError)):
            raise damaged_checkpoint(point.path, str(cause), from_load=point.from_load) from None
        raise
    state.load_state_dict(point.state)
