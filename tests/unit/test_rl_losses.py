"""Losses against hand-computed values; gradients checked with autograd."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from slime.rl.losses import (
    critic_values,
    entropy_from_logits,
    kl_loss,
    logprobs_from_logits,
    policy_loss,
    sft_loss,
    total_loss,
    value_loss,
)
from slime.rl.masked import aggregate

LN = math.log


def _ppo_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # old_logp = 0, so ratio r = exp(logp) = [0.5, 1.1, 1.5, 0.7]; A = [1, 1, 1, -1]
    logp = torch.tensor([[LN(0.5), LN(1.1), LN(1.5), LN(0.7)]], requires_grad=True)
    return logp, torch.zeros(1, 4), torch.tensor([[1.0, 1.0, 1.0, -1.0]]), torch.ones(1, 4)


def test_ppo_clipped_surrogate_with_asymmetric_eps() -> None:
    # eps 0.2, eps_high 0.3 -> clip range [0.8, 1.3]; per token max(-rA, -clip(r)A):
    # t0: r .5,  A 1:  max(-0.5, -0.8) = -0.5  (not clipped)
    # t1: r 1.1, A 1:  max(-1.1, -1.1) = -1.1
    # t2: r 1.5, A 1:  max(-1.5, -1.3) = -1.3  (clipped at 1 + eps_high; symmetric would give -1.2)
    # t3: r .7,  A -1: max(0.7, 0.8)   = 0.8   (clipped at 1 - eps)
    # token_mean = (-0.5 - 1.1 - 1.3 + 0.8) / 4 = -0.525; clipfrac 2/4
    # approx_kl = mean(old - logp) = -(ln .5 + ln 1.1 + ln 1.5 + ln .7) / 4 = 0.1372617
    logp, old, adv, mask = _ppo_inputs()
    loss, m = policy_loss(logp, old, adv, mask, estimator="ppo", eps_clip=0.2, eps_clip_high=0.3)
    torch.testing.assert_close(loss, torch.tensor(-0.525))
    torch.testing.assert_close(m["clipfrac"], torch.tensor(0.5))
    torch.testing.assert_close(m["approx_kl"], torch.tensor(0.1372617))
    torch.testing.assert_close(m["ratio_mean"], torch.tensor((0.5 + 1.1 + 1.5 + 0.7) / 4))
    # symmetric eps: t2 -> -1.2, mean = (-0.5 - 1.1 - 1.2 + 0.8) / 4 = -0.5
    sym, _ = policy_loss(logp, old, adv, mask, estimator="grpo", eps_clip=0.2)
    torch.testing.assert_close(sym, torch.tensor(-0.5))
    # gradient: d(-rA)/d logp = -rA for unclipped tokens, 0 for clipped ones; / 4 tokens
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.5 / 4, -1.1 / 4, 0.0, 0.0]]))


def test_dual_clip_caps_negative_advantage_loss() -> None:
    # c = 3, eps 0.2; old_logp = 0 so r = exp(logp)
    # t0: A -1, r 5: max(5, 1.2) = 5 -> min(5, -cA = 3) = 3   (dual clipped)
    # t1: A -1, r 2: max(2, 1.2) = 2 -> min(2, 3) = 2
    # t2: A +1, r 5: max(-5, -1.2) = -1.2 (dual clip only for A < 0)
    # mean = (3 + 2 - 1.2) / 3 = 1.2666667; without dual clip (5 + 2 - 1.2) / 3 = 1.9333333
    logp = torch.tensor([[LN(5.0), LN(2.0), LN(5.0)]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    args = (logp, torch.zeros(1, 3), adv, torch.ones(1, 3))
    loss, m = policy_loss(*args, estimator="ppo", eps_clip=0.2, dual_clip_c=3.0)
    torch.testing.assert_close(loss, torch.tensor(3.8 / 3))
    torch.testing.assert_close(m["dual_clipfrac"], torch.tensor(1 / 3))
    plain, m2 = policy_loss(*args, estimator="ppo", eps_clip=0.2)
    torch.testing.assert_close(plain, torch.tensor(5.8 / 3))
    assert "dual_clipfrac" not in m2
    with pytest.raises(ValueError, match="dual_clip_c must be > 1"):
        policy_loss(*args, estimator="ppo", dual_clip_c=1.0)


def test_gspo_uses_one_ratio_per_sequence() -> None:
    # row 0: log ratios [0.2, -0.4, pad 7.0] -> mean over 2 trained = -0.1 -> r = e^-0.1 = 0.904837
    # row 1: log ratios [0.1, 0.1, 0.4]   -> mean 0.2 -> r = e^0.2 = 1.221403 > 1.2 -> clipped
    # A = 1 everywhere: row0 tokens -0.904837, row1 tokens max(-1.2214, -1.2) = -1.2
    # token_mean over 5 = (2 * -0.904837 + 3 * -1.2) / 5 = -1.081935
    # seq_mean_token_mean = (-0.904837 - 1.2) / 2 = -1.052419
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.2, -0.4, 7.0], [0.1, 0.1, 0.4]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.ones(2, 3)
    loss, m = policy_loss(logp, old, adv, mask, estimator="gspo", eps_clip=0.2)
    torch.testing.assert_close(loss, torch.tensor(-1.081935))
    torch.testing.assert_close(m["clipfrac"], torch.tensor(3 / 5))
    seq, _ = policy_loss(logp, old, adv, mask, estimator="gspo", eps_clip=0.2, agg="seq_mean_token_mean")
    torch.testing.assert_close(seq, torch.tensor(-1.052419))
    # d/d logp_j of (2 * -exp(mean) / 5) for row 0 = -exp(-0.1) / 5 = -0.180967 per token;
    # row 1 is clipped (no gradient); padding gets none either
    loss.backward()
    g = -math.exp(-0.1) / 5
    torch.testing.assert_close(logp.grad, torch.tensor([[g, g, 0.0], [0.0, 0.0, 0.0]]))
    # a per-token ratio would differ: row0 t0 alone has r = e^0.2 (clipped) in ppo
    ppo, _ = policy_loss(logp, old, adv, mask, estimator="ppo", eps_clip=0.2)
    assert abs(ppo.item() - loss.item()) > 1e-3


def test_cispo_weights_are_stopgrad_and_gradient_flows_through_logp_only() -> None:
    # r = [1.5, 0.9, 0.5], eps 0.2, eps_high 0.28 -> weights clip(r, 0.8, 1.28) = [1.28, 0.9, 0.8]
    # logp = -1 + ln r = [-0.594535, -1.105361, -1.693147]; A = [1, -2, 0.5]
    # per token -w A logp: [0.761005, -1.989649, 0.677259]; mean = -0.183795
    old = torch.full((1, 3), -1.0, requires_grad=True)
    logp = torch.tensor([[-1 + LN(1.5), -1 + LN(0.9), -1 + LN(0.5)]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 0.5]], requires_grad=True)
    loss, m = policy_loss(logp, old, adv, torch.ones(1, 3), estimator="cispo", eps_clip=0.2, eps_clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor(-0.183795))
    torch.testing.assert_close(m["clipfrac"], torch.tensor(2 / 3))
    loss.backward()
    # d/d logp_t = -w_t A_t / 3 exactly: no term from differentiating the ratio
    # (with a live ratio, the unclipped t1 would add -A r logp / 3 = -0.663)
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.28 / 3, 1.8 / 3, -0.4 / 3]]))
    assert old.grad is None and adv.grad is None
    with pytest.raises(ValueError, match="dual_clip_c does not apply to cispo"):
        policy_loss(logp, old, adv, torch.ones(1, 3), estimator="cispo", dual_clip_c=3.0)


def test_padding_is_ignored_even_when_it_holds_nan_and_inf() -> None:
    logp, old, adv, mask = _ppo_inputs()
    ref, _ = policy_loss(logp, old, adv, mask, estimator="ppo", eps_clip=0.2, eps_clip_high=0.3)
    pad_logp = torch.cat([logp.detach(), torch.tensor([[float("nan"), 80.0]])], dim=1).requires_grad_()
    pad_old = torch.cat([old, torch.tensor([[float("-inf"), -80.0]])], dim=1)
    pad_adv = torch.cat([adv, torch.tensor([[float("inf"), 3.0]])], dim=1)
    pad_mask = torch.cat([mask, torch.zeros(1, 2)], dim=1)
    for est in ("ppo", "gspo", "cispo"):
        loss, metrics = policy_loss(
            pad_logp, pad_old, pad_adv, pad_mask, estimator=est, eps_clip=0.2, eps_clip_high=0.3
        )
        assert torch.isfinite(loss) and all(torch.isfinite(v) for v in metrics.values())
        pad_logp.grad = None
        loss.backward()
        grad = pad_logp.grad
        assert grad is not None and torch.isfinite(grad).all() and (grad[0, 4:] == 0).all()
        if est == "ppo":
            torch.testing.assert_close(loss, ref)


def test_value_loss_clipped() -> None:
    # clip 0.2:
    # t0: v 1.0, old 0.5, R 2: vc = 0.5 + 0.2 = 0.7; max((1-2)^2=1, (0.7-2)^2=1.69) -> 0.845
    # t1: v 3.0, old 2.5, R 1: vc = 2.7;             max(4, 2.89) = 4 -> 2.0
    # t2: v 0.0, old 0.0, R 1: vc = 0;               max(1, 1) -> 0.5
    # mean = 3.345 / 3 = 1.115; the clipped branch wins at t0 only -> value_clipfrac 1/3
    v = torch.tensor([[1.0, 3.0, 0.0, 5.0]], requires_grad=True)
    old = torch.tensor([[0.5, 2.5, 0.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, m = value_loss(v, old, ret, mask, value_clip=0.2)
    torch.testing.assert_close(loss, torch.tensor(1.115))
    torch.testing.assert_close(m["value_clipfrac"], torch.tensor(1 / 3))
    loss.backward()
    # t0: clipped branch is flat in v -> 0; t1: d 0.5(v-R)^2 = (3-1) / 3; t2: (0-1) / 3
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 2 / 3, -1 / 3, 0.0]]))
    unclipped, _ = value_loss(v, old, ret, mask, value_clip=None)
    torch.testing.assert_close(unclipped, torch.tensor((0.5 + 2.0 + 0.5) / 3))


def test_logprobs_from_logits_divides_policy_logits_by_temperature() -> None:
    # log softmax([1, 2, 3])[2] = 3 - ln(e + e^2 + e^3) = 3 - 3.407606 = -0.407606
    # T = 2: z = [0.5, 1, 1.5]; 1.5 - ln(e^.5 + e + e^1.5) = 1.5 - 2.180270 = -0.680270
    logits = torch.tensor([[[1.0, 2.0, 3.0]]])
    target = torch.tensor([[2]])
    torch.testing.assert_close(logprobs_from_logits(logits, target), torch.tensor([[-0.407606]]))
    torch.testing.assert_close(logprobs_from_logits(logits, target, 2.0), torch.tensor([[-0.680270]]))
    out = logprobs_from_logits(logits.bfloat16(), target)
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match="temperature must be > 0"):
        logprobs_from_logits(logits, target, 0.0)
    with pytest.raises(ValueError, match="plus a vocab dim"):
        logprobs_from_logits(logits, torch.tensor([2]))


def test_entropy_from_logits() -> None:
    # [0, 0] -> ln 2 = 0.693147; [0, ln 3] -> p = [1/4, 3/4],
    # H = 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335
    logits = torch.tensor([[[0.0, 0.0], [0.0, LN(3.0)]]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[LN(2.0), 0.562335]]))
    # temperature 2 on [0, 2 ln 3] gives the same distribution as [0, ln 3]
    torch.testing.assert_close(
        entropy_from_logits(torch.tensor([[[0.0, 2 * LN(3.0)]]]), temperature=2.0),
        torch.tensor([[0.562335]]),
    )


def test_critic_values_are_never_temperature_scaled() -> None:
    """The W22 rule at this layer: the critic helper has no temperature to apply."""
    assert "temperature" not in inspect.signature(critic_values).parameters
    assert "temperature" not in inspect.signature(value_loss).parameters
    head = torch.tensor([[[0.5], [-2.0]]], dtype=torch.bfloat16)
    out = critic_values(head)
    assert out.dtype == torch.float32 and out.shape == (1, 2)
    torch.testing.assert_close(out, torch.tensor([[0.5, -2.0]]))


def test_kl_and_sft_losses() -> None:
    # log r = [0.5, -1]: k1 mean = -0.25; low_var (k3) mean = (0.106531 + 0.718282) / 2 = 0.412406
    logp = torch.tensor([[-1.0, -2.0, 5.0]])
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    torch.testing.assert_close(kl_loss(logp, ref, mask, kind="k1"), torch.tensor(-0.25))
    torch.testing.assert_close(kl_loss(logp, ref, mask), torch.tensor(0.412406))
    # NLL: row0 [-1, -2], row1 [-3]: token_mean = 6/3 = 2;
    # seq_mean_token_mean = (1.5 + 3) / 2 = 2.25
    lp = torch.tensor([[-1.0, -2.0, 9.0], [-3.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    torch.testing.assert_close(sft_loss(lp, m), torch.tensor(2.0))
    torch.testing.assert_close(sft_loss(lp, m, agg="seq_mean_token_mean"), torch.tensor(2.25))


def test_aggregate_modes() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    # token_mean: (1 + 2 + 3 + 4) / 4 = 2.5; with a global count of 8: 10 / 8 = 1.25
    torch.testing.assert_close(aggregate(x, mask, "token_mean"), torch.tensor(2.5))
    torch.testing.assert_close(aggregate(x, mask, "token_mean", num_tokens=8), torch.tensor(1.25))
    # seq_mean_token_mean: rows with tokens only: (2 + 4) / 2 = 3
    torch.testing.assert_close(aggregate(x, mask, "seq_mean_token_mean"), torch.tensor(3.0))
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        aggregate(x, mask, "sum")
    with pytest.raises(ValueError, match="same \\[B, T\\] shape"):
        aggregate(x, mask[:, :2])


def test_total_loss_combines_terms_and_requires_inputs() -> None:
    # pg = -0.525 (see the PPO test); entropy mean = (1 + 2 + 0.5 + 0.5) / 4 = 1.0, coef 0.01
    # ref_logp = logp - 0.2 -> k2 = 0.2^2 / 2 = 0.02 per token, coef 1.0
    # total = -0.525 - 0.01 * 1.0 + 1.0 * 0.02 = -0.515
    logp, old, adv, mask = _ppo_inputs()
    entropy = torch.tensor([[1.0, 2.0, 0.5, 0.5]])
    ref = logp.detach() - 0.2
    loss, m = total_loss(
        logp,
        old,
        adv,
        mask,
        estimator="ppo",
        eps_clip=0.2,
        eps_clip_high=0.3,
        entropy=entropy,
        entropy_coef=0.01,
        ref_logp=ref,
        kl_loss_coef=1.0,
        kl_loss_type="k2",
    )
    torch.testing.assert_close(loss, torch.tensor(-0.515))
    torch.testing.assert_close(m["pg_loss"], torch.tensor(-0.525))
    torch.testing.assert_close(m["entropy"], torch.tensor(1.0))
    torch.testing.assert_close(m["kl_loss"], torch.tensor(0.02))
    with pytest.raises(ValueError, match="reference model"):
        total_loss(logp, old, adv, mask, kl_loss_coef=0.1)
    with pytest.raises(ValueError, match="entropy_coef=0.01 needs per-token entropy"):
        total_loss(logp, old, adv, mask, entropy_coef=0.01)
    with pytest.raises(ValueError, match="unknown policy loss 'dpo'"):
        policy_loss(logp, old, adv, mask, estimator="dpo")
