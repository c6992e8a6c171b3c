"""From the spec to the estimate's inputs (tokens per micro-batch, micro-batches in flight, recompute,
SGLang flags) and the roles of a layout: colocated or not, and a node's RAM against the launcher's mem."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime.fit import estimate
from slime.fit.host import parse_mem
from slime.fit.plan import engine_layout, trainer_layout
from tests.fixtures.fit_configs import QWEN25_7B, write_model
from tests.fixtures.spec_helpers import GPU_SPEC, load, problems, spec

H100 = {"cluster.gpu": {"name": "H100-80GB"}}


@pytest.fixture
def qwen7b(tmp_path: Path) -> str:
    return str(write_model(tmp_path, "q7", QWEN25_7B))


def test_static_micro_batches_dynamic_budgets_context_parallel_and_pipeline(qwen7b):
    base = {"model.path": qwen7b, "rollout.max_prompt_len": 1024, "rollout.max_response_len": 3072}
    lay = trainer_layout(load(spec(GPU_SPEC, **base, **{"train.micro_batch_size": 2})).spec)
    assert (lay.tokens, lay.seq_len, lay.dp, lay.in_flight) == (2 * 4096, 4096, 8, 1)
    dynamic = {"train.dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 16384}, "train.parallel.context": 2}
    lay = trainer_layout(load(spec(GPU_SPEC, **base, **dynamic)).spec)
    assert (lay.tokens, lay.cp, lay.dp) == (16384, 2, 4)
    piped = {"train.parallel.pipeline": 2, "train.parallel.tensor": 1, "rollout.weight_sync": "disk"}
    lay = trainer_layout(load(spec(GPU_SPEC, **base, **piped)).spec)
    assert (lay.pp, lay.dp, lay.in_flight) == (2, 8, 2)  # 256 samples / (8 x 1) = 32 micro-batches >= 2 stages
    args = {"train.megatron": {"args": {"recompute_granularity": "full", "attention-backend": "unfused"}}}
    lay = trainer_layout(load(spec(GPU_SPEC, **base, **args)).spec)
    assert lay.recompute == "full" and lay.attention_scores


def test_engine_flags_and_the_samples_each_engine_gets(qwen7b):
    flags = {"rollout.sglang": {"args": {"mem-fraction-static": 0.6, "chunked-prefill-size": 4096}}}
    s = load(spec(GPU_SPEC, **{"model.path": qwen7b}, **flags)).spec
    e = engine_layout(s, 80 << 30)
    # 32 prompts x 8 samples over 16 GPUs / 2 per engine = 8 engines
    assert (e.tp, e.mem_fraction, e.chunked_prefill, e.concurrent, e.request_tokens) == (2, 0.6, 4096, 32, 1536)


def test_colocated_roles_share_the_gpus_and_disaggregated_ones_do_not(qwen7b):
    colocated = estimate(load(spec(GPU_SPEC, **{"model.path": qwen7b}, **H100)).spec)
    actor, engine, host = colocated.roles
    assert actor.memory.get("engine (released)") > 0 and engine.memory.get("trainer (resident)") > 0
    apart = {"rollout.colocate": False, "train.gpus_per_node": 4, "rollout.gpus": 8, "train.global_batch_size": 64}
    actor, engine, _ = estimate(load(spec(GPU_SPEC, **{"model.path": qwen7b}, **H100, **apart)).spec).roles
    assert actor.memory.get("engine (released)") == 0 and engine.memory.get("trainer (resident)") == 0
    assert (actor.gpus, engine.gpus, host.gpus) == (8, 8, 0)


def test_host_ram_over_the_launchers_mem_is_refused(qwen7b):
    assert parse_mem("900G") == 900 << 30 and parse_mem("2048") == 2 << 30 and parse_mem("1T") == 1 << 40
    found = problems(spec(GPU_SPEC, **{"model.path": qwen7b, "cluster.slurm.mem": "32G"}, **H100))
    [p] = [p for p in found if p.path == "cluster"]
    assert "a node's host RAM peaks at" in p.message and "asks for 32.0 GiB" in p.message
