"""Policy, value, entropy, KL and SFT losses on padded ``[B, T]`` tensors.

Every loss takes per-token tensors and a response ``mask`` and reduces them with
``slime.rl.masked.aggregate`` (``num_tokens`` allows a global token mean across micro-batches and
ranks); computation is in float32. Policy losses: the clipped surrogate (``ppo``/``grpo``/
``reinforce_plus_plus*``, optional dual clip), its sequence-ratio form ``gspo``, and ``cispo``;
optional truncated importance-sampling weights (``tis_weights=``). Only policy logits are divided
by the sampling temperature (:func:`scale_logits`); :func:`critic_values` deliberately has no
temperature parameter (slime's W22 fix).
"""

from __future__ import annotations

import torch

from slime.rl.kl import compute_kl
from slime.rl.masked import aggregate, check_same_shape, masked_mean, zero_masked

__all__ = [
    "POLICY_LOSSES",
    "critic_values",
    "entropy_from_logits",
    "importance_ratio",
    "kl_loss",
    "logprobs_from_logits",
    "policy_loss",
    "scale_logits",
    "sft_loss",
    "total_loss",
    "truncated_importance_weights",
    "value_loss",
]

POLICY_LOSSES: tuple[str, ...] = (
    "ppo",
    "grpo",
    "gspo",
    "cispo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
)

Metrics = dict[str, torch.Tensor]


def scale_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Policy logits / temperature in float32. Never apply this to critic values."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); it divides the policy logits")
    out = logits.float()
    return out if temperature == 1.0 else out / temperature


def logprobs_from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log softmax(logits / T)`` gathered at ``targets``: ``[..., V], [...] -> [...]`` float32.

    Alignment is the caller's job: logits at position t score the token at t + 1.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocab dim")
    z = scale_logits(logits, temperature)
    picked = torch.gather(z, -1, targets.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of the (temperature-scaled) policy per position: ``[..., V] -> [...]`` float32."""
    z = scale_logits(logits, temperature)
    return torch.logsumexp(z, dim=-1) - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def critic_values(head_output: torch.Tensor) -> torch.Tensor:
    """``[B, T, 1]`` or ``[B, T]`` value-head output -> ``[B, T]`` float32.

    There is no temperature argument on purpose: the sampling temperature shapes
    the policy's distribution, not the critic's value estimates.
    """
    v = head_output.float()
    return v.squeeze(-1) if v.dim() == 3 and v.shape[-1] == 1 else v


def importance_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``exp(old_logp - rollout_logp)`` (trainer over engine probability), 1 where ``mask`` is 0."""
    check_same_shape(old_logp=old_logp, rollout_logp=rollout_logp, mask=mask)
    m = mask.bool().float()
    return zero_masked(old_logp.float().detach() - rollout_logp.float().detach(), m).exp()


def truncated_importance_weights(ratio: torch.Tensor, *, clip: float, clip_low: float = 0.0) -> torch.Tensor:
    """Truncated importance weights ``clamp(ratio, clip_low, clip)`` (constants: no gradient)."""
    if not 0 <= clip_low < clip:
        raise ValueError(f"TIS needs 0 <= clip_low < clip, got clip_low={clip_low}, clip={clip}")
    return ratio.detach().clamp(clip_low, clip)


def _check_eps(eps_clip: float, eps_clip_high: float | None, dual_clip_c: float | None) -> float:
    if eps_clip < 0:
        raise ValueError(f"eps_clip must be >= 0, got {eps_clip}")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    if high < 0:
        raise ValueError(f"eps_clip_high must be >= 0, got {high}")
    if dual_clip_c is not None and not dual_clip_c > 1:
        raise ValueError(f"dual_clip_c must be > 1 (it caps the loss at -c*A for A < 0), got {dual_clip_c}")
    return high


def _per_token_pg(logp, old_logp, adv, m, estimator, eps_clip, high, dual_clip_c, metrics):
    """Per-token policy-gradient loss of ``estimator``, its ratio and clipped indicator (see the module doc);
    adds ``dual_clipfrac`` to ``metrics`` with dual clip."""
    log_ratio = logp - old_logp
    if estimator == "cispo":
        if dual_clip_c is not None:
            raise ValueError("dual_clip_c does not apply to cispo (its ratio is already a clipped constant)")
        ratio = log_ratio.detach().exp()
        weight = ratio.clamp(1 - eps_clip, 1 + high)
        return -weight * adv * logp, ratio, (weight != ratio).float()
    if estimator == "gspo":
        seq_log_ratio = log_ratio.sum(-1) / m.sum(-1).clamp_min(1)
        log_ratio = seq_log_ratio[:, None].expand_as(logp)
    ratio = log_ratio.exp()
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1 - eps_clip, 1 + high)
    per_token = torch.maximum(pg_unclipped, pg_clipped)
    clipped = (pg_clipped > pg_unclipped).float()
    if dual_clip_c is not None:
        cap = -dual_clip_c * adv
        negative = adv < 0
        metrics["dual_clipfrac"] = masked_mean((negative & (per_token > cap)).float(), m).detach()
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)
    return per_token, ratio, clipped


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str = "grpo",
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    dual_clip_c: float | None = None,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    tis_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped policy-gradient loss and detached metrics.

    Metrics: pg_loss, clipfrac, approx_kl, ratio_mean, and dual_clipfrac with dual clip.
    ``tis_weights`` (see :func:`truncated_importance_weights`) multiply each token's loss before aggregation.

    ``clipfrac`` is the fraction of trained tokens whose ratio was clipped (for
    ppo-style losses: where clipping changed the loss); ``approx_kl`` is the mean
    of ``old_logp - logp`` over trained tokens.
    """
    if estimator not in POLICY_LOSSES:
        raise ValueError(f"unknown policy loss {estimator!r}; valid: {', '.join(POLICY_LOSSES)}")
    check_same_shape(logp=logp, old_logp=old_logp, advantages=advantages, mask=mask)
    high = _check_eps(eps_clip, eps_clip_high, dual_clip_c)
    m = mask.bool().float()
    # Zero padding first: garbage there must not reach exp() or the gradients.
    logp = zero_masked(logp.float(), m)
    old_logp = zero_masked(old_logp.float().detach(), m)
    adv = zero_masked(advantages.float().detach(), m)
    metrics: Metrics = {}
    per_token, ratio, clipped = _per_token_pg(logp, old_logp, adv, m, estimator, eps_clip, high, dual_clip_c, metrics)
    if tis_weights is not None:
        check_same_shape(tis_weights=tis_weights, mask=mask)
        per_token = per_token * zero_masked(tis_weights.float().detach(), m)

    loss = aggregate(per_token, m, agg, num_tokens=num_tokens)
    metrics.update(
        pg_loss=loss.detach(),
        clipfrac=masked_mean(clipped, m).detach(),
        approx_kl=masked_mean(-(logp - old_logp), m).detach(),
        ratio_mean=masked_mean(ratio.detach(), m),
    )
    return loss, metrics


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_clip: float | None = 0.2,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """``0.5 * max((v - R)^2, (v_clipped - R)^2)``; ``v_clipped = old + clip(v - old, ±clip)``.

    ``value_clip=None`` gives the plain ``0.5 * (v - R)^2``.
    """
    check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    m = mask.bool().float()
    v = zero_masked(values.float(), m)
    ret = zero_masked(returns.float().detach(), m)
    unclipped = (v - ret).square()
    if value_clip is None:
        per_token = 0.5 * unclipped
        clipfrac = torch.zeros((), device=v.device)
    else:
        if value_clip < 0:
            raise ValueError(f"value_clip must be >= 0 or None, got {value_clip}")
        old = zero_masked(old_values.float().detach(), m)
        v_clipped = old + (v - old).clamp(-value_clip, value_clip)
        clipped_sq = (v_clipped - ret).square()
        per_token = 0.5 * torch.maximum(unclipped, clipped_sq)
        clipfrac = masked_mean((clipped_sq > unclipped).float(), m)
    loss = aggregate(per_token, m, agg, num_tokens=num_tokens)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": clipfrac.detach()}


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    kind: str = "low_var_kl",
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(policy || reference) estimated per token with ``kind`` and aggregated."""
    check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    kl = compute_kl(zero_masked(logp, mask), zero_masked(ref_logp.detach(), mask), kind)
    return aggregate(kl, mask, agg, num_tokens=num_tokens)


