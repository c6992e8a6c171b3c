"""Advantage estimators on padded ``[B, T]`` response tensors.

Inputs: per-sequence ``rewards`` ``[B]``, ``mask`` ``[B, T]`` (1 = trained token), optional per-token
``kl`` and critic ``values``; group estimators expect each prompt's ``n`` samples in contiguous rows.
``compute_advantages`` dispatches by name: ``grpo``/``gspo``/``cispo`` (group-normalised reward),
``reinforce_plus_plus[_baseline]`` and ``ppo`` (GAE). Outputs are 0 wherever ``mask`` is 0.
Whitening uses batch-local statistics; for global ones use ``slime.rl.masked.masked_moments`` and
``whiten(mean=, var=)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from slime.rl.masked import check_same_shape, whiten, zero_masked

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "Advantages",
    "compute_advantages",
    "discounted_returns",
    "gae",
    "group_normalized_rewards",
    "grpo_advantages",
    "last_token_mask",
    "ppo_advantages",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "token_level_rewards",
]

ADVANTAGE_ESTIMATORS: tuple[str, ...] = (
    "grpo",
    "gspo",
    "cispo",
    "ppo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
)
_GROUP_ESTIMATORS = ("grpo", "gspo", "cispo")

GROUP_STD_EPS = 1e-6


class Advantages(NamedTuple):
    advantages: torch.Tensor  # [B, T], 0 where mask is 0
    returns: torch.Tensor  # [B, T], value targets (PPO) or unwhitened advantages


def _as_rewards(rewards: torch.Tensor | Sequence[float], mask: torch.Tensor) -> torch.Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float32, device=mask.device)
    if r.dim() != 1 or mask.dim() != 2 or r.shape[0] != mask.shape[0]:
        raise ValueError(
            f"rewards must be [B] and mask [B, T] with the same B, got rewards "
            f"{tuple(r.shape)} and mask {tuple(mask.shape)}"
        )
    return r


def _check_group_size(n_rows: int, group_size: int) -> None:
    if group_size < 1 or n_rows % group_size != 0:
        raise ValueError(
            f"group_size (n_samples_per_prompt) = {group_size} must be >= 1 and divide the "
            f"number of samples {n_rows}; samples of one prompt must be contiguous"
        )


def group_normalized_rewards(
    rewards: torch.Tensor | Sequence[float],
    group_size: int,
    *,
    normalize_std: bool = True,
    eps: float = GROUP_STD_EPS,
) -> torch.Tensor:
    """``[N] -> [N]``: subtract each group's mean; divide by its std (+eps) if enabled and n > 1."""
    r = torch.as_tensor(rewards, dtype=torch.float32)
    if r.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(r.shape)}")
    _check_group_size(r.shape[0], group_size)
    grouped = r.view(-1, group_size)
    centred = grouped - grouped.mean(dim=-1, keepdim=True)
    if normalize_std and group_size > 1:
        centred = centred / (grouped.std(dim=-1, keepdim=True) + eps)
    return centred.reshape(-1)


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float, 1 at each row's last position where mask is set (all 0 if none)."""
    m = mask.bool()
    t = torch.arange(m.shape[-1], device=m.device).expand_as(m)
    last = torch.where(m, t, torch.full_like(t, -1)).max(dim=-1, keepdim=True).values
    return ((t == last) & m).float()


