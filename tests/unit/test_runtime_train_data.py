"""Samples → tensors and advantages: alignment, sharding over ranks, whitening with global moments."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from slime.rl.advantages import compute_advantages  # noqa: E402
from slime.runtime.train_data import collate, sequence_scores, shard_for_rank, token_advantages  # noqa: E402


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


def test_shards_cover_each_step_once_per_data_parallel_rank():
    items = list(range(16))
    shards = [shard_for_rank(items, dp_rank=r, dp_size=2, steps=2) for r in range(2)]
    assert shards == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    with pytest.raises(ValueError, match="data-parallel"):
        shard_for_rank(list(range(6)), dp_rank=0, dp_size=4, steps=1)
    with pytest.raises(ValueError, match="num_steps_per_rollout"):
        shard_for_rank(list(range(6)), dp_rank=0, dp_size=1, steps=4)


def test_sequence_scores_per_estimator():
    r = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    grpo = sequence_scores(r, estimator="grpo", group_size=4, normalize_std=True)
    assert grpo[0] == pytest.approx(1.5, rel=1e-4) and grpo[1] == pytest.approx(-0.5, rel=1e-4)
    assert sequence_scores(r, estimator="reinforce_plus_plus_baseline", group_size=4, normalize_std=True)[
        :2
    ] == pytest.approx([0.75, -0.25])
    assert sequence_scores(r, estimator="ppo", group_size=4, normalize_std=True) == r


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
