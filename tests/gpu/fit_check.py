"""The fit estimate (``slime.fit``) against ``torch.cuda.max_memory_allocated`` of real Megatron steps.

Small Megatron configs on ONE GPU (dense with and without full recompute and the distributed optimizer,
a Qwen3-MoE and a DeepSeek-V3 (MLA) model): each case builds a random HF checkpoint, starts the
megatron backend in a process of its own, runs two training steps on one micro-batch of the spec's
length and reports the peak allocation next to the estimate of the same spec (less the CUDA-context
allowance, which the caching allocator does not see). Skipped without CUDA or megatron-core.
Run: ``pytest tests/gpu/fit_check.py -s`` (prints one line per case: measured, estimated, ratio).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.fixtures.ranks import last_json, spawn_ranks  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]
# the estimate may be above the measurement (it is a bound) but not far, and never well below it
LOW, HIGH = 0.6, 1.1

_DENSE = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
_MOE = {
    **_DENSE,
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 512,
    "head_dim": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
}
_MLA = {
    **_DENSE,
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 256,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "n_routed_experts": 16,
    "n_shared_experts": 1,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 384,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
}
CASES = {
    "dense": (_DENSE, {}, True),
    "dense-full-recompute": (_DENSE, {"recompute-granularity": "full", "recompute-method": "uniform"}, True),
    "dense-no-distributed-optimizer": (_DENSE, {}, False),
    "moe": (_MOE, {}, True),
    "mla": (_MLA, {}, True),
}


def _checkpoint(config: dict, out: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = {k: v for k, v in config.items() if k not in ("architectures", "model_type")}
    cfg = AutoConfig.for_model(config["model_type"], **kwargs)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16).save_pretrained(out)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_peak_allocation_is_within_the_estimate(case, tmp_path):
    config, args, distributed = CASES[case]
    model = _checkpoint(config, tmp_path / "model")
    payload = {"model_dir": str(model), "out": str(tmp_path), "args": args, "distributed": distributed}

    def argv(rank: int, port: int) -> list[str]:
        return [sys.executable, __file__, json.dumps({**payload, "port": port}), str(rank)]

    (stdout,) = spawn_ranks(argv, 1, env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=600)
    r = last_json(stdout)
    ratio = r["measured"] / r["estimated"]
    print(
        f"# {case}: measured {r['measured'] / 2**30:.3f} GiB, estimated {r['estimated'] / 2**30:.3f} GiB, "
        f"ratio {ratio:.2f}; terms {r['terms']}"
    )
    assert LOW <= ratio <= HIGH, r


# ----------------------------------------------------------------------------- worker
MICRO_BATCH, PROMPT, RESPONSE = 4, 256, 768


def _spec(p: dict):
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "fit-check",
        "cluster": {"launcher": "local", "gpus_per_node": 1},
        "model": {"path": p["model_dir"]},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 1, "max_prompt_len": PROMPT, "max_response_len": RESPONSE},
        "train": {
            "backend": "megatron",
            "micro_batch_size": MICRO_BATCH,
            "global_batch_size": MICRO_BATCH,
            "precision": "bf16",
            "optimizer": {"distributed": p["distributed"]},
            "megatron": {"args": p["args"]},
        },
    }
    return resolve(msgspec.convert(data, Spec), Path(p["out"]))


def _estimate(spec) -> tuple[int, dict]:
    from slime.fit.model import dims_from_config
    from slime.fit.plan import trainer_layout
    from slime.fit.trainer import CUDA_CONTEXT, trainer_memory
    from slime.spec.resolve import model_config

    m = trainer_memory(dims_from_config(model_config(spec.model.path)), trainer_layout(spec))
    return m.total - CUDA_CONTEXT, {n: round(b / 2**20, 1) for n, b in m.terms}


def _worker(p: dict, rank: int) -> None:
    from slime.backends.base import RankInfo, TrainBatch
    from slime.backends.megatron.backend import MegatronTrainBackend

    spec = _spec(p)
    b = MegatronTrainBackend()
    info = RankInfo(rank=rank, world_size=1, master_addr="127.0.0.1", master_port=p["port"], device="cuda:0")
    b.init(spec, info, Path(p["model_dir"]), role="actor")
    B, T = MICRO_BATCH, PROMPT + RESPONSE
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, _DENSE["vocab_size"], (B, T), generator=g)  # every case's vocabulary
    rm = torch.ones(B, T - 1)
    rm[:, :PROMPT] = 0
    batch = TrainBatch(
        tokens=tokens,
        attention_mask=torch.ones(B, T, dtype=torch.long),
        response_mask=rm,
        advantages=torch.ones(B, T - 1),
        old_log_probs=torch.zeros(B, T - 1),
    )
    for step in range(2):  # the second step runs with the optimizer state already allocated
        b.train_step(batch, step=step)
    torch.cuda.synchronize()
    estimated, terms = _estimate(spec)
    torch.distributed.destroy_process_group()
    print(json.dumps({"measured": torch.cuda.max_memory_allocated(), "estimated": estimated, "terms": terms}))


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
