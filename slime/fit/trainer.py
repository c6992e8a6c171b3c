"""Peak memory of one Megatron trainer rank: weights, gradients, optimizer state, activations, logits.

Per parameter (mixed precision Adam): bf16 weight 2 B + fp32 main grad 4 B + fp32 master and Adam
moments 12 B, the 12 B sharded over data parallel with the distributed optimizer (the expert data-
parallel group for experts), as Megatron-LM's ``compute_weight_and_optimizer_memory`` counts.
Activations per layer and micro-batch follow Korthikanti et al. 2022 (Table 2), with the MLP's
4h generalised to the layer's width as in Megatron-LM's ``compute_activation_memory``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from slime.fit.breakdown import GIB, Breakdown
from slime.fit.model import VOCAB_MULTIPLE, Dims

__all__ = [
    "CUDA_CONTEXT",
    "TrainerLayout",
    "layer_activations",
    "offloaded_optimizer",
    "stage_layers",
    "trainer_memory",
]

# A CUDA context, NCCL communicators and the allocator's slack per process: an allowance, not a measurement.
CUDA_CONTEXT = 1 * GIB


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerLayout:
    """What the estimate needs of the spec's train section (``slime.fit.plan.trainer_layout`` builds it)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int = 1  # data parallel (the optimizer shards over dp x cp)
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    precision: str = "bf16"
    tokens: int = 4096  # tokens of one micro-batch on one GPU (after the context-parallel split)
    seq_len: int = 4096  # longest sample (prompt + response), for the attention-score term
    in_flight: int = 1  # micro-batches whose activations the first pipeline stage holds at once
    recompute: str | None = None  # "full", "selective" or None (train.megatron.args recompute-granularity)
    attention_scores: bool = False  # the attention backend stores the s x s scores (local/unfused)
    optimizer_offload: float = 0.0  # the fraction of optimizer state on the host (train.megatron.optimizer_offload)


def stage_layers(layers: int, pp: int, stage: int) -> range:
    """The layers of pipeline stage ``stage`` (even split, the remainder on the first stages)."""
    base, extra = divmod(layers, pp)
    first = stage * base + min(stage, extra)
    return range(first, first + base + (stage < extra))


def _params(d: Dims, lay: TrainerLayout, stage: int) -> tuple[float, float]:
    """(non-expert, routed-expert) parameters this rank holds on pipeline stage ``stage``."""
    layers = stage_layers(d.layers, lay.pp, stage)
    vocab = math.ceil(d.vocab / (VOCAB_MULTIPLE * lay.tp)) * VOCAB_MULTIPLE * lay.tp
    dense = sum(d.layer_params(d.is_moe(i)) for i in layers) / lay.tp
    first, last = stage == 0, stage == lay.pp - 1
    dense += (first + (last and (not d.tied or lay.pp > 1))) * vocab * d.hidden / lay.tp + last * d.hidden
    experts = sum(d.is_moe(i) for i in layers) * d.expert_params / (lay.ep * lay.etp)
    return dense, experts


def _state(d: Dims, lay: TrainerLayout, stage: int) -> tuple[int, int, int]:
    """(weights, gradients, optimizer state) in bytes on one rank of ``stage``."""
    dense, experts = _params(d, lay, stage)
    wbytes = 4 if lay.precision == "fp32" else 2
    opt_per = 8 if lay.precision == "fp32" else 12  # fp32 weights are their own master copy
    world = lay.tp * lay.pp * lay.cp * lay.dp
    edp = max(1, world // (lay.etp * lay.ep * lay.pp))
    shard_d, shard_e = (lay.dp * lay.cp, edp) if lay.distributed_optimizer else (1, 1)
    optimizer = opt_per * (dense / shard_d + experts / shard_e)
    return int(wbytes * (dense + experts)), int(4 * (dense + experts)), int(optimizer)


def offloaded_optimizer(d: Dims, lay: TrainerLayout) -> int:
    """Optimizer state one rank keeps on the host (train.megatron.optimizer_offload of it)."""
    return int(lay.optimizer_offload * max(_state(d, lay, stage)[2] for stage in range(lay.pp)))


def layer_activations(d: Dims, lay: TrainerLayout, moe: bool) -> float:
    """Bytes one layer keeps for the backward of one micro-batch (Korthikanti et al. 2022, Table 2)."""
    sbh, t = lay.tokens * d.hidden, lay.tp
    mlp = 4 * d.ffn_active(moe) / d.hidden  # 16 at the paper's ffn = 4h
    scores = 5 * d.heads * min(lay.seq_len, lay.tokens) / d.hidden if lay.attention_scores else 0.0
    if lay.recompute == "selective":
        scores = 0.0
    if lay.sequence_parallel or t == 1:
        return sbh * (18 + mlp + scores) / t
    return sbh * (10 + (8 + mlp + scores) / t)


def _activations(d: Dims, lay: TrainerLayout, stage: int) -> int:
    layers = stage_layers(d.layers, lay.pp, stage)
    per = [layer_activations(d, lay, d.is_moe(i)) for i in layers]
    if lay.recompute == "full":  # each layer keeps its input; one layer is recomputed at a time
        sp = lay.tp if lay.sequence_parallel else 1
        kept = len(per) * 2 * lay.tokens * d.hidden / sp
        return int(kept * lay.in_flight + max(per, default=0))
    return int(sum(per) * lay.in_flight)


def _logits(d: Dims, lay: TrainerLayout, stage: int) -> int:
    """The loss's fp32 logits over this rank's vocabulary shard, and their gradient (last stage)."""
    if stage != lay.pp - 1:
        return 0
    return int(2 * lay.tokens * math.ceil(d.vocab / lay.tp) * 4)


def trainer_memory(d: Dims, lay: TrainerLayout, *, reference: bool = False, critic: bool = False) -> Breakdown:
    """The peak over pipeline stages of one rank: the actor's, plus a reference / critic model held."""
    best: Breakdown | None = None
    for stage in range(lay.pp):
        weights, grads, optimizer = _state(d, lay, stage)
        optimizer = int(optimizer * (1 - lay.optimizer_offload))
        terms = [
            ("weights", weights),
            ("gradients", grads),
            ("optimizer", optimizer),
            ("activations", _activations(d, lay, stage)),
            ("logits", _logits(d, lay, stage)),
            ("reference", weights if reference else 0),
            ("critic", weights + grads + optimizer if critic else 0),
            ("cuda context", CUDA_CONTEXT),
        ]
        b = Breakdown(terms=tuple(terms), notes=(f"pipeline stage {stage} of {lay.pp}",))
        if best is None or b.total > best.total:
            best = b
    if best is None:  # unreachable: a layout has at least one pipeline stage
        raise ValueError(f"no pipeline stage in a layout of pp={lay.pp}")
    return best