def sft_loss(
    logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Masked negative log-likelihood of the target tokens."""
    return aggregate(-zero_masked(logp.float(), mask), mask, agg, num_tokens=num_tokens)


def total_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str = "grpo",
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    dual_clip_c: float | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_loss_coef: float = 0.0,
    kl_loss_type: str = "low_var_kl",
    agg: str = "token_mean",
    num_tokens: float | torch.Tensor | None = None,
    tis_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """``pg - entropy_coef * H + kl_loss_coef * KL``; the entropy and KL terms need their inputs.

    ``tis_weights`` reweight the policy-gradient term only (as slime does)."""
    loss, metrics = policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        estimator=estimator,
        eps_clip=eps_clip,
        eps_clip_high=eps_clip_high,
        dual_clip_c=dual_clip_c,
        agg=agg,
        num_tokens=num_tokens,
        tis_weights=tis_weights,
    )
    if entropy_coef != 0.0 or entropy is not None:
        if entropy is None:
            raise ValueError(f"entropy_coef={entropy_coef} needs per-token entropy (entropy=...)")
        check_same_shape(entropy=entropy, mask=mask)
        ent = aggregate(zero_masked(entropy.float(), mask), mask, agg, num_tokens=num_tokens)
        loss = loss - entropy_coef * ent
        metrics["entropy"] = ent.detach()
    if kl_loss_coef != 0.0 or ref_logp is not None:
        if ref_logp is None:
            raise ValueError(
                f"kl_loss_coef={kl_loss_coef} needs reference log-probs (ref_logp=...); "
                "is a reference model configured?"
            )
        kl = kl_loss(logp, ref_logp, mask, kind=kl_loss_type, agg=agg, num_tokens=num_tokens)
        loss = loss + kl_loss_coef * kl
        metrics["kl_loss"] = kl.detach()
    metrics["loss"] = loss.detach()
    return loss, metrics
