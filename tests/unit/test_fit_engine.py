"""The SGLang engine's estimate: SGLang's default fraction, the KV pool, MLA's latent cache, colocation."""

from __future__ import annotations

from slime.fit.breakdown import GIB
from slime.fit.engine import EngineLayout, default_mem_fraction, engine_memory, kv_bytes_per_token
from slime.fit.model import dims_from_config
from slime.fit.trainer import CUDA_CONTEXT
from tests.fixtures.fit_configs import KIMI_K2, QWEN25_7B

QWEN7B = dims_from_config(QWEN25_7B)


def test_sglang_default_fraction_on_an_h100_by_hand():
    # SGLang 0.5.23 _handle_gpu_memory_settings: 512 + 1.5 x chunked-prefill 8192 + 2 x cuda-graph bs 256 + tp/8 GiB
    e = EngineLayout(tp=2, gpu_bytes=80 * GIB)
    reserved = 512 + 8192 * 1.5 + 256 * 2 + 2 / 8 * 1024
    assert default_mem_fraction(e) == round((80 * 1024 - reserved) / (80 * 1024), 3) == 0.834
    small = EngineLayout(tp=1, gpu_bytes=24 * GIB)  # a 24 GiB card: chunk 2048, graph bs 24
    assert default_mem_fraction(small) == round((24 * 1024 - (512 + 2048 * 1.5 + 48 + 128)) / (24 * 1024), 3)


def test_kv_pool_and_tokens_by_hand():
    e = EngineLayout(tp=2, gpu_bytes=80 * GIB, mem_fraction=0.7, concurrent=32, request_tokens=9216)
    fit = engine_memory(QWEN7B, e)
    weights = 7_615_616_512  # 2 bytes x 7.6B parameters / tp 2
    kv = int(0.7 * (80 * GIB - CUDA_CONTEXT)) - weights
    per_token = 2 * 28 * (4 // 2) * 128 * 2  # K and V, 28 layers, 2 kv heads per rank, bf16
    assert kv_bytes_per_token(QWEN7B, 2) == per_token
    assert fit.memory.get("weights") == weights and fit.memory.get("kv pool") == kv
    assert fit.kv_tokens == kv // per_token and fit.demand_tokens == 32 * 9216
    assert fit.concurrent_fit == kv // per_token // 9216


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    assert kv_bytes_per_token(QWEN7B, 8) == kv_bytes_per_token(QWEN7B, 4) == 2 * 28 * 1 * 128 * 2


def test_mla_caches_the_latent_and_rope_key_once_per_token():
    d = dims_from_config(KIMI_K2)
    assert kv_bytes_per_token(d, 8) == kv_bytes_per_token(d, 1) == 61 * (512 + 64) * 2


def test_a_colocated_trainer_shrinks_the_pool():
    alone = engine_memory(QWEN7B, EngineLayout(tp=2, gpu_bytes=80 * GIB, mem_fraction=0.7))
    beside = engine_memory(QWEN7B, EngineLayout(tp=2, gpu_bytes=80 * GIB, mem_fraction=0.7, beside=30 * GIB))
    # SGLang sizes the pool from the memory free when it starts: fraction x (free) - weights
    assert alone.memory.get("kv pool") - beside.memory.get("kv pool") == int(0.7 * (80 * GIB - CUDA_CONTEXT)) - int(
        0.7 * (50 * GIB - CUDA_CONTEXT)
    )
    crowded = engine_memory(QWEN7B, EngineLayout(tp=2, gpu_bytes=80 * GIB, mem_fraction=0.7, beside=70 * GIB))
    assert crowded.kv_tokens == 0
