"""Advantage estimators against hand-computed values on tiny [B, T] tensors."""

from __future__ import annotations

import math

import pytest
import torch

from slime.rl.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    discounted_returns,
    gae,
    group_normalized_rewards,
    last_token_mask,
    ppo_advantages,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    token_level_rewards,
)

SQRT_THIRD = math.sqrt(1 / 3)  # 0.57735027


def _pop_whiten(values: list[float]) -> torch.Tensor:
    """(x - mean) / sqrt(population var + 1e-8), written out for the expected values."""
    n = len(values)
    mean = sum(values) / n
    var = sum((x - mean) ** 2 for x in values) / n
    return torch.tensor([(x - mean) / math.sqrt(var + 1e-8) for x in values])


def test_group_normalisation_with_std() -> None:
    # group [1, 0, 0]: mean 1/3, deviations [2/3, -1/3, -1/3],
    #   unbiased var = (4/9 + 1/9 + 1/9) / 2 = 1/3, std = 0.57735
    #   -> [2/3 / 0.57735, -1/3 / 0.57735, ...] = [1.1547, -0.57735, -0.57735]
    # group [1, 2, 2]: mean 5/3, deviations [-2/3, 1/3, 1/3], same std
    out = group_normalized_rewards([1.0, 0.0, 0.0, 1.0, 2.0, 2.0], 3)
    a, b = (2 / 3) / SQRT_THIRD, (1 / 3) / SQRT_THIRD
    torch.testing.assert_close(out, torch.tensor([a, -b, -b, -a, b, b]), atol=1e-5, rtol=1e-5)


def test_group_normalisation_without_std_only_centres() -> None:
    out = group_normalized_rewards([1.0, 0.0, 0.0, 1.0, 2.0, 2.0], 3, normalize_std=False)
    torch.testing.assert_close(out, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]))


def test_group_of_one_has_zero_advantage_and_no_nan() -> None:
    # one sample per prompt: r - mean = 0, and the (undefined) std is never taken
    out = group_normalized_rewards([3.0, -1.0], 1, normalize_std=True)
    torch.testing.assert_close(out, torch.zeros(2))
    # identical rewards in a group: std 0 -> 0 / (0 + 1e-6) = 0, not NaN
    torch.testing.assert_close(group_normalized_rewards([1.0, 1.0], 2), torch.zeros(2))


def test_group_size_must_divide() -> None:
    with pytest.raises(ValueError, match="group_size .* = 4 .* divide the number of samples 6"):
        group_normalized_rewards([0.0] * 6, 4)


def test_grpo_broadcasts_to_trained_tokens_only() -> None:
    # rewards [1, 0] in one group of 2: deviations [0.5, -0.5], unbiased std = sqrt(0.5) = 0.70711
    # -> advantages [0.70711, -0.70711] on trained tokens, 0 on padding
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    res = compute_advantages("grpo", rewards=[1.0, 0.0], mask=mask, group_size=2)
    s = 0.5 / math.sqrt(0.5)
    expected = torch.tensor([[s, s, 0.0], [-s, 0.0, 0.0]])
    torch.testing.assert_close(res.advantages, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res.returns, expected, atol=1e-5, rtol=1e-5)
    for name in ("gspo", "cispo"):
        same = compute_advantages(name, rewards=[1.0, 0.0], mask=mask, group_size=2)
        torch.testing.assert_close(same.advantages, res.advantages)


