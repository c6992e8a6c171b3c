"""The one micro-batch planner of ``train.micro_batch_size`` and ``train.dynamic_batch``, for every backend.

Pure Python (no torch): identical on every rank given the same lengths, which all ranks of one model
replica (its TP/PP/CP group) need, or their collectives deadlock. Guaranteed: every sample index appears
in exactly one micro-batch, and micro-batches come in a deterministic order (by their first sample), so
gradients accumulate in the same order on every run and an exact resume replays the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Plan", "pad_to_multiple", "plan_micro_batches"]


@dataclass(frozen=True, slots=True)
class Plan:
    batches: tuple[tuple[int, ...], ...]
    oversized: tuple[int, ...] = field(default=())  # samples longer than the token budget on their own

    def padded_tokens(self, lengths: Sequence[int]) -> list[int]:
        return [len(b) * max(lengths[i] for i in b) for b in self.batches]


def pad_to_multiple(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def plan_micro_batches(
    lengths: Sequence[int], *, micro_batch_size: int = 1, max_tokens_per_gpu: int | None = None
) -> Plan:
    """Split sample indices ``0..len(lengths)-1`` (samples of ``lengths`` real tokens, each >= 1).

    ``max_tokens_per_gpu`` None: consecutive groups of ``micro_batch_size``. Otherwise dynamic packing
    (``micro_batch_size`` ignored) by *first-fit decreasing*: longest sample first, each into the first
    micro-batch whose *padded* cost (samples x longest sample, what a padded ``[b, s]`` batch really
    computes) stays within the budget. Why this one: sorting puts each micro-batch's longest sample in
    it first, so short samples fill the gaps a long one left; packing in arrival order (the greedy
    alternative) opens a new micro-batch whenever a long sample follows short ones, giving more forward
    passes and more padding for the same budget. A sample over the budget gets a micro-batch of its own
    and is reported in ``Plan.oversized`` (it cannot be split without context parallelism).
    """
    if micro_batch_size < 1:
        raise ValueError(f"train.micro_batch_size must be >= 1, got {micro_batch_size}")
    if any(n < 1 for n in lengths):
        raise ValueError("every sample needs at least one token")
    n = len(lengths)
    if max_tokens_per_gpu is None:
        return Plan(tuple(tuple(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)))
    if max_tokens_per_gpu < 1:
        raise ValueError(f"train.dynamic_batch.max_tokens_per_gpu must be >= 1, got {max_tokens_per_gpu}")
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    longest: list[int] = []  # longest sample per bin (the first one placed, given the order)
    oversized = []
    for i in order:
        if lengths[i] > max_tokens_per_gpu:
            oversized.append(i)
            bins.append([i])
            longest.append(lengths[i])
            continue
        for b, members in enumerate(bins):
            if longest[b] <= max_tokens_per_gpu and (len(members) + 1) * longest[b] <= max_tokens_per_gpu:
                members.append(i)
                break
        else:
            bins.append([i])
            longest.append(lengths[i])
    batches = sorted((tuple(sorted(b)) for b in bins), key=lambda b: b[0])
    return Plan(tuple(batches), tuple(sorted(oversized)))
