"""The fit of a whole spec: each role on its GPUs (both phases when colocated) and each node's host RAM.

``estimate`` returns None where nothing can be said: no readable config.json, no known GPU memory,
a CPU-only or fake-GPU cluster, or backends this estimate does not model (only megatron and sglang).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from slime.fit.breakdown import Breakdown
from slime.fit.engine import EngineFit, EngineLayout, engine_memory
from slime.fit.gpus import gpu_memory_gib
from slime.fit.host import host_limit, host_memory
from slime.fit.model import Dims, dims_from_config
from slime.fit.trainer import CUDA_CONTEXT, TrainerLayout, offloaded_optimizer, trainer_memory

__all__ = ["NEAR", "FitReport", "RoleFit", "engine_layout", "estimate", "gpu_bytes", "trainer_layout"]

NEAR = 0.9  # above this share of a GPU (or of a node's RAM) a role fits only narrowly: a warning
Verdict = Literal["ok", "tight", "over"]
_RESIDENT = ("weights", "gradients", "optimizer", "reference", "critic", "cuda context")


@dataclass(frozen=True, kw_only=True, slots=True)
class RoleFit:
    """One role on one kind of GPU (or a node's host RAM): its breakdown against the capacity."""

    role: str
    gpus: int  # devices in this row (0: host RAM, per node)
    memory: Breakdown
    capacity: int
    verdict: Verdict
    engine: EngineFit | None = None

    @property
    def headroom(self) -> int:
        return self.capacity - self.memory.total


@dataclass(frozen=True, kw_only=True, slots=True)
class FitReport:
    gpu: str
    gpu_bytes: int
    roles: tuple[RoleFit, ...]
    dims: Dims

    def worst(self) -> RoleFit | None:
        order = {"over": 0, "tight": 1, "ok": 2}
        return min(self.roles, key=lambda r: (order[r.verdict], r.headroom), default=None)


def gpu_bytes(spec: Any) -> int | None:
    g = getattr(spec.cluster, "gpu", None)
    if g is None:
        return None
    gib = g.memory_gb if g.memory_gb is not None else gpu_memory_gib(g.name)
    return None if gib is None else int(gib * (1 << 30))


def _arg(args: dict, *names: str) -> Any:
    for key, value in (args or {}).items():
        if key.lstrip("-").replace("_", "-") in names:
            return value
    return None


def _int_arg(args: dict, *names: str) -> int | None:
    value = _arg(args, *names)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def trainer_layout(spec: Any) -> TrainerLayout:
    t, r = spec.train, spec.rollout
    p, args = t.parallel, (t.megatron.args if getattr(t, "megatron", None) else {})
    world = (t.nodes or 1) * (t.gpus_per_node or 1)
    dp = max(1, world // (p.tensor * p.pipeline * p.context))
    seq = r.max_prompt_len + r.max_response_len
    if t.dynamic_batch.enabled and t.dynamic_batch.max_tokens_per_gpu:
        tokens, micro = max(t.dynamic_batch.max_tokens_per_gpu, math.ceil(seq / p.context)), p.pipeline
    else:
        tokens = math.ceil(t.micro_batch_size * seq / p.context)
        micro = max(1, (t.global_batch_size or 1) // (dp * t.micro_batch_size))
    return TrainerLayout(
        tp=p.tensor,
        pp=p.pipeline,
        cp=p.context,
        ep=p.expert,
        etp=p.expert_tensor or p.tensor,
        dp=dp,
        sequence_parallel=p.sequence_parallel,
        distributed_optimizer=bool(t.optimizer.distributed),
        precision=t.precision,
        tokens=tokens,
        seq_len=seq,
        in_flight=min(p.pipeline, micro),
        recompute=_arg(args, "recompute-granularity"),
        attention_scores=_arg(args, "attention-backend") in ("local", "unfused"),
        optimizer_offload=t.megatron.optimizer_offload if getattr(t, "megatron", None) else 0.0,
    )


def engine_layout(spec: Any, gpu: int, beside: int = 0) -> EngineLayout:
    r = spec.rollout
    args = r.sglang.args if getattr(r, "sglang", None) else {}
    engines = r.num_engines or max(1, (r.gpus or 1) // r.gpus_per_engine)
    samples = (r.over_sampling_batch_size or r.batch_size) * r.n_samples_per_prompt
    frac = _arg(args, "mem-fraction-static")
    return EngineLayout(
        tp=r.gpus_per_engine,
        gpu_bytes=gpu,
        mem_fraction=float(frac) if isinstance(frac, int | float) and 0 < frac < 1 else None,
        chunked_prefill=_int_arg(args, "chunked-prefill-size"),
        cuda_graph_max_bs=_int_arg(args, "cuda-graph-max-bs", "cuda-graph-max-bs-decode"),
        concurrent=math.ceil(samples / engines),
        request_tokens=r.max_prompt_len + r.max_response_len,
        beside=beside,
    )


def _verdict(total: int, capacity: int) -> Verdict:
    return "over" if total > capacity else "tight" if total > NEAR * capacity else "ok"


def _engine_verdict(e: EngineFit) -> Verdict:
    if e.kv_tokens < e.request_tokens:
        return "over"
    short = e.memory.get("working") < e.reserve / 2
    return "tight" if e.kv_tokens < e.demand_tokens or short else "ok"


def estimate(spec: Any) -> FitReport | None:
    """The fit of every role of ``spec`` (resolved), or None where it cannot be estimated (module doc)."""
    from slime.spec.resolve import model_config, starts_engines

    c = spec.cluster
    gpu, dims = gpu_bytes(spec), dims_from_config(model_config(spec.model.path))
    if gpu is None or dims is None or c.gpus_per_node == 0 or c.fake_gpus:
        return None
    train = spec.train.backend == "megatron" and spec.debug.mode != "rollout_only"
    serve = spec.rollout.backend == "sglang" and starts_engines(spec)
    if not (train or serve):
        return None
    roles: list[RoleFit] = []
    tm = _trainer(spec, dims) if train else None
    if tm is not None:
        released = ("engine (released)", CUDA_CONTEXT) if serve and spec.rollout.colocate else None
        mem = replace(tm, terms=tm.terms + ((released,) if released else ()))
        roles.append(
            RoleFit(role="actor", gpus=_actor_gpus(spec), memory=mem, capacity=gpu, verdict=_verdict(mem.total, gpu))
        )
    if serve:
        roles.append(_engine_role(spec, dims, gpu, tm))
    roles += [_host_role(spec, dims, tm)]
    return FitReport(gpu=_gpu_name(spec), gpu_bytes=gpu, roles=tuple(roles), dims=dims)


def _trainer(spec: Any, dims: Dims) -> Breakdown:
    ref = spec.model.ref_path is not None
    return trainer_memory(dims, trainer_layout(spec), reference=ref, critic=spec.algorithm.estimator == "ppo")


def _actor_gpus(spec: Any) -> int:
    return (spec.train.nodes or 1) * (spec.train.gpus_per_node or 0)


def _engine_role(spec: Any, dims: Dims, gpu: int, tm: Breakdown | None) -> RoleFit:
    colocated = spec.rollout.colocate and tm is not None
    beside = sum(tm.get(n) for n in _RESIDENT) if colocated else 0
    fit = engine_memory(dims, engine_layout(spec, gpu, beside))
    mem = fit.memory
    if colocated:
        mem = replace(mem, terms=mem.terms + (("trainer (resident)", beside),))
    name = "engine (rollout, beside the actor)" if colocated else "engine"
    return RoleFit(
        role=name, gpus=spec.rollout.gpus or 0, memory=mem, capacity=gpu, verdict=_engine_verdict(fit), engine=fit
    )


def _host_role(spec: Any, dims: Dims, tm: Breakdown | None) -> RoleFit:
    limit = host_limit(spec)
    offloaded = offloaded_optimizer(dims, trainer_layout(spec)) if tm is not None else 0
    mem = host_memory(spec, dims, tm, offloaded)
    if limit is None:
        return RoleFit(role="host RAM per node", gpus=0, memory=mem, capacity=0, verdict="ok")
    return RoleFit(role="host RAM per node", gpus=0, memory=mem, capacity=limit, verdict=_verdict(mem.total, limit))


def _gpu_name(spec: Any) -> str:
    g = spec.cluster.gpu
    return g.name or f"{g.memory_gb:g} GiB GPU"
