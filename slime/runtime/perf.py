"""Throughput, trainer FLOPs and MFU of one rollout step: the ``perf/*`` keys of a metrics line.

Tokens and samples per second of generation, training and the whole step; the trainer's model
FLOPs (from ``config.json`` via ``slime.models.flops``, so independent of padding) and TFLOP/s per
device; ``perf/mfu`` **only** for bf16/fp16 on a GPU whose peak the table knows (never guessed);
trainer and engine idle shares. Not counted: what ``slime.models.flops`` leaves out, and the
engines' FLOPs. Key-by-key definitions: docs/design-notes.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.models.flops import TRAIN_PASSES, ModelShape, forward_flops, model_shape

__all__ = ["PEAK_TFLOPS", "PerfModel", "peak_tflops", "perf_model", "step_perf"]

# Dense (no sparsity) bf16/fp16 tensor-core peak per device, TFLOP/s, from the vendors' datasheets.
# First match wins, so more specific names come first (H100 PCIe before H100, H200 before H20).
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    (r"GB200", 2500.0),
    (r"B200", 2250.0),
    (r"B100", 1750.0),
    (r"GH200", 989.5),
    (r"H200", 989.5),
    (r"H100.*PCIe", 756.5),
    (r"H100.*NVL", 835.5),
    (r"H100", 989.5),
    (r"H800", 989.5),
    (r"\bH20\b", 148.0),
    (r"A100", 312.0),
    (r"A800", 312.0),
    (r"L40S", 362.05),
    (r"L40\b", 181.05),
    (r"\bL4\b", 121.0),
    (r"\bA10\b", 125.0),
    (r"RTX 4090", 165.2),
    (r"MI300X", 1307.4),
    (r"MI250X", 383.0),
)


def peak_tflops(device_name: str | None, precision: str) -> float | None:
    """The device's dense bf16/fp16 peak if the table knows it and the run trains in bf16/fp16."""
    if not device_name or precision not in ("bf16", "fp16"):
        return None
    for pattern, tflops in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return tflops
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class PerfModel:
    """What a run's FLOPs and MFU depend on, fixed at start: the policy's shape, which trainer passes
    run (reference model, critic), the trainer ranks and their peak (None: no MFU)."""

    shape: ModelShape | None
    ref: bool
    critic: bool
    ranks: int
    peak_tflops: float | None

    def trainer_flops(self, lengths: Sequence[int]) -> float | None:
        """Model FLOPs the trainer ranks spend on one rollout with these sequence lengths."""
        if self.shape is None:
            return None
        policy = forward_flops(self.shape, lengths)
        passes = 1 + int(self.ref) + TRAIN_PASSES  # old log-probs, reference log-probs, training
        total = passes * policy
        if self.critic:  # values, then training, on the backbone with a scalar head
            total += (1 + TRAIN_PASSES) * forward_flops(self.shape.without_lm_head(), lengths)
        return total


def perf_model(spec: Any, model_dir: Path, actor_ranks: Sequence[Mapping[str, Any]]) -> PerfModel:
    """The run's :class:`PerfModel`: the shape from ``model_dir/config.json`` (None if unreadable: no
    FLOPs), the peak from trainer rank 0's ``device_name`` (``TrainerRank.where``)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        cfg = {}
    name = actor_ranks[0].get("device_name") if actor_ranks else None
    gpu = bool(actor_ranks) and str(actor_ranks[0].get("device", "cpu")).startswith("cuda")
    return PerfModel(
        shape=model_shape(cfg) if isinstance(cfg, dict) else None,
        ref=spec.model.ref_path is not None,
        critic=spec.algorithm.estimator == "ppo",
        ranks=max(1, len(actor_ranks)),
        peak_tflops=peak_tflops(name, spec.train.precision) if gpu else None,
    )


def _rate(amount: float, seconds: float | None) -> float | None:
    return amount / seconds if seconds and seconds > 0 else None


def _idle(busy: float, step: float) -> float | None:
    return min(1.0, max(0.0, 1.0 - busy / step)) if step > 0 else None


def step_perf(model: PerfModel, samples: Sequence[Any], times: Mapping[str, float]) -> dict[str, float]:
    """The ``perf/*`` keys of one step (see docs/design-notes.md); ``times`` holds its ``time/*`` keys.
    Keys whose inputs are missing or zero are left out."""
    n = len(samples)
    response = sum(s.response_length for s in samples)
    lengths = [len(s.tokens) for s in samples]
    gen, train, step = times.get("time/generate_s"), times.get("time/train_s"), times.get("time/step_s", 0.0)
    out: dict[str, float | None] = {
        "perf/rollout_tokens_per_s": _rate(response, gen),
        "perf/rollout_samples_per_s": _rate(n, gen),
        "perf/train_tokens_per_s": _rate(sum(lengths), train),
        "perf/train_samples_per_s": _rate(n, train),
        "perf/samples_per_s": _rate(n, step),
    }
    flops = model.trainer_flops(lengths)
    if flops is not None:
        out["perf/train_flops"] = flops
        tflops = _rate(flops / max(1, model.ranks) / 1e12, train)
        out["perf/train_tflops"] = tflops
        if tflops is not None and model.peak_tflops:
            out["perf/mfu"] = tflops / model.peak_tflops
    sync, evaluation = times.get("time/sync_s", 0.0), times.get("time/eval_s", 0.0)
    out["perf/trainer_idle_frac"] = _idle((train or 0.0) + sync, step)
    out["perf/engine_idle_frac"] = _idle((gen or 0.0) + sync + evaluation, step)
    return {k: v for k, v in out.items() if v is not None}
