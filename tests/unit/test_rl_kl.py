"""KL estimators against hand-computed values (log r = logp - logp_ref)."""

from __future__ import annotations

import math

import pytest
import torch

from slime.rl.kl import KL_ESTIMATORS, compute_kl, k1, k2, k3, low_var_kl

# log r = [-1 - (-1.5), -2 - (-1), -0.5 - (-0.5)] = [0.5, -1.0, 0.0]
LOGP = torch.tensor([-1.0, -2.0, -0.5])
LOGP_REF = torch.tensor([-1.5, -1.0, -0.5])


def test_k1_is_the_log_ratio() -> None:
    torch.testing.assert_close(k1(LOGP, LOGP_REF), torch.tensor([0.5, -1.0, 0.0]))


def test_k2_is_half_the_squared_log_ratio() -> None:
    # 0.5^2/2 = 0.125, (-1)^2/2 = 0.5, 0
    torch.testing.assert_close(k2(LOGP, LOGP_REF), torch.tensor([0.125, 0.5, 0.0]))


def test_k3_matches_exp_form() -> None:
    # e^{-0.5} - 1 + 0.5 = 0.60653066 - 0.5 = 0.10653066
    # e^{1}    - 1 - 1   = 2.71828183 - 2   = 0.71828183
    # e^{0}    - 1 + 0   = 0
    expected = torch.tensor([math.exp(-0.5) - 0.5, math.e - 2.0, 0.0])
    torch.testing.assert_close(k3(LOGP, LOGP_REF), expected)
    torch.testing.assert_close(expected, torch.tensor([0.10653066, 0.71828183, 0.0]))


def test_low_var_kl_clamps_to_ten_with_finite_gradients() -> None:
    # log r = -15: k3 = e^{15} - 1 - 15 ≈ 3.27e6 -> 10
    # log r = 25:  k3 = e^{-25} - 1 + 25 ≈ 24     -> 10
    # log r = -100: e^{100} overflows float32; still 10, and no NaN gradient
    # log r = 0.5: unclamped 0.10653066
    logp = torch.tensor([-15.0, 25.0, -100.0, 0.5], requires_grad=True)
    ref = torch.zeros(4)
    out = low_var_kl(logp, ref)
    torch.testing.assert_close(out, torch.tensor([10.0, 10.0, 10.0, 0.10653066]))
    out.sum().backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    # clamped entries get no gradient; d k3 / d log r = 1 - e^{-log r} = 1 - e^{-0.5} = 0.39346934
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, 0.0, 0.0, 1 - math.exp(-0.5)]))
    # the unclamped k3 really is large there: the clamp is doing the work
    assert k3(torch.tensor([-15.0]), torch.zeros(1)).item() > 1e6


def test_compute_kl_dispatch_and_errors() -> None:
    for name, fn in zip(KL_ESTIMATORS, (k1, k2, k3, low_var_kl), strict=True):
        torch.testing.assert_close(compute_kl(LOGP, LOGP_REF, name), fn(LOGP, LOGP_REF))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'.*low_var_kl"):
        compute_kl(LOGP, LOGP_REF, "k4")
    with pytest.raises(ValueError, match="same shape"):
        k1(LOGP, LOGP_REF[:2])


def test_bf16_inputs_are_computed_in_float32() -> None:
    out = k3(LOGP.bfloat16(), LOGP_REF.bfloat16())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, k3(LOGP, LOGP_REF))  # these inputs are exact in bf16