def _within_episode(mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` float, 1 at positions up to and including the last trained token."""
    return (mask.bool().flip(-1).cumsum(-1).flip(-1) > 0).float()


def token_level_rewards(
    rewards: torch.Tensor | Sequence[float],
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """``-kl_coef * kl_t`` on trained tokens, plus the sequence reward on the last trained token."""
    r = _as_rewards(rewards, mask)
    out = r[:, None] * last_token_mask(mask)
    if kl is not None and kl_coef != 0.0:
        out = out - kl_coef * zero_masked(kl.float(), mask)
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G_t = r_t + gamma * G_{t+1}`` right to left; 0 where mask is 0."""
    rewards = zero_masked(token_rewards.float(), _within_episode(mask))
    returns = torch.zeros_like(rewards)
    running = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[-1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return zero_masked(returns, mask)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lambd: float = 1.0,
) -> Advantages:
    """Generalised advantage estimation; returns unwhitened advantages and ``adv + values``.

    ``delta_t = r_t + gamma * V_{t+1} - V_t``; ``A_t = delta_t + gamma * lambd * A_{t+1}``,
    with ``V`` and ``A`` taken as 0 after the last trained token.
    """
    check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    v = zero_masked(values.float(), _within_episode(mask))  # no bootstrap past the episode end
    rewards = zero_masked(token_rewards.float(), _within_episode(mask))
    T = rewards.shape[-1]
    adv = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(T)):
        delta = rewards[:, t] + gamma * next_value - v[:, t]
        next_adv = delta + gamma * lambd * next_adv
        adv[:, t] = next_adv
        next_value = v[:, t]
    return Advantages(zero_masked(adv, mask), zero_masked(adv + v, mask))


def grpo_advantages(
    rewards: torch.Tensor | Sequence[float],
    mask: torch.Tensor,
    group_size: int,
    *,
    normalize_std: bool = True,
) -> Advantages:
    r = _as_rewards(rewards, mask)
    seq_adv = group_normalized_rewards(r, group_size, normalize_std=normalize_std)
    adv = zero_masked(seq_adv[:, None].expand(mask.shape), mask)
    return Advantages(adv, adv.clone())


def reinforce_plus_plus(
    rewards: torch.Tensor | Sequence[float],
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
) -> Advantages:
    returns = discounted_returns(token_level_rewards(rewards, mask, kl=kl, kl_coef=kl_coef), mask, gamma)
    return Advantages(whiten(returns, mask), returns)


def reinforce_plus_plus_baseline(
    rewards: torch.Tensor | Sequence[float],
    mask: torch.Tensor,
    group_size: int,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> Advantages:
    r = _as_rewards(rewards, mask)
    centred = group_normalized_rewards(r, group_size, normalize_std=False)
    raw = zero_masked(centred[:, None].expand(mask.shape), mask)
    if kl is not None and kl_coef != 0.0:
        raw = raw - kl_coef * zero_masked(kl.float(), mask)
    return Advantages(whiten(raw, mask), raw)


def ppo_advantages(
    rewards: torch.Tensor | Sequence[float],
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    lambd: float = 1.0,
    whiten_advantages: bool = True,
) -> Advantages:
    token_rewards = token_level_rewards(rewards, mask, kl=kl, kl_coef=kl_coef)
    adv, returns = gae(token_rewards, values, mask, gamma=gamma, lambd=lambd)
    return Advantages(whiten(adv, mask) if whiten_advantages else adv, returns)


def compute_advantages(
    estimator: str,
    *,
    rewards: torch.Tensor | Sequence[float],
    mask: torch.Tensor,
    group_size: int = 1,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lambd: float = 1.0,
    normalize_std: bool = True,
    normalize_advantages: bool | None = None,
) -> Advantages:
    """Advantages and returns for ``estimator``; see the module docstring for each formula.

    ``normalize_advantages`` (batch whitening) defaults to the estimator's own
    choice: on for ppo and the REINFORCE++ pair (which require it), off for the
    group estimators (their advantages are already normalised per group).
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lambd <= 1.0):
        raise ValueError(f"gamma ({gamma}) and lambd ({lambd}) must lie in [0, 1]")
    if estimator in _GROUP_ESTIMATORS:
        if kl_coef != 0.0:
            raise ValueError(
                f"{estimator} takes no KL penalty in the reward (kl_coef={kl_coef}); "
                "set the KL loss coefficient instead, or use ppo/reinforce_plus_plus"
            )
        result = grpo_advantages(rewards, mask, group_size, normalize_std=normalize_std)
        if normalize_advantages:
            result = Advantages(whiten(result.advantages, mask), result.returns)
        return result
    if normalize_advantages is False and estimator.startswith("reinforce_plus_plus"):
        raise ValueError(f"{estimator} requires normalize_advantages (batch whitening); remove the override")
    if estimator == "reinforce_plus_plus":
        return reinforce_plus_plus(rewards, mask, kl=kl, kl_coef=kl_coef, gamma=gamma)
    if estimator == "reinforce_plus_plus_baseline":
        return reinforce_plus_plus_baseline(rewards, mask, group_size, kl=kl, kl_coef=kl_coef)
    if values is None:
        raise ValueError("ppo needs critic values [B, T] (values=...); is a critic configured?")
    return ppo_advantages(
        rewards,
        values,
        mask,
        kl=kl,
        kl_coef=kl_coef,
        gamma=gamma,
        lambd=lambd,
        whiten_advantages=normalize_advantages is not False,
    )
