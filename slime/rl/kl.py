"""Per-token KL estimators between the policy and a reference policy.

Each takes the sampled tokens' log-probs ``logp`` and ``logp_ref`` (same shape) and returns that
shape; with ``log r = logp - logp_ref``: ``k1 = log r``, ``k2 = (log r)^2 / 2``,
``k3 = e^{-log r} - 1 + log r`` and ``low_var_kl = clamp(k3, -10, 10)``. Masking and aggregation
are the caller's (``slime.rl.losses``). Computed in float32 even for bf16 inputs, because ``exp``
of a bf16 log-ratio loses the precision the estimate depends on.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["KL_ESTIMATORS", "KLEstimator", "compute_kl", "k1", "k2", "k3", "low_var_kl"]

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")

_LOW_VAR_CLAMP = 10.0
# |log r| beyond 20 already puts k3 outside [-10, 10]; pre-clamping log r keeps
# exp() finite so the clamped branch never yields inf * 0 = NaN gradients.
_LOG_RATIO_GUARD = 20.0


def _log_ratio(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    if logp.shape != logp_ref.shape:
        raise ValueError(
            f"KL needs logp and logp_ref of the same shape, got {tuple(logp.shape)} and {tuple(logp_ref.shape)}"
        )
    return logp.float() - logp_ref.float()


def k1(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return _log_ratio(logp, logp_ref)


def k2(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    return _log_ratio(logp, logp_ref).square() / 2


def k3(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    log_r = _log_ratio(logp, logp_ref)
    return torch.exp(-log_r) - 1 + log_r


def low_var_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    log_r = _log_ratio(logp, logp_ref).clamp(-_LOG_RATIO_GUARD, _LOG_RATIO_GUARD)
    return (torch.exp(-log_r) - 1 + log_r).clamp(-_LOW_VAR_CLAMP, _LOW_VAR_CLAMP)


_BY_NAME = {"k1": k1, "k2": k2, "k3": k3, "low_var_kl": low_var_kl}


def compute_kl(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Dispatch by estimator name (``k1``, ``k2``, ``k3``, ``low_var_kl``)."""
    try:
        fn = _BY_NAME[kind]
    except KeyError:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL_ESTIMATORS)}") from None
    return fn(logp, logp_ref)
