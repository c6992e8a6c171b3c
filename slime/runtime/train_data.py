"""From generated samples to ``TrainBatch`` tensors and advantages.

Split so that group statistics and whitening see the whole rollout whatever the data-parallel
size: (1) each rank computes sequence scores from the whole rollout's rewards (:func:`rank_scores`);
(2) the driver plans the optimizer steps (``step_plan.plan_steps``); (3) each rank pads its shard
(:func:`collate`) and computes per-token advantages with moments all-reduced over ranks, so uneven
shards give the one-process loss and gradients. Per-token tensors are ``[B, T-1]``: position ``t``
scores token ``t+1``. Scoring per estimator and step planning: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

from slime.backends.base import TrainBatch
from slime.rl.advantages import GROUP_STD_EPS, discounted_returns, gae, group_normalized_rewards, token_level_rewards
from slime.rl.masked import masked_moments, whiten, zero_masked
from slime.runtime.step_plan import ShardScores

__all__ = [
    "GROUP_ESTIMATORS",
    "collate",
    "rank_scores",
    "sequence_scores",
    "token_advantages",
]

GROUP_ESTIMATORS = ("grpo", "gspo", "cispo")


def sequence_scores(
    rewards: Sequence[float],
    *,
    estimator: str,
    normalize_std: bool,
    group_size: int | None = None,
    group_ids: Sequence[Hashable] | None = None,
    episode_ids: Sequence[Hashable] | None = None,
) -> list[float]:
    """One score per sample. Groups: ``group_ids`` (any sizes, any order), else contiguous runs of
    ``group_size``. With ``episode_ids``, samples of one episode (same reward) count once in their
    group's mean and std and all get that episode's score."""
    r = torch.tensor([float(x) for x in rewards], dtype=torch.float32)
    if estimator not in (*GROUP_ESTIMATORS, "reinforce_plus_plus_baseline"):
        return r.tolist()
    std = normalize_std and estimator in GROUP_ESTIMATORS
    if group_ids is None:
        if group_size is None:
            raise ValueError("sequence_scores needs group_size or group_ids")
        return group_normalized_rewards(r, group_size, normalize_std=std).tolist()
    ids, eps = list(group_ids), list(episode_ids) if episode_ids is not None else list(range(len(r)))
    if len(ids) != len(r) or len(eps) != len(r):
        raise ValueError(f"{len(r)} rewards but {len(ids)} group ids and {len(eps)} episode ids")
    size = _contiguous_size(ids)
    if size and len(set(eps)) == len(eps):  # the common case: the batched form (same arithmetic as before)
        return group_normalized_rewards(r, size, normalize_std=std).tolist()
    return _scores_by_group(r, ids, eps, std)


def _contiguous_size(ids: list[Hashable]) -> int | None:
    """The group size when ``ids`` are equal-size contiguous runs of distinct ids, else None."""
    if not ids:
        return None
    size = ids.index(next((x for x in ids if x != ids[0]), ids[0])) or len(ids)
    if len(ids) % size:
        return None
    runs = [ids[i : i + size] for i in range(0, len(ids), size)]
    heads = [run[0] for run in runs]
    return size if len(set(heads)) == len(heads) and all(len(set(run)) == 1 for run in runs) else None


def _scores_by_group(r: torch.Tensor, ids: list[Hashable], eps: list[Hashable], std: bool) -> list[float]:
    out = torch.zeros_like(r)
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    for rows in members.values():
        first: dict[Hashable, int] = {}
        for i in rows:
            first.setdefault(eps[i], i)
        per_episode = r[list(first.values())]
        centred = r[rows] - per_episode.mean()
        if std and per_episode.numel() > 1:
            centred = centred / (per_episode.std() + GROUP_STD_EPS)
        out[rows] = centred
    return out.tolist()


def rank_scores(shard: ShardScores, *, estimator: str, normalize_std: bool) -> list[float]:
    """This rank's sequence scores: :func:`sequence_scores` of the whole rollout, taken at the shard's indices."""
    scores = sequence_scores(
        shard.rewards,
        estimator=estimator,
        normalize_std=normalize_std,
        group_ids=shard.group_ids,
        episode_ids=shard.episode_ids,
    )
    return [scores[i] for i in shard.indices]


def collate(samples: Sequence[dict], *, kind: str = "rl", pad_id: int = 0) -> TrainBatch:
    """Right-pad samples (dicts with ``tokens``, ``response_length``, optional ``loss_mask``,
    ``rollout_log_probs`` and ``teacher_log_probs`` over the response) into a ``TrainBatch``."""
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
    teacher_lp = torch.zeros(B, T - 1, dtype=torch.float32)
    have_lp = all(s.get("rollout_log_probs") for s in samples)
    have_teacher = all(s.get("teacher_log_probs") for s in samples)
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
        if have_teacher:
            teacher_lp[i, P - 1 : L - 1] = torch.tensor(s["teacher_log_probs"], dtype=torch.float32)
    return TrainBatch(
        tokens=tokens,
        attention_mask=attention,
        response_mask=mask,
        rollout_log_probs=rollout_lp if have_lp else None,
        teacher_log_probs=teacher_lp if have_teacher else None,
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
