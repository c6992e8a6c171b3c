"""Host RAM of one node: checkpoint loading and export, offloaded optimizer state, rollout data, processes.

Compared with the launcher's memory request (``cluster.<launcher>.mem``, SLURM's unit rules) when one is set.
"""

from __future__ import annotations

from typing import Any

from slime.fit.breakdown import GIB, Breakdown
from slime.fit.model import Dims

__all__ = ["EXPORT_SHARD", "PROCESS", "host_limit", "host_memory", "parse_mem"]

# Python, CUDA and torch/SGLang libraries of one process on the host: an allowance, not a measurement.
PROCESS = 2 * GIB
EXPORT_SHARD = 4 * GIB  # slime.backends.megatron.hf_io.write_shards' max_shard_bytes
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_mem(text: str) -> int | None:
    """Bytes of a SLURM-style memory size ('900G'; no unit = MiB)."""
    text = str(text).strip().upper()
    unit = _UNITS.get(text[-1:]) if text[-1:].isalpha() else _UNITS["M"]
    digits = text[:-1] if text[-1:].isalpha() else text
    return int(digits) * unit if digits.isdigit() and unit else None


def host_limit(spec: Any) -> int | None:
    c = spec.cluster
    section = getattr(c, c.launcher, None)
    mem = getattr(section, "mem", None)
    return parse_mem(mem) if mem else None


def host_memory(spec: Any, d: Dims, trainer: Breakdown | None, offloaded: int = 0) -> Breakdown:
    """The peak of one node's host RAM (the node with the most trainer ranks and engines); ``offloaded``:
    the optimizer state one trainer rank keeps on the host."""
    t, r, c = spec.train, spec.rollout, spec.cluster
    ranks = (t.gpus_per_node or 0) if trainer is not None else 0
    engines_here = min(r.num_engines or 0, max(1, c.gpus_per_node // r.gpus_per_engine))
    # loading: each rank reads its shard of the HF checkpoint into host memory before moving it to its GPU;
    # save_hf: each pipeline stage's writer buffers up to EXPORT_SHARD of safetensors at a time
    staging = ranks * (trainer.get("weights") if trainer is not None else 0)
    export = min(ranks, t.parallel.pipeline) * EXPORT_SHARD if t.checkpoint.save_hf else 0
    samples = (r.over_sampling_batch_size or r.batch_size) * r.n_samples_per_prompt
    data = samples * (r.max_prompt_len + r.max_response_len) * 16  # ids, log-probs, masks, rewards
    terms = (
        ("checkpoint conversion", max(export, staging)),
        ("optimizer offload", ranks * offloaded),
        ("rollout data (object store)", data),
        ("processes", (ranks + engines_here + 1) * PROCESS),
    )
    return Breakdown(terms=terms)
