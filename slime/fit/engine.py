"""Memory of one SGLang engine GPU: its weights per tensor-parallel rank and the KV pool the rest leaves.

SGLang takes ``mem-fraction-static`` x the memory free when it starts for weights plus the KV pool (so
a colocated trainer's resident state, loaded beside it, shrinks the pool). Without
the flag, :func:`default_mem_fraction` follows SGLang 0.5.23's ``ServerArgs._handle_gpu_memory_settings``
(reserve = 512 MiB + 1.5 MiB per chunked-prefill token + 2 MiB per CUDA-graph batch + tp/8 GiB, at
least 10 GiB on cards over 60 GiB), with its per-card defaults of the chunk and the graph batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.fit.breakdown import Breakdown
from slime.fit.model import Dims
from slime.fit.trainer import CUDA_CONTEXT

__all__ = ["EngineFit", "EngineLayout", "default_mem_fraction", "engine_memory", "kv_bytes_per_token"]

MIB = 1 << 20


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineLayout:
    """What the estimate needs of the spec's rollout section (``slime.fit.plan`` builds it)."""

    tp: int
    gpu_bytes: int
    mem_fraction: float | None = None  # rollout.sglang.args mem-fraction-static; None: SGLang's default
    chunked_prefill: int | None = None
    cuda_graph_max_bs: int | None = None
    concurrent: int = 1  # samples a rollout sends this engine at once
    request_tokens: int = 1  # prompt + response of one sample
    beside: int = 0  # bytes other processes hold on the GPU while the engine runs (a colocated trainer)


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineFit:
    """The engine's breakdown, its KV capacity in tokens and what one rollout asks of it."""

    memory: Breakdown
    mem_fraction: float
    kv_tokens: int
    demand_tokens: int
    request_tokens: int
    reserve: int = 0  # what SGLang's default would leave for activations and CUDA graphs

    @property
    def concurrent_fit(self) -> int:
        """Samples that can decode at once at full length."""
        return max(0, self.kv_tokens // max(1, self.request_tokens))


def kv_bytes_per_token(d: Dims, tp: int) -> int:
    """bf16 K and V of every layer for one token on one TP rank (MLA keeps the latent, replicated)."""
    if d.mla:
        return d.layers * (d.kv_lora_rank + d.rope_dim) * 2
    return 2 * d.layers * max(1, d.kv_heads // tp) * d.head_dim * 2


def _defaults(gpu_gib: float, e: EngineLayout) -> tuple[int, int]:
    chunk = e.chunked_prefill or (2048 if gpu_gib < 35 else 4096 if gpu_gib < 60 else 8192)
    return chunk, e.cuda_graph_max_bs or (24 if gpu_gib < 35 else 256)


def _reserve_mib(e: EngineLayout) -> float:
    """SGLang's allowance for prefill activations, CUDA graphs and parallel buffers (MiB)."""
    chunk, max_bs = _defaults(e.gpu_bytes / MIB / 1024, e)
    return 512 + max(chunk, 2048) * 1.5 + max_bs * 2 + e.tp / 8 * 1024


def default_mem_fraction(e: EngineLayout) -> float:
    gpu_mib = e.gpu_bytes / MIB
    reserved = _reserve_mib(e)
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def engine_memory(d: Dims, e: EngineLayout) -> EngineFit:
    """SGLang's pool: fraction x (memory free when it starts) - weights (``profile_max_num_token``)."""
    frac = e.mem_fraction if e.mem_fraction is not None else default_mem_fraction(e)
    weights = int(2 * d.total_params() / e.tp)
    free = e.gpu_bytes - e.beside - CUDA_CONTEXT
    kv = max(0, int(frac * free) - weights)
    working = max(0, free - weights - kv)  # what the fraction leaves for activations and CUDA graphs
    terms = (("weights", weights), ("kv pool", kv), ("working", working), ("cuda context", CUDA_CONTEXT))
    notes = (f"mem-fraction-static {frac:g}" + ("" if e.mem_fraction is not None else " (SGLang's default)"),)
    kvb = kv_bytes_per_token(d, e.tp)
    return EngineFit(
        memory=Breakdown(terms=terms, notes=notes),
        mem_fraction=frac,
        kv_tokens=kv // kvb,
        reserve=int(_reserve_mib(e) * MIB),
        demand_tokens=e.concurrent * e.request_tokens,
        request_tokens=e.request_tokens,
    )