def test_last_token_mask_and_token_rewards() -> None:
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    torch.testing.assert_close(
        last_token_mask(mask),
        torch.tensor([[0.0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0]]),
    )
    kl = torch.tensor([[0.2, 5.0, 0.4, 9.0], [1.0, 2.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    # row 0: [-0.1*0.2, (masked kl) 0, -0.1*0.4 + 1, 0] = [-0.02, 0, 0.96, 0]
    # row 1: [-0.1, -0.2 + 2, 0, 0] = [-0.1, 1.8, 0, 0]
    out = token_level_rewards([1.0, 2.0, 3.0], mask, kl=kl, kl_coef=0.1)
    torch.testing.assert_close(
        out, torch.tensor([[-0.02, 0.0, 0.96, 0.0], [-0.1, 1.8, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    )


def test_discounted_returns_flow_across_masked_tool_tokens() -> None:
    # token rewards [0, 0, 1], mask [1, 0, 1] (position 1 is tool output), gamma 0.5:
    # G2 = 1; G1 = 0 + 0.5 * 1 = 0.5 (masked out in the output); G0 = 0 + 0.5 * 0.5 = 0.25
    out = discounted_returns(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[1, 0, 1]]), gamma=0.5)
    torch.testing.assert_close(out, torch.tensor([[0.25, 0.0, 1.0]]))


def test_gae_three_tokens_with_gamma_and_lambda() -> None:
    # gamma 0.9, lambda 0.8, kl_coef 0.1, reward 1; the 4th position is padding with garbage.
    # token rewards: r0 = -0.1*0.2 = -0.02; r1 = 0; r2 = -0.1*(-0.1) + 1 = 1.01
    # delta2 = 1.01 + 0.9*0   - 0.3 = 0.71            A2 = 0.71
    # delta1 = 0    + 0.9*0.3 - 0.4 = -0.13           A1 = -0.13 + 0.72*0.71   = 0.3812
    # delta0 = -0.02 + 0.9*0.4 - 0.5 = -0.16          A0 = -0.16 + 0.72*0.3812 = 0.114464
    # returns = A + V = [0.614464, 0.7812, 1.01]
    mask = torch.tensor([[1, 1, 1, 0]])
    values = torch.tensor([[0.5, 0.4, 0.3, 99.0]])
    kl = torch.tensor([[0.2, 0.0, -0.1, 50.0]])
    tr = token_level_rewards([1.0], mask, kl=kl, kl_coef=0.1)
    adv, ret = gae(tr, values, mask, gamma=0.9, lambd=0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.114464, 0.3812, 0.71, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.614464, 0.7812, 1.01, 0.0]]))

    res = ppo_advantages([1.0], values, mask, kl=kl, kl_coef=0.1, gamma=0.9, lambd=0.8)
    # whitened: mean 0.401888, population var 0.0593245 -> [-1.180065, -0.084938, 1.265003]
    expected = torch.cat([_pop_whiten([0.114464, 0.3812, 0.71]), torch.zeros(1)])[None]
    torch.testing.assert_close(res.advantages, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        res.advantages[0, :3], torch.tensor([-1.180065, -0.084938, 1.265003]), atol=1e-5, rtol=1e-5
    )
    torch.testing.assert_close(res.returns, ret)  # returns come from the unwhitened advantages
    via_dispatch = compute_advantages(
        "ppo", rewards=[1.0], mask=mask, values=values, kl=kl, kl_coef=0.1, gamma=0.9, lambd=0.8
    )
    torch.testing.assert_close(via_dispatch.advantages, res.advantages)


def test_reinforce_plus_plus_returns_then_batch_whitening() -> None:
    # kl_coef 0.5, gamma 1, rewards [1, 0]; row 1 has padding at t=2 (kl 9.9 ignored)
    # token rewards row0: [-0.05, -0.1, 1.0]; row1: [-0.15, 0.0 + reward 0]
    # returns row0: G2 = 1, G1 = -0.1 + 1 = 0.9, G0 = -0.05 + 0.9 = 0.85; row1: G1 = 0, G0 = -0.15
    # whiten over the 5 tokens [0.85, 0.9, 1.0, -0.15, 0.0]: mean 0.52, pop var 0.2406
    #   -> [0.672769, 0.774704, 0.978573, -1.365925, -1.060121]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.0], [0.3, 0.0, 9.9]])
    res = reinforce_plus_plus([1.0, 0.0], mask, kl=kl, kl_coef=0.5)
    torch.testing.assert_close(res.returns, torch.tensor([[0.85, 0.9, 1.0], [-0.15, 0.0, 0.0]]))
    torch.testing.assert_close(
        res.advantages,
        torch.tensor([[0.672769, 0.774704, 0.978573], [-1.365925, -1.060121, 0.0]]),
        atol=1e-5,
        rtol=1e-5,
    )
    trained = res.advantages[mask.bool()]
    assert abs(trained.mean().item()) < 1e-6
    assert abs(trained.var(unbiased=False).item() - 1.0) < 1e-5


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens() -> None:
    # rewards [1, 0 | 3, 1], groups of 2: centred [0.5, -0.5, 1, -1]
    # kl_coef 0.5 with kl 0.2 at row 0, t 0: 0.5 - 0.1 = 0.4
    # raw tokens: row0 [0.4, 0.5], row1 [-0.5, pad], row2 [1, 1], row3 [-1, -1]
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    kl = torch.tensor([[0.2, 0.0], [0.0, 7.0], [0.0, 0.0], [0.0, 0.0]])
    res = reinforce_plus_plus_baseline([1.0, 0.0, 3.0, 1.0], mask, 2, kl=kl, kl_coef=0.5)
    raw = torch.tensor([[0.4, 0.5], [-0.5, 0.0], [1.0, 1.0], [-1.0, -1.0]])
    torch.testing.assert_close(res.returns, raw)
    w = _pop_whiten([0.4, 0.5, -0.5, 1.0, 1.0, -1.0, -1.0])
    expected = torch.tensor([[w[0], w[1]], [w[2], 0.0], [w[3], w[4]], [w[5], w[6]]])
    torch.testing.assert_close(res.advantages, expected, atol=1e-5, rtol=1e-5)
    via_dispatch = compute_advantages(
        "reinforce_plus_plus_baseline",
        rewards=[1.0, 0.0, 3.0, 1.0],
        mask=mask,
        group_size=2,
        kl=kl,
        kl_coef=0.5,
    )
    torch.testing.assert_close(via_dispatch.advantages, res.advantages)


def test_dispatch_knows_every_estimator_and_rejects_bad_combinations() -> None:
    mask = torch.ones(2, 2)
    values = torch.zeros(2, 2)
    for name in ADVANTAGE_ESTIMATORS:
        res = compute_advantages(name, rewards=[1.0, 0.0], mask=mask, group_size=2, values=values)
        assert res.advantages.shape == (2, 2) and torch.isfinite(res.advantages).all()
    with pytest.raises(ValueError, match="unknown advantage estimator 'gpro'.*grpo"):
        compute_advantages("gpro", rewards=[1.0], mask=torch.ones(1, 1))
    with pytest.raises(ValueError, match="grpo takes no KL penalty in the reward"):
        compute_advantages("grpo", rewards=[1.0, 0.0], mask=mask, group_size=2, kl=values, kl_coef=0.1)
    with pytest.raises(ValueError, match="ppo needs critic values"):
        compute_advantages("ppo", rewards=[1.0, 0.0], mask=mask)
    with pytest.raises(ValueError, match="requires normalize_advantages"):
        compute_advantages("reinforce_plus_plus", rewards=[1.0, 0.0], mask=mask, normalize_advantages=False)
    with pytest.raises(ValueError, match="gamma"):
        compute_advantages("ppo", rewards=[1.0, 0.0], mask=mask, values=values, gamma=1.5)
    with pytest.raises(ValueError, match="rewards must be \\[B\\]"):
        compute_advantages("grpo", rewards=[1.0, 0.0, 1.0], mask=mask, group_size=1)


def test_ppo_without_whitening_returns_raw_gae() -> None:
    mask = torch.tensor([[1, 1, 1]])
    values = torch.tensor([[0.5, 0.4, 0.3]])
    res = compute_advantages(
        "ppo",
        rewards=[1.0],
        mask=mask,
        values=values,
        gamma=0.9,
        lambd=0.8,
        normalize_advantages=False,
    )
    # kl_coef 0: r = [0, 0, 1]; A2 = 0.7; A1 = (0.27 - 0.4) + 0.72*0.7 = 0.374;
    # A0 = (0.36 - 0.5) + 0.72*0.374 = 0.12928
    torch.testing.assert_close(res.advantages, torch.tensor([[0.12928, 0.374, 0.7]]))
