"""Samples → tensors and advantages: alignment, step plans over ranks (any sample count), group scores of
groups of any size, whitening with global moments."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from slime.rl.advantages import compute_advantages  # noqa: E402
from slime.rl.sample import Sample, episode_id  # noqa: E402
from slime.runtime.step_plan import ShardScores, plan_steps  # noqa: E402
from slime.runtime.train_data import (  # noqa: E402
    collate,
    rank_scores,
    sequence_scores,
    token_advantages,
)


def test_collate_aligns_response_tokens_with_their_predicting_position():
    b = collate(
        [
            {
                "tokens": [10, 11, 12, 13, 14],
                "response_length": 2,
                "loss_mask": [1, 0],
                "rollout_log_probs": [-0.5, -0.25],
            },
            {"tokens": [20, 21, 22], "response_length": 1, "rollout_log_probs": [-1.0]},
        ],
        pad_id=0,
    )
    assert b.tokens.tolist() == [[10, 11, 12, 13, 14], [20, 21, 22, 0, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # position t scores token t+1: response tokens 13, 14 are predicted at positions 2, 3
    assert b.response_mask.tolist() == [[0, 0, 1, 0], [0, 1, 0, 0]]
    assert b.rollout_log_probs.tolist() == [[0, 0, -0.5, -0.25], [0, -1.0, 0, 0]]
    with pytest.raises(ValueError, match="non-empty prompt and response"):
        collate([{"tokens": [1, 2], "response_length": 2}])


def test_a_fixed_count_plan_is_contiguous_steps_and_rank_slices():
    plan = plan_steps([5] * 16, dp_size=2, target=8)
    assert plan.steps == 2
    assert [plan.take(list(range(16)), r) for r in range(2)] == [
        [0, 1, 2, 3, 8, 9, 10, 11],
        [4, 5, 6, 7, 12, 13, 14, 15],
    ]
    assert plan.sizes(0) == plan.sizes(1) == [4, 4]


@pytest.mark.parametrize("n", [2, 3, 7, 11, 13, 24, 25, 40])
@pytest.mark.parametrize("dp", [1, 2, 3])
@pytest.mark.parametrize("tokens", [False, True])
def test_any_count_is_planned_once_each_with_every_rank_busy(n, dp, tokens):
    if n < dp:
        return
    lengths = [3 + (7 * i) % 11 for i in range(n)]
    plan = plan_steps(lengths, dp_size=dp, target=8, balance_tokens=tokens)
    assert plan.steps == max(1, min(int(n / 8 + 0.5), n // dp))  # global_batch_size is a target
    seen = sorted(i for step in plan.rows for part in step for i in part)
    assert seen == list(range(n))  # every sample exactly once
    for step in plan.rows:
        assert len(step) == dp and all(part for part in step)  # no rank idles
        assert all(list(part) == sorted(part) for part in step)
        sizes = [len(part) for part in step]
        if not tokens:
            assert max(sizes) - min(sizes) <= 1
    counts = [sum(len(p) for p in step) for step in plan.rows]
    assert max(counts) - min(counts) <= 1  # steps are near-equal slices in order
    assert [i for step in plan.rows for i in sorted(j for p in step for j in p)] == list(range(n))


def test_token_balance_evens_the_ranks_tokens():
    lengths = [40, 3, 3, 3, 3, 3, 3, 30, 3, 3]  # 94 tokens; by count 52 vs 42, by tokens 46 vs 48
    by_count = plan_steps(lengths, dp_size=2, target=10)
    by_tokens = plan_steps(lengths, dp_size=2, target=10, balance_tokens=True)
    load = lambda plan: [sum(lengths[i] for i in part) for part in plan.rows[0]]  # noqa: E731
    assert load(by_count) == [52, 42]
    assert load(by_tokens) == [46, 48] and by_tokens.rows[0] == ((0, 5, 8), (1, 2, 3, 4, 6, 7, 9))


def test_fewer_samples_than_ranks_is_refused():
    with pytest.raises(ValueError, match="1 sample\\(s\\) cannot give each of the 2 data-parallel ranks"):
        plan_steps([4], dp_size=2, target=8)


def test_sequence_scores_per_estimator():
    r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    grpo = sequence_scores(r, estimator="grpo", group_size=4, normalize_std=True)
    assert grpo[0] == pytest.approx(1.5, rel=1e-4) and grpo[1] == pytest.approx(-0.5, rel=1e-4)
    assert sequence_scores(r, estimator="reinforce_plus_plus_baseline", group_size=4, normalize_std=True)[
        :2
    ] == pytest.approx([0.75, -0.25])
    assert sequence_scores(r, estimator="ppo", group_size=4, normalize_std=True) == r


def test_scores_of_groups_by_id_equal_the_contiguous_form_and_take_any_size():
    r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    contiguous = sequence_scores(r, estimator="grpo", group_size=4, normalize_std=True)
    by_id = sequence_scores(r, estimator="grpo", group_ids=[0] * 4 + [1] * 4, normalize_std=True)
    assert by_id == contiguous
    # the same groups interleaved (the general path): the same scores per sample
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    mixed = sequence_scores(
        [r[i] for i in order], estimator="grpo", group_ids=[i // 4 for i in order], normalize_std=True
    )
    assert mixed == pytest.approx([contiguous[i] for i in order], abs=1e-6)
    # uneven groups: 3 and 1 samples (a lone sample scores 0: no baseline to compare with)
    uneven = sequence_scores([1.0, 0.0, 0.0, 1.0], estimator="grpo", group_ids=[7, 7, 7, 9], normalize_std=True)
    assert uneven[0] == pytest.approx((1 - 1 / 3) / ((1 / 3) ** 0.5 + 1e-6), rel=1e-5)
    assert uneven[3] == 0.0


def test_each_rank_computes_the_whole_rollouts_scores_at_its_own_samples():
    """The driver sends every rank the rollout's rewards and groups (it never imports torch); a rank's scores
    are the one-process scores at its samples, in the plan's order, whatever the split."""
    r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.0, 1.0, 0.0]
    groups, eps = [i // 4 for i in range(12)], list(range(12))
    whole = sequence_scores(r, estimator="grpo", group_ids=groups, episode_ids=eps, normalize_std=True)
    plan = plan_steps([3, 9, 4, 8, 5, 7, 6, 2, 1, 9, 3, 4], dp_size=2, target=6, balance_tokens=True)
    for d in range(2):
        indices = tuple(plan.take(range(12), d))
        shard = ShardScores(rewards=tuple(r), group_ids=tuple(groups), episode_ids=tuple(eps), indices=indices)
        got = rank_scores(shard, estimator="grpo", normalize_std=True)
        assert got == plan.take(whole, d) and len(got) == len(indices) > 0
    # the estimator and the std switch are the rank's (its spec): centred only, and raw for PPO
    shard = ShardScores(rewards=tuple(r), group_ids=tuple(groups), episode_ids=tuple(eps), indices=(0, 1))
    assert rank_scores(shard, estimator="grpo", normalize_std=False) == pytest.approx([0.75, -0.25])
    assert rank_scores(shard, estimator="ppo", normalize_std=True) == [1.0, 0.0]


def test_forked_episode_leaves_count_once_in_their_group():
    # group of 2 episodes: episode "a" (reward 1) forked into 3 leaves, episode "b" (reward 0) one sample
    scores = sequence_scores(
        [1.0, 1.0, 1.0, 0.0],
        estimator="grpo",
        group_ids=[0, 0, 0, 0],
        episode_ids=["a", "a", "a", "b"],
        normalize_std=True,
    )
    # per episode: mean 0.5, std (unbiased, 2 values) 0.7071: +0.7071 for every leaf of a, -0.7071 for b
    assert scores == pytest.approx([0.70710, 0.70710, 0.70710, -0.70710], abs=1e-4)
    leaf = Sample(index=3, metadata={"agent": {"session_id": "s1"}})
    assert episode_id(leaf) == episode_id(Sample(index=4, metadata={"agent": {"session_id": "s1"}}))
    assert episode_id(Sample(index=3)) != episode_id(Sample(index=3))  # plain samples: each its own


def _mask(rows):
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"])
def test_two_ranks_whitened_with_global_moments_match_one_process(estimator):
    g = torch.Generator().manual_seed(0)
    mask = _mask([[1, 1, 1, 0], [0, 1, 1, 1], [1, 1, 0, 0], [1, 0, 1, 1]])
    scores = torch.randn(4, generator=g)
    values = torch.randn(4, 4, generator=g)
    kl = torch.randn(4, 4, generator=g).abs()
    rewards = scores
    scores = torch.tensor(sequence_scores(rewards.tolist(), estimator=estimator, group_size=2, normalize_std=True))
    kw = dict(estimator=estimator, kl=kl, kl_coef=0.1, values=values, gamma=0.9, lambd=0.8)
    whole, _ = token_advantages(scores, mask, **kw)
    # one process over all rows equals slime.rl's reference implementation on the raw rewards
    ref = compute_advantages(
        estimator, rewards=rewards, mask=mask, group_size=2, kl=kl, kl_coef=0.1, values=values, gamma=0.9, lambd=0.8
    )
    assert torch.allclose(whole, ref.advantages, atol=1e-5)
    # two "ranks": each all-reduce adds the other half's contribution
    halves = [slice(0, 2), slice(2, 4)]

    def stats(h):
        captured = {}

        def capture(t):
            captured["t"] = t.clone()
            return t

        token_advantages(scores[h], mask[h], **{**kw, "kl": kl[h], "values": values[h]}, all_reduce=capture)
        return captured["t"]

    parts = [stats(h) for h in halves]
    for i, h in enumerate(halves):
        other = parts[1 - i]
        adv, _ = token_advantages(
            scores[h], mask[h], **{**kw, "kl": kl[h], "values": values[h]}, all_reduce=lambda t, o=other: t + o
        )
        assert torch.allclose(adv, whole[h], atol=1e-5)


def test_group_estimators_broadcast_scores_and_reject_reward_kl():
    mask = _mask([[1, 1, 0], [0, 1, 1]])
    adv, ret = token_advantages(torch.tensor([0.5, -2.0]), mask, estimator="grpo")
    assert adv.tolist() == [[0.5, 0.5, 0.0], [0.0, -2.0, -2.0]] and torch.equal(adv, ret)
    with pytest.raises(ValueError, match="kl_loss_coef"):
        token_advantages(torch.tensor([0.5, -2.0]), mask, estimator="grpo", kl_coef=0.1)
    with pytest.raises(ValueError, match="critic"):
        token_advantages(torch.tensor([0.5, -2.0]), mask, estimator="ppo")
