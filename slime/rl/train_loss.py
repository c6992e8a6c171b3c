"""The spec's training losses: the one place that maps ``algorithm.*`` onto ``slime.rl.losses``.

Both train backends (``torch`` and ``megatron``) call these with their per-micro-batch tensors, so a
setting of ``algorithm`` reaches the loss the same way whichever backend trains.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from slime.rl.losses import Metrics, total_loss, value_loss

if TYPE_CHECKING:
    from slime.spec.types import Algorithm

__all__ = ["policy_loss_of", "value_clip_of", "value_loss_of", "wants_entropy"]


def wants_entropy(algorithm: Algorithm) -> bool:
    """Whether :func:`policy_loss_of` needs per-token entropy (only then is it worth computing)."""
    return algorithm.entropy_coef > 0


def policy_loss_of(
    algorithm: Algorithm,
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropy: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    tis_weights: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """``slime.rl.losses.total_loss`` with every setting taken from ``algorithm``.

    ``old_logp`` None means strictly on-policy (the ratio is 1 at this step). ``ref_logp`` is used only
    when ``algorithm.kl_loss_coef > 0``; ``entropy`` is needed when :func:`wants_entropy`.
    """
    a = algorithm
    return total_loss(
        logp,
        logp.detach() if old_logp is None else old_logp,
        advantages,
        mask,
        estimator=a.estimator,
        eps_clip=a.eps_clip,
        eps_clip_high=a.eps_clip_high,
        dual_clip_c=a.dual_clip_c,
        entropy=entropy,
        entropy_coef=a.entropy_coef,
        ref_logp=ref_logp if a.kl_loss_coef > 0 else None,
        kl_loss_coef=a.kl_loss_coef,
        kl_loss_type=a.kl_loss_type,
        agg=a.loss_agg,
        num_tokens=num_tokens,
        tis_weights=tis_weights,
    )


def value_clip_of(algorithm: Algorithm) -> float:
    """The critic's value-loss clip: ``algorithm.critic.value_clip``, the spec's value and only default.

    The resolved spec of a PPO run always has ``algorithm.critic``. A critic built from a spec without
    that section (tests, tools) gets the spec type's own default (``slime.spec.types.Critic``, 0.2 today),
    never a second constant of its own.
    """
    if algorithm.critic is not None:
        return algorithm.critic.value_clip
    from slime.spec.types import Critic

    return Critic().value_clip


def value_loss_of(
    algorithm: Algorithm,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    num_tokens: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """``slime.rl.losses.value_loss`` clipped at :func:`value_clip_of`, aggregated by ``algorithm.loss_agg``."""
    return value_loss(
        values,
        old_values,
        returns,
        mask,
        value_clip=value_clip_of(algorithm),
        agg=algorithm.loss_agg,
        num_tokens=num_tokens,
    )
