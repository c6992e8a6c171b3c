"""One ``metrics.jsonl`` line: what a rollout step or the warm-up reports, assembled from its parts.

The driver hands over what it fetched (samples, rank 0's ``prepare`` and per-step metrics) and gets
the line; nothing here talks to Ray. Keys: ``rollout/*`` (count, full-credit accuracy, zero-std
groups, staleness, off-policy share), ``agent/*``, ``train/*`` / ``critic/*`` (means over steps),
and the consistency checks: ``check/stale_samples`` (always 0 unless a sync was lost),
``check/kl_before_update`` and rollout 0's ``check/step0_*`` (engine vs trainer before any update).
The caller adds ``eval/*`` and ``time/*``. Key-by-key definitions: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slime.rl.sample import Sample, SampleStatus

__all__ = ["FULL_CREDIT", "mean_metrics", "rollout_record", "sample_metrics", "warmup_record"]

FULL_CREDIT = 1.0 - 1e-9


def sample_metrics(samples: Sequence[Sample], weight_version: int) -> dict[str, Any]:
    """``rollout/*`` of the trained samples (groups: the samples sharing a ``group_index``)."""
    n = max(1, len(samples))
    rewards = [float(s.reward or 0.0) for s in samples]
    by_group: dict[Any, list[float]] = {}
    for s, x in zip(samples, rewards):
        by_group.setdefault(s.group_index, []).append(x)
    groups = list(by_group.values())
    return {
        "rollout/samples": len(samples),
        "rollout/reward_mean": sum(rewards) / n,
        "rollout/accuracy": sum(x >= FULL_CREDIT for x in rewards) / n,
        "rollout/response_len_mean": sum(s.response_length for s in samples) / n,
        "rollout/truncated_frac": sum(s.status == SampleStatus.TRUNCATED for s in samples) / n,
        "rollout/zero_std_groups": sum(max(g) == min(g) for g in groups) / max(1, len(groups)),
        "rollout/weight_version": weight_version,
        "check/stale_samples": sum(_newest_version(s) != weight_version for s in samples),
        "rollout/offpolicy_token_frac": sum(v != weight_version for s in samples for v in s.token_versions)
        / max(1, sum(s.response_length for s in samples)),
    }


def _newest_version(s: Sample) -> int:
    """The version that generated the sample's last tokens (a continued partial response began earlier)."""
    return max(s.token_versions) if s.token_versions else s.weight_version


def mean_metrics(prefix: str, per_step: list[dict[str, float]]) -> dict[str, float]:
    """``prefix/key``: the mean over the optimizer steps of one rollout (``lr``: the last value)."""
    if not per_step:
        return {}
    out = {}
    for k in per_step[0]:
        vals = [m[k] for m in per_step if m.get(k) is not None]
        if vals:
            out[f"{prefix}/{k}"] = vals[-1] if k == "lr" else sum(vals) / len(vals)
    return out


def rollout_record(
    rollout_id: int,
    *,
    step: int,
    weight_version: int,
    samples: Sequence[Sample],
    used_version: int,
    policy_version: int | None = None,
    prepare: dict[str, float],
    train: list[dict[str, float]],
    critic: list[dict[str, float]],
    agent: bool = False,
) -> dict[str, Any]:
    """The line of rollout ``rollout_id`` without ``eval/*`` and ``time/*`` (keys: docs/design-notes.md).

    ``used_version``: the weight version that generated the samples; ``policy_version``: the version
    the trainer's policy had when this step began (staleness); ``train`` / ``critic``: rank 0's
    metrics of each optimizer step (their ``step_time_s`` become the ``time/*_steps_s`` sums)."""
    record: dict[str, Any] = {"rollout_id": rollout_id, "step": step, "weight_version": weight_version}
    record.update(sample_metrics(samples, used_version))
    if policy_version is not None:
        lag = [policy_version - s.weight_version for s in samples] or [0]
        record["rollout/staleness_mean"] = sum(lag) / len(lag)
        record["rollout/staleness_max"] = max(lag)
    if agent:  # tool-call rate and friends of the agent episodes
        from slime.agent.generate import rollout_metrics

        record.update(rollout_metrics(samples))
    record.update(prepare)
    train, critic = [dict(m) for m in train], [dict(m) for m in critic]  # the step times are popped below
    record["time/train_steps_s"] = sum(m.pop("step_time_s", 0.0) for m in train)
    if critic:
        record["time/critic_steps_s"] = sum(m.pop("step_time_s", 0.0) for m in critic)
    record.update(mean_metrics("train", train))
    record.update(mean_metrics("critic", critic))
    if not train and not critic:  # no optimizer step this rollout (debug.mode rollout_only, or too few samples)
        return record
    if train:  # else the critic-only warm-up: the trainer's checks before any update still hold
        record["check/kl_before_update"] = train[0].get("approx_kl")
    if rollout_id == 0:
        record["check/step0_logprob_diff"] = record.get("train/logprob_diff")
        if "train/rollout_kl" in record:
            record["check/step0_kl"] = record["train/rollout_kl"]
        if "train/ref_kl" in record:
            record["check/step0_ref_kl"] = record["train/ref_kl"]
    return record


def warmup_record(sft_losses: Sequence[float], seconds: float) -> dict[str, Any]:
    """The SFT warm-up's keys of the ``rollout_id = -1`` line (empty without a warm-up)."""
    if not sft_losses:
        return {}
    return {
        "sft/loss": sft_losses[-1],
        "sft/loss_first": sft_losses[0],
        "sft/steps": len(sft_losses),
        "time/sft_s": seconds,
    }
