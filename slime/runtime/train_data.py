"""From generated samples to ``TrainBatch`` tensors and advantages.

Split of the work (so that group statistics and whitening see the whole
rollout, whatever the data-parallel size):

1. the driver turns each sample's reward into a *sequence score*
   (:func:`sequence_scores`): group-normalised for GRPO/GSPO/CISPO, group-centred
   for REINFORCE++-baseline, raw for REINFORCE++ and PPO (they need per-token
   KL and values first);
2. the driver cuts the rollout into per-rank shards (:func:`shard_for_rank`):
   step ``s`` of ``num_steps_per_rollout`` uses samples ``[s*gbs, (s+1)*gbs)``,
   and data-parallel rank ``r`` of ``dp`` gets a contiguous ``gbs/dp`` slice of
   each step;
3. each rank pads its shard (:func:`collate`) and computes per-token advantages
   (:func:`token_advantages`); batch whitening uses moments all-reduced over
   the ranks, so it equals whitening the whole rollout in one process.

Tensor alignment follows ``TrainBatch``: per-token tensors are ``[B, T-1]`` and
position ``t`` scores token ``t+1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from slime.backends.base import TrainBatch
from slime.rl.advantages import discounted_returns, gae, group_normalized_rewards, token_level_rewards
from slime.rl.masked import masked_moments, whiten, zero_masked

__all__ = ["GROUP_ESTIMATORS", "collate", "sequence_scores", "shard_for_rank", "token_advantages", "train_inputs"]

GROUP_ESTIMATORS = ("grpo", "gspo", "cispo")


def sequence_scores(rewards: Sequence[float], *, estimator: str, group_size: int, normalize_std: bool) -> list[float]:
    """One score per sample (samples of a prompt contiguous, ``group_size`` each)."""
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float32)
    if estimator in GROUP_ESTIMATORS:
        return group_normalized_rewards(r, group_size, normalize_std=normalize_std).tolist()
    if estimator == "reinforce_plus_plus_baseline":
        return group_normalized_rewards(r, group_size, normalize_std=False).tolist()
    return r.tolist()


def train_inputs(samples: Sequence[Any]) -> list[dict[str, Any]]:
    """What a trainer rank needs of each ``Sample`` (what :func:`collate` reads), as plain dicts."""
    return [
        {
            "tokens": s.tokens,
            "response_length": s.response_length,
            "loss_mask": s.loss_mask,
            "rollout_log_probs": s.rollout_log_probs,
        }
        for s in samples
    ]


def shard_for_rank(items: Sequence[Any], *, dp_rank: int, dp_size: int, steps: int) -> list[Any]:
    """The items data-parallel rank ``dp_rank`` trains on, step by step (see the module docstring)."""
    n = len(items)
    if steps < 1 or n % steps:
        raise ValueError(f"{n} samples cannot be split into num_steps_per_rollout={steps} equal steps")
    per_step = n // steps
    if per_step % dp_size:
        raise ValueError(
            f"a step of {per_step} samples cannot be split over {dp_size} data-parallel ranks; "
            "make train.global_batch_size a multiple of the data-parallel size"
        )
    per_rank = per_step // dp_size
    out: list[Any] = []
    for s in range(steps):
        start = s * per_step + dp_rank * per_rank
        out.extend(items[start : start + per_rank])
    return out


def collate(samples: Sequence[dict], *, kind: str = "rl", pad_id: int = 0) -> TrainBatch:
    """Right-pad samples (dicts with ``tokens``, ``response_length``, optional ``loss_mask`` and
    ``rollout_log_probs`` over the response) into a ``TrainBatch``."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    B = len(samples)
    T = max(len(s["tokens"]) for s in samples)
    if T < 2:
        raise ValueError("every sample needs at least 2 tokens (a prompt token and a response token)")
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T - 1, dtype=torch.float32)
    rollout_lp = torch.zeros(B, T - 1, dtype=torch.float32)
    have_lp = all(s.get("rollout_log_probs") for s in samples)
    for i, s in enumerate(samples):
        toks = s["tokens"]
        L, R = len(toks), int(s["response_length"])
        P = L - R
        if R <= 0 or P <= 0:
            raise ValueError(f"sample {i}: needs a non-empty prompt and response (prompt {P}, response {R} tokens)")
        tokens[i, :L] = torch.tensor(toks, dtype=torch.long)
        attention[i, :L] = 1
        lm = s.get("loss_mask") or [1] * R
        mask[i, P - 1 : L - 1] = torch.tensor(lm, dtype=torch.float32)
        if have_lp:
            rollout_lp[i, P - 1 : L - 1] = torch.tensor(s["rollout_log_probs"], dtype=torch.float32)
    return TrainBatch(
        tokens=tokens,
        attention_mask=attention,
        response_mask=mask,
        rollout_log_probs=rollout_lp if have_lp else None,
        kind=kind,
    )  # type: ignore[arg-type]


AllReduce = Callable[[torch.Tensor], torch.Tensor]


def _whiten_global(x: torch.Tensor, mask: torch.Tensor, all_reduce: AllReduce) -> torch.Tensor:
    s, sq, n = masked_moments(x.float(), mask)
    stats = all_reduce(torch.stack([s, sq, n]).double())
    total = stats[2].clamp_min(1)
    mean = stats[0] / total
    var = (stats[1] / total - mean.square()).clamp_min(0)
    return whiten(x.float(), mask, mean=mean.float(), var=var.float())


def token_advantages(
    scores: torch.Tensor,
    mask: torch.Tensor,
    *,
    estimator: str,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lambd: float = 1.0,
    all_reduce: AllReduce = lambda t: t,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``(advantages, returns)`` ``[B, T-1]`` from this rank's sequence scores."""
    if estimator in GROUP_ESTIMATORS:
        if kl_coef:
            raise ValueError(
                f"{estimator} takes no KL penalty in the reward (algorithm.kl_coef={kl_coef}); "
                "use algorithm.kl_loss_coef instead"
            )
        adv = zero_masked(scores[:, None].expand(mask.shape).float(), mask)
        return adv, adv.clone()
    if kl_coef and kl is None:
        raise ValueError(f"algorithm.kl_coef={kl_coef} needs a reference model (model.ref_path)")
    if estimator == "reinforce_plus_plus":
        returns = discounted_returns(token_level_rewards(scores, mask, kl=kl, kl_coef=kl_coef), mask, gamma)
        return _whiten_global(returns, mask, all_reduce), returns
    if estimator == "reinforce_plus_plus_baseline":
        raw = zero_masked(scores[:, None].expand(mask.shape).float(), mask)
        if kl is not None and kl_coef:
            raw = raw - kl_coef * zero_masked(kl.float(), mask)
        return _whiten_global(raw, mask, all_reduce), raw
    if estimator == "ppo":
        if values is None:
            raise ValueError("ppo needs critic values; is the critic group running?")
        adv, returns = gae(
            token_level_rewards(scores, mask, kl=kl, kl_coef=kl_coef), values, mask, gamma=gamma, lambd=lambd
        )
        return _whiten_global(adv, mask, all_reduce), returns
    raise ValueError(f"unknown estimator {estimator!r}")
