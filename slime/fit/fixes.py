"""The cheapest changes that make an over-budget role fit, each re-estimated (no guessing).

Tried in order of cost: free settings first (distributed optimizer), then compute (recompute), then a
smaller micro-batch, then more model parallelism on the same GPUs, then more GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from slime.fit.engine import EngineLayout, engine_memory
from slime.fit.model import Dims
from slime.fit.trainer import TrainerLayout, trainer_memory

__all__ = ["engine_fixes", "trainer_fixes"]

Change = tuple[str, Callable[[Any], Any]]


def _trainer_changes(d: Dims, lay: TrainerLayout, world: int, dynamic: bool) -> Iterator[Change]:
    if not lay.distributed_optimizer:
        yield "train.optimizer.distributed: true", lambda x: replace(x, distributed_optimizer=True)
    if lay.recompute != "full":
        yield "train.megatron.args.recompute-granularity: full", lambda x: replace(x, recompute="full")
    if lay.tokens >= 2 * lay.seq_len // lay.cp:
        what = "train.dynamic_batch.max_tokens_per_gpu" if dynamic else "train.micro_batch_size"
        yield f"halve {what}", lambda x: replace(x, tokens=x.tokens // 2)
    tp = 2 * lay.tp
    if d.heads % tp == 0 and d.kv_heads % min(tp, d.kv_heads) == 0 and lay.dp % 2 == 0:
        yield f"train.parallel.tensor: {tp}", lambda x: replace(x, tp=tp, dp=x.dp // 2, sequence_parallel=True)
    if d.layers % (2 * lay.pp) == 0 and lay.dp % 2 == 0:
        yield f"train.parallel.pipeline: {2 * lay.pp}", lambda x: replace(x, pp=2 * x.pp, dp=x.dp // 2)
    if d.experts and d.experts % (2 * lay.ep) == 0 and world % (lay.etp * 2 * lay.ep * lay.pp) == 0:
        yield f"train.parallel.expert: {2 * lay.ep}", lambda x: replace(x, ep=2 * x.ep)
    if lay.dp > 1 or lay.distributed_optimizer:
        yield "twice the trainer nodes (train.nodes)", lambda x: replace(x, dp=2 * x.dp)


def trainer_fixes(
    d: Dims, lay: TrainerLayout, capacity: int, *, extra: int = 0, world: int, dynamic: bool, **held: bool
) -> list[str]:
    """Each single change that brings the trainer's peak (plus ``extra`` bytes) under ``capacity``."""
    out = []
    for text, change in _trainer_changes(d, lay, world, dynamic):
        after = trainer_memory(d, change(lay), **held).total + extra
        if after <= capacity:
            out.append(f"{text} (-> {after / (1 << 30):.1f} GiB)")
    return out


def engine_fixes(d: Dims, e: EngineLayout, *, colocated: bool, heads_ok: Callable[[int], bool]) -> list[str]:
    """Single changes after which an engine holds at least one full-length request."""
    changes: list[tuple[str, EngineLayout]] = []
    if not colocated and (e.mem_fraction or 0) < 0.9:
        changes.append(("rollout.sglang.args.mem-fraction-static: 0.9", replace(e, mem_fraction=0.9)))
    if heads_ok(2 * e.tp):
        changes.append((f"rollout.gpus_per_engine: {2 * e.tp}", replace(e, tp=2 * e.tp, concurrent=e.concurrent * 2)))
    if colocated:
        changes.append(("rollout.colocate: false (engines on GPUs of their own)", replace(e, beside=0)))
    out = []
    for text, after in changes:
        fit = engine_memory(d, after)
        if fit.kv_tokens >= fit.request_tokens:
            out.append(f"{text} (-> {fit.kv_tokens} KV tokens)")
    return out
