"""Per-rollout metrics computed from the samples and from the trainer ranks' per-step metrics.

``rollout/accuracy`` counts samples with full credit (reward >= 1 - 1e-9), so partial-credit rewards
(f1) still have a meaningful accuracy; ``rollout/zero_std_groups`` is the share of prompt groups whose
samples all got the same reward (they carry no GRPO signal); ``check/stale_samples`` counts samples
whose weight version is not the one the engines were told to serve (always 0 in this synchronous
loop; a non-zero value means a weight sync did not reach an engine).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slime.rl.sample import Sample, SampleStatus

__all__ = ["FULL_CREDIT", "mean_metrics", "sample_metrics"]

FULL_CREDIT = 1.0 - 1e-9


def sample_metrics(
    samples: Sequence[Sample], rewards: Sequence[float], group_size: int, weight_version: int
) -> dict[str, Any]:
    n = max(1, len(samples))
    groups = [rewards[i : i + group_size] for i in range(0, len(rewards), group_size)]
    return {
        "rollout/reward_mean": sum(rewards) / n,
        "rollout/accuracy": sum(x >= FULL_CREDIT for x in rewards) / n,
        "rollout/response_len_mean": sum(s.response_length for s in samples) / n,
        "rollout/truncated_frac": sum(s.status == SampleStatus.TRUNCATED for s in samples) / n,
        "rollout/zero_std_groups": sum(max(g) == min(g) for g in groups) / max(1, len(groups)),
        "rollout/weight_version": weight_version,
        "check/stale_samples": sum(s.weight_version != weight_version for s in samples),
    }


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
