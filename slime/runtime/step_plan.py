"""The driver's side of turning a rollout into optimizer steps, without torch.

:func:`train_inputs` (what a rank needs of each ``Sample``), :func:`plan_steps` / :class:`StepPlan`
(which samples each data-parallel rank trains on at each step) and :class:`ShardScores` (what a
rank needs to compute its samples' sequence scores: the whole rollout's rewards and ids).
Kept apart from ``train_data`` so the driver process never imports torch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ShardScores", "StepPlan", "critic_only", "plan_steps", "train_inputs"]


def critic_only(algorithm: Any, r: int) -> bool:
    """Rollout ``r`` is in the critic-only warm-up (``algorithm.critic.warmup_rollouts``, PPO): decided by
    the rollout id alone, so a resumed run freezes the actor over the same rollouts."""
    c = algorithm.critic
    return c is not None and r < c.warmup_rollouts


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardScores:
    """One rank's input to ``train_data.rank_scores``: the rollout's rewards and groups, and its own samples."""

    rewards: tuple[float, ...]
    """Every sample's reward, in rollout order."""
    group_ids: tuple[Hashable, ...]
    """Every sample's group (``Sample.group_index``)."""
    episode_ids: tuple[Hashable, ...]
    """Every sample's episode (``slime.rl.sample.episode_id``): one agent episode counts once in its group."""
    indices: tuple[int, ...]
    """The rank's samples, step after step, as ``StepPlan.take`` orders them."""


@dataclass(frozen=True)
class StepPlan:
    """The samples (indices) each data-parallel rank trains on at each optimizer step of one rollout."""

    rows: tuple[tuple[tuple[int, ...], ...], ...]  # [step][dp_rank] -> sample indices, ascending

    @property
    def steps(self) -> int:
        return len(self.rows)

    def take(self, items: Sequence[Any], dp_rank: int) -> list[Any]:
        """Rank ``dp_rank``'s items, step after step."""
        return [items[i] for step in self.rows for i in step[dp_rank]]

    def sizes(self, dp_rank: int) -> list[int]:
        """How many of rank ``dp_rank``'s items each step takes."""
        return [len(step[dp_rank]) for step in self.rows]


def plan_steps(lengths: Sequence[int], *, dp_size: int, target: int, balance_tokens: bool = False) -> StepPlan:
    """Optimizer steps for samples of token lengths ``lengths`` (rules: docs/design-notes.md).

    ``target``: ``train.global_batch_size``. Raises ``ValueError`` when there are fewer samples than
    data-parallel ranks (some rank would have nothing to train on)."""
    n = len(lengths)
    if n < dp_size:
        raise ValueError(f"{n} sample(s) cannot give each of the {dp_size} data-parallel ranks one to train on")
    steps = max(1, min(int(n / max(1, target) + 0.5), n // dp_size))
    out = []
    for chunk in _even_chunks(list(range(n)), steps):
        if balance_tokens:
            out.append(_by_tokens(chunk, lengths, dp_size))
        else:
            out.append(tuple(tuple(part) for part in _even_chunks(chunk, dp_size)))
    return StepPlan(tuple(out))


def _even_chunks(items: list[int], k: int) -> list[list[int]]:
    """``k`` contiguous chunks whose sizes differ by at most one (the longer ones first)."""
    q, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        end = start + q + (i < extra)
        out.append(items[start:end])
        start = end
    return out


def _by_tokens(chunk: list[int], lengths: Sequence[int], dp_size: int) -> tuple[tuple[int, ...], ...]:
    """Longest sample first to the rank with the fewest tokens (ties: the lower rank): every rank gets
    one of the first ``dp_size``; each rank keeps its samples in their original order."""
    load = [0] * dp_size
    parts: list[list[int]] = [[] for _ in range(dp_size)]
    for i in sorted(chunk, key=lambda i: (-lengths[i], i)):
        rank = min(range(dp_size), key=lambda d: (load[d], d))
        parts[rank].append(i)
        load[rank] += lengths[i]
    return tuple(tuple(sorted(p)) for p in parts)


def train_inputs(samples: Sequence[Any]) -> list[dict[str, Any]]:
    """What a trainer rank needs of each ``Sample`` (what ``train_data.collate`` reads), as plain dicts; with
    its identity (``row``: its position in ``samples``, the rollout's saved order) for the trainer's sidecar."""
    return [
        {
            "tokens": s.tokens,
            "response_length": s.response_length,
            "loss_mask": s.loss_mask,
            "rollout_log_probs": s.rollout_log_probs,
            "teacher_log_probs": s.teacher_log_probs,
            "row": row,
            "group_index": s.group_index,
            "index": s.index,
        }
        for row, s in enumerate(samples)
    ]
