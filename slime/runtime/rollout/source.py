"""Where a rollout's prompt groups come from: the partial-rollout buffer first, then the dataset.

A :class:`Group` is one prompt and its samples while generated, scored and filtered (``draw`` is
its stable id). :class:`PromptSource` hands out buffered groups oldest first, then fresh prompts
from the dataset's resumable cursor. Its ``state_dict`` (cursor, buffer, draw counter) goes into
every checkpoint, so a resumed run continues the same prompts *and* partial responses (slime loses
them). Guaranteed: ``load_state_dict(state_dict())`` restores exactly; no buffer loads as empty.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slime.rl.sample import Sample

__all__ = ["Group", "PromptSource"]


@dataclass
class Group:
    samples: list[Sample]
    draw: int  # the run's count of drawn groups when this one was drawn
    start_rollout: int  # the rollout that first drew it
    metrics: dict[str, Any] = field(default_factory=dict)  # what generation measured (agent: episodes)

    def to_dict(self) -> dict[str, Any]:
        return {"draw": self.draw, "start_rollout": self.start_rollout, "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Group:
        return cls([Sample.from_dict(s) for s in d["samples"]], int(d["draw"]), int(d["start_rollout"]))


class PromptSource:
    """``dataset``: a ``PromptDataset``; ``encode``: text → token ids; ``n``: samples per prompt."""

    def __init__(self, dataset: Any, *, n: int, encode: Callable[[str], list[int]]) -> None:
        self.dataset, self.n, self.encode = dataset, n, encode
        self.buffer: deque[Group] = deque()
        self.draws = 0

    def take(self, k: int, rollout_id: int) -> list[Group]:
        """``k`` groups: buffered ones first (oldest first), then fresh prompts."""
        out = [self.buffer.popleft() for _ in range(min(k, len(self.buffer)))]
        if len(out) < k:
            for row in self.dataset.next_batch(k - len(out)):
                ids = self.encode(row.text)
                meta = {**row.metadata, "rollout_id": rollout_id}
                samples = [
                    Sample(prompt=row.text, tokens=list(ids), label=row.label, metadata=dict(meta))
                    for _ in range(self.n)
                ]
                out.append(Group(samples, draw=self.draws, start_rollout=rollout_id))
                self.draws += 1
        return out

    def put_back(self, groups: list[Group]) -> None:
        """Buffer ``groups`` for the next rollout (after the ones already buffered)."""
        self.buffer.extend(groups)

    def state_dict(self) -> dict[str, Any]:
        return {
            "data": self.dataset.state_dict(),
            "buffer": [g.to_dict() for g in self.buffer],
            "draws": self.draws,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state["data"])
        self.buffer = deque(Group.from_dict(g) for g in state.get("buffer", []))
        self.draws = int(state.get("draws", 0))
