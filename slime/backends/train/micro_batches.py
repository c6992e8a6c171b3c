"""Split one rank's batch into micro-batches: fixed sample counts or a token budget.

``plan_micro_batches`` returns lists of row indices. Fixed mode takes
``micro_batch_size`` rows at a time, in order. Dynamic mode
(``train.dynamic_batch``) packs rows in order while the micro-batch's *padded*
cost ``rows x longest row`` stays within ``max_tokens_per_gpu`` (padding is
what the forward pass actually computes); a row longer than the budget gets a
micro-batch of its own and is counted as oversized rather than dropped.

Guaranteed: every row appears in exactly one micro-batch, order preserved, so a
plan is deterministic (exact resume depends on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["MicroBatchPlan", "plan_micro_batches"]


@dataclass
class MicroBatchPlan:
    batches: list[list[int]] = field(default_factory=list)
    oversized: list[int] = field(default_factory=list)  # rows longer than the token budget


def plan_micro_batches(
    lengths: Sequence[int], *, micro_batch_size: int, max_tokens: int | None = None
) -> MicroBatchPlan:
    """Row indices per micro-batch for rows of real length ``lengths``."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    plan = MicroBatchPlan()
    n = len(lengths)
    if max_tokens is None:
        plan.batches = [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
        return plan
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_gpu must be >= 1, got {max_tokens}")
    current: list[int] = []
    longest = 0
    for i, length in enumerate(lengths):
        if length > max_tokens:
            plan.oversized.append(i)
        grown = max(longest, length)
        if current and grown * (len(current) + 1) > max_tokens:
            plan.batches.append(current)
            current, grown = [], length
        current.append(i)
        longest = grown
    if current:
        plan.batches.append(current)
    return plan
