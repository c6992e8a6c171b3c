"""The RL data path: prompt source -> generation -> rewards -> filters -> buffer -> trainer.

One rollout: draw prompt groups (partial-rollout buffer first, then the dataset cursor;
:mod:`.source`), generate each group in one request (:mod:`.generate`), score, filter with dynamic
sampling drawing more rounds as needed (:mod:`.collect`), abort what still runs once ``batch_size``
groups pass (buffered with ``rollout.partial``), hand the kept samples to the trainer (saved with
``debug.save_rollouts``, :mod:`.saved`). Guaranteed: the kept groups are the first to pass *in draw
order*, not the first to finish, so a run without partial rollout is repeatable. Not guaranteed:
how far an aborted request got (timing). Step by step: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slime.rl.sample import Sample

__all__ = ["RolloutBatch"]


@dataclass
class RolloutBatch:
    """What one rollout hands the trainer: the kept samples, in group order, and the generation's metrics
    (``rollout/groups_*``, ``rollout/rounds``, ...)."""

    samples: list[Sample]
    metrics: dict[str, Any] = field(default_factory=dict)
