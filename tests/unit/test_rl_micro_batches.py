"""The one micro-batch planner (``slime.rl.micro_batches``) both train backends use."""

from __future__ import annotations

import pytest

from slime.rl.micro_batches import pad_to_multiple, plan_micro_batches


def test_static_micro_batches():
    plan = plan_micro_batches([5, 6, 7, 8, 9], micro_batch_size=2)
    assert plan.batches == ((0, 1), (2, 3), (4,)) and plan.oversized == ()
    assert plan_micro_batches([5, 9, 3, 30, 2, 2, 8], micro_batch_size=3).batches == ((0, 1, 2), (3, 4, 5), (6,))
    with pytest.raises(ValueError, match="micro_batch_size must be >= 1"):
        plan_micro_batches([1, 2], micro_batch_size=0)


def test_dynamic_micro_batches_respect_padded_budget():
    lengths = [100, 30, 60, 30, 90, 10, 200, 45]
    plan = plan_micro_batches(lengths, max_tokens_per_gpu=200)
    assert sorted(i for b in plan.batches for i in b) == list(range(len(lengths)))
    assert all(cost <= 200 for cost in plan.padded_tokens(lengths))
    assert len(plan.batches) < len(lengths)  # it did pack
    assert [b[0] for b in plan.batches] == sorted(b[0] for b in plan.batches)
    # a sample above the budget gets its own micro-batch and is reported
    over = plan_micro_batches([50, 500, 20], max_tokens_per_gpu=100)
    assert over.oversized == (1,) and (1,) in over.batches
    with pytest.raises(ValueError, match="max_tokens_per_gpu must be >= 1"):
        plan_micro_batches([1], max_tokens_per_gpu=0)
    with pytest.raises(ValueError, match="at least one token"):
        plan_micro_batches([3, 0], max_tokens_per_gpu=10)


def test_first_fit_decreasing_fills_the_gaps_that_arrival_order_leaves():
    """Short samples between long ones: packing in arrival order would need 6 micro-batches here, not 5."""
    lengths = [5, 9, 3, 30, 2, 2, 8]
    plan = plan_micro_batches(lengths, max_tokens_per_gpu=12)
    assert plan.oversized == (3,) and (3,) in plan.batches
    assert sorted(i for b in plan.batches for i in b) == list(range(len(lengths)))
    for b in plan.batches:
        assert len(b) == 1 or max(lengths[i] for i in b) * len(b) <= 12
    assert plan.batches == ((0, 2), (1,), (3,), (4, 5), (6,))  # 3 joins 5, the two 2s share one
    assert plan == plan_micro_batches(lengths, max_tokens_per_gpu=12)  # deterministic


def test_pad_to_multiple():
    assert [pad_to_multiple(n, 8) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]
