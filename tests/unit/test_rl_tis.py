"""Truncated importance sampling (``algorithm.tis``) and ``use_rollout_logprobs`` against hand-computed values.

Conventions of ``slime.rl.losses``: ``w = clamp(exp(old - rollout), clip_low, clip)``, a constant, multiplies
each token's clipped policy loss (dual clip included) before aggregation; entropy and KL terms are not
reweighted.
"""

from __future__ import annotations

import math

import pytest
import torch

from slime.rl.losses import importance_ratio, policy_loss, total_loss, truncated_importance_weights

LN = math.log


def test_importance_ratio_is_trainer_over_engine_and_one_at_padding() -> None:
    old = torch.tensor([[LN(0.5), LN(0.2), LN(0.9), 7.0]])
    rollout = torch.tensor([[LN(0.25), LN(0.4), LN(0.9), -3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    ratio = importance_ratio(old, rollout, mask)
    # 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.9 = 1; padding: exp(0) = 1 whatever the garbage there
    torch.testing.assert_close(ratio, torch.tensor([[2.0, 0.5, 1.0, 1.0]]))


def test_truncated_weights_clamp_both_sides_and_carry_no_gradient() -> None:
    ratio = torch.tensor([0.05, 0.5, 1.0, 2.5, 10.0], requires_grad=True)
    w = truncated_importance_weights(ratio, clip=2.0, clip_low=0.1)
    torch.testing.assert_close(w, torch.tensor([0.1, 0.5, 1.0, 2.0, 2.0]))
    assert not w.requires_grad
    with pytest.raises(ValueError, match="clip_low < clip"):
        truncated_importance_weights(ratio, clip=1.0, clip_low=1.0)


def test_tis_reweights_each_tokens_clipped_loss_by_hand() -> None:
    # PPO ratio r = exp(logp - old) with old = 0: r = [0.5, 1.1, 1.5, 0.7], A = [1, 1, 1, -1], eps 0.2:
    #   per token max(-rA, -clip(r, .8, 1.2) A) = [-0.5, -1.1, -1.2, 0.8]
    # engine log-probs give IS ratios exp(old - rollout) = [4, 1, 0.5, 0.05]; TIS clip 2, clip_low 0.1
    #   w = [2, 1, 0.5, 0.1]
    # token mean of w * loss = (-1.0 - 1.1 - 0.6 + 0.08) / 4 = -0.655
    logp = torch.tensor([[LN(0.5), LN(1.1), LN(1.5), LN(0.7)]], requires_grad=True)
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4)
    rollout = -torch.log(torch.tensor([[4.0, 1.0, 0.5, 0.05]]))
    w = truncated_importance_weights(importance_ratio(old, rollout, mask), clip=2.0, clip_low=0.1)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.5, 0.1]]))
    loss, m = policy_loss(logp, old, adv, mask, estimator="grpo", eps_clip=0.2, tis_weights=w)
    torch.testing.assert_close(loss, torch.tensor(-0.655))
    torch.testing.assert_close(m["pg_loss"], torch.tensor(-0.655))
    torch.testing.assert_close(m["clipfrac"], torch.tensor(0.5))  # clipping itself is unchanged by TIS
    # gradient: unclipped tokens t0, t1 give -w r A / 4 = [-2*0.5/4, -1*1.1/4]; clipped ones 0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.25, -0.275, 0.0, 0.0]]))


def test_tis_applies_after_dual_clip_and_with_seq_mean_aggregation() -> None:
    # dual clip c = 3, A = -1, r = 5: max(5, 1.2) = 5 -> min(5, 3) = 3; w = 0.5 -> 1.5
    # second sample: A = +1, r = 1, loss -1, w = 2 -> -2; masks differ in length:
    # seq_mean_token_mean = mean(1.5 / 1, (-2 + -2) / 2) = mean(1.5, -2) = -0.25
    logp = torch.tensor([[LN(5.0), 0.0], [0.0, 0.0]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([[-1.0, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    w = torch.tensor([[0.5, 9.0], [2.0, 2.0]])  # 9.0 at padding: never counted
    loss, _ = policy_loss(
        logp, old, adv, mask, estimator="ppo", eps_clip=0.2, dual_clip_c=3.0, agg="seq_mean_token_mean", tis_weights=w
    )
    torch.testing.assert_close(loss, torch.tensor(-0.25))


def test_tis_weights_only_the_policy_term_of_the_total_loss() -> None:
    # r = 1 everywhere (logp = old), A = 1: pg per token -1; w = [2, 0.5] -> pg = (-2 - 0.5) / 2 = -1.25
    # KL k1 to a reference with logp - ref = [0.1, 0.3]: mean 0.2, coefficient 0.5 -> +0.1 (not reweighted)
    logp = torch.tensor([[LN(0.4), LN(0.6)]])
    ref = logp - torch.tensor([[0.1, 0.3]])
    w = torch.tensor([[2.0, 0.5]])
    loss, m = total_loss(
        logp,
        logp.clone(),
        torch.ones(1, 2),
        torch.ones(1, 2),
        ref_logp=ref,
        kl_loss_coef=0.5,
        kl_loss_type="k1",
        tis_weights=w,
    )
    torch.testing.assert_close(m["pg_loss"], torch.tensor(-1.25))
    torch.testing.assert_close(m["kl_loss"], torch.tensor(0.2))
    torch.testing.assert_close(loss, torch.tensor(-1.25 + 0.1))


def test_cispo_weight_times_tis_weight() -> None:
    # cispo: -clip(r, .8, 1.2) * A * logp, r = 1 (logp = old): -1 * 1 * logp; w = 2 -> -2 * logp
    logp = torch.tensor([[LN(0.5)]], requires_grad=True)
    loss, _ = policy_loss(
        logp,
        logp.detach().clone(),
        torch.ones(1, 1),
        torch.ones(1, 1),
        estimator="cispo",
        tis_weights=torch.tensor([[2.0]]),
    )
    torch.testing.assert_close(loss, torch.tensor(-2 * LN(0.5)))
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0]]))
