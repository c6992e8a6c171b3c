"""HF ↔ Megatron state-dict conversion: exact round trips, TP/PP sharding, and a real GPTModel.

The last test loads converted weights into megatron-core's GPTModel (local
spec + our SDPA attention) on CPU and compares its logits with the HF model's,
with TP=2 (two gloo processes). megatron-core needs CUDA for two
buffers and its RNG tracker; the worker (``__main__`` below) replaces exactly
those with CPU stand-ins — a fake at the CUDA boundary, which does not exist here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest
import torch

from slime.backends.megatron.config import ModelShape, padded_vocab_size
from slime.backends.megatron.convert import (
    ConversionError,
    gather_tp,
    hf_to_megatron,
    iter_hf_names,
    layer_offset,
    megatron_to_hf,
    merge_pp,
    rank_state_dict,
    shard_param,
    shard_tp,
    split_pp,
)
from tests.fixtures.ranks import end_group, last_json, spawn_ranks

HAS_MEGATRON = importlib.util.find_spec("megatron.core") is not None


def _hf_model(arch: str, *, tied: bool, layers: int = 4, head_dim: int | None = None):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=301,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
    )
    cfg = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common, head_dim=head_dim or 8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # HF inits norms to 1 and biases to 0: randomise so mix-ups are visible
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.normal_()
    return model


def _saved_form(model) -> dict[str, torch.Tensor]:
    sd = model.state_dict()
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


CASES = [("qwen2", False), ("qwen2", True), ("llama", False), ("llama", True)]


@pytest.mark.parametrize(("arch", "tied"), CASES)
@pytest.mark.parametrize("naming", ["local", "te"])
def test_round_trip_is_bit_identical(arch, tied, naming):
    model = _hf_model(arch, tied=tied)
    shape = ModelShape.from_hf_config(model.config)
    hf = _saved_form(model)
    assert sorted(iter_hf_names(shape)) == sorted(hf)
    mc = hf_to_megatron(model.state_dict(), shape, tp=2, naming=naming)
    assert mc["embedding.word_embeddings.weight"].shape[0] == padded_vocab_size(301, 2) == 512
    assert ("output_layer.weight" in mc) == (not tied)
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in mc) == (arch == "qwen2")
    norm_key = (
        "decoder.layers.0.input_layernorm.weight"
        if naming == "local"
        else "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"
    )
    assert norm_key in mc
    back = megatron_to_hf(mc, shape)
    assert sorted(back) == sorted(hf)
    for k in hf:
        assert back[k].dtype == hf[k].dtype and torch.equal(back[k], hf[k]), k


def test_qkv_layout_is_grouped_q_then_k_then_v():
    model = _hf_model("qwen2", tied=False, layers=1)
    shape = ModelShape.from_hf_config(model.config)  # 8 heads, 4 groups, head dim 8
    sd = model.state_dict()
    qkv = hf_to_megatron(sd, shape)["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (sd[f"model.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    d, hpg = 8, 2
    block = (hpg + 2) * d
    for g in range(4):
        rows = qkv[g * block : (g + 1) * block]
        assert torch.equal(rows[: hpg * d], q[g * hpg * d : (g + 1) * hpg * d])
        assert torch.equal(rows[hpg * d : hpg * d + d], k[g * d : (g + 1) * d])
        assert torch.equal(rows[hpg * d + d :], v[g * d : (g + 1) * d])


@pytest.mark.parametrize(("arch", "tied"), CASES)
def test_tp2_shard_gather_and_layouts(arch, tied):
    model = _hf_model(arch, tied=tied)
    shape = ModelShape.from_hf_config(model.config)
    full = hf_to_megatron(model.state_dict(), shape, tp=2)
    shards = shard_tp(full, 2)
    gathered = gather_tp(shards)
    assert sorted(gathered) == sorted(full)
    for k in full:
        assert torch.equal(gathered[k], full[k]), k
    sd = model.state_dict()
    gate, up = sd["model.layers.1.mlp.gate_proj.weight"], sd["model.layers.1.mlp.up_proj.weight"]
    fc1_r1 = shards[1]["decoder.layers.1.mlp.linear_fc1.weight"]
    assert torch.equal(fc1_r1, torch.cat([gate[48:], up[48:]]))  # rank 1 = second half of gate AND of up
    assert shards[0]["decoder.layers.1.self_attention.linear_proj.weight"].shape == (64, 32)  # row-parallel
    assert shards[1]["embedding.word_embeddings.weight"].shape == (256, 64)
    assert torch.equal(shards[0]["decoder.final_layernorm.weight"], shards[1]["decoder.final_layernorm.weight"])
    # a TP chunk of qkv holds whole query groups: rank 1 starts at group 2's queries
    qkv1 = shards[1]["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert torch.equal(qkv1[:16], sd["model.layers.0.self_attn.q_proj.weight"][32:48])


@pytest.mark.parametrize("tied", [False, True])
def test_pp2_split_merge_and_offsets(tied):
    model = _hf_model("llama", tied=tied)
    shape = ModelShape.from_hf_config(model.config)
    full = hf_to_megatron(model.state_dict(), shape)
    first, last = split_pp(full, shape, 2)
    assert "embedding.word_embeddings.weight" in first and "embedding.word_embeddings.weight" not in last
    assert "decoder.final_layernorm.weight" in last and "output_layer.weight" in last  # tied: its own copy
    assert {k.split(".")[2] for k in last if k.startswith("decoder.layers.")} == {"0", "1"}  # renumbered
    assert torch.equal(last["decoder.layers.0.mlp.linear_fc2.weight"], full["decoder.layers.2.mlp.linear_fc2.weight"])
    merged = merge_pp([first, last], shape)
    assert sorted(merged) == sorted(full) and all(torch.equal(merged[k], full[k]) for k in full)
    assert layer_offset(4, 2, 1) == 2
    with pytest.raises(ConversionError, match="not divisible by pipeline size 3"):
        layer_offset(4, 3, 0)
    # stage-local names convert back with the stage's offset
    hf_last = megatron_to_hf(
        {k: v for k, v in last.items() if k != "output_layer.weight" or not tied}, shape, layer_offset=2
    )
    assert torch.equal(
        hf_last["model.layers.3.self_attn.o_proj.weight"], model.state_dict()["model.layers.3.self_attn.o_proj.weight"]
    )


def test_rank_state_dict_matches_split_then_shard():
    model = _hf_model("qwen2", tied=False)
    shape = ModelShape.from_hf_config(model.config)
    sd = model.state_dict()
    r = rank_state_dict(sd, shape, tp=2, pp=2, tp_rank=1, pp_rank=1)
    stage = split_pp(hf_to_megatron(sd, shape, tp=2), shape, 2)[1]
    assert sorted(r) == sorted(stage)
    for k, v in stage.items():
        assert torch.equal(r[k], shard_param(k, v, 2, 1))


def test_bad_state_dicts_name_the_tensors():
    model = _hf_model("qwen2", tied=False, layers=2)
    shape = ModelShape.from_hf_config(model.config)
    sd = dict(model.state_dict())
    with pytest.raises(ConversionError, match="does not know: model.layers.0.self_attn.rotary.weight"):
        hf_to_megatron({**sd, "model.layers.0.self_attn.rotary.weight": torch.zeros(1)}, shape)
    missing = {k: v for k, v in sd.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ConversionError, match="lacks 'model.layers.1.mlp.up_proj.weight'"):
        hf_to_megatron(missing, shape)
    small = {**sd, "model.embed_tokens.weight": sd["model.embed_tokens.weight"][:100]}
    with pytest.raises(ConversionError, match="100 rows but config vocab_size is 301"):
        hf_to_megatron(small, shape)
    with pytest.raises(ConversionError, match="unknown megatron tensor"):
        megatron_to_hf({"decoder.layers.0.mystery.weight": torch.zeros(1)}, shape)


# ----------------------------------------------------------------------------- real GPTModel on CPU
def _run_workers(args: list[str], world: int, timeout: float = 240) -> list[dict]:
    outs = spawn_ranks([sys.executable, __file__, *args], world, env={"PYTHONWARNINGS": "ignore"}, timeout=timeout)
    return [last_json(out) for out in outs]


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (optional extra 'megatron')")
def test_converted_weights_load_into_gptmodel_and_match_hf_logits(tmp_path):
    """Qwen2 (qkv biases, tied embeddings) at TP=2; Llama runs through the backend test at TP/PP/DP=2."""
    model = _hf_model("qwen2", tied=True, layers=2)
    model.save_pretrained(tmp_path)
    results = _run_workers([str(tmp_path)], world=2)
    for r in results:
        assert r["missing"] == [] and r["unexpected"] == []
        assert r["max_abs_diff"] < 1e-4, r


def _worker(model_dir: str) -> None:
    import contextlib
    import warnings

    warnings.filterwarnings("ignore")
    torch.cuda.current_device = lambda: "cpu"  # megatron places rotary buffers there
    import megatron.core.tensor_parallel as mtp
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from transformers import AutoModelForCausalLM

    from slime.backends.megatron.attention import layer_spec
    from slime.backends.megatron.config import gpt_model_kwargs, transformer_config_kwargs
    from slime.backends.megatron.transformer_config import build_transformer_config

    class _NoRng:  # the model-parallel CUDA RNG tracker (only forked around dropout)
        def fork(self, *a, **k):
            return contextlib.nullcontext()

    mtp.get_cuda_rng_tracker = lambda *a, **k: _NoRng()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    shape = ModelShape.from_hf_config(hf.config)
    cfg = build_transformer_config(
        transformer_config_kwargs(
            shape, tp=world, precision="fp32", attention_backend="sdpa", overrides={"use_cpu_initialization": True}
        )
    )
    gpt = GPTModel(config=cfg, transformer_layer_spec=layer_spec("sdpa"), **gpt_model_kwargs(shape, tp=world))
    result = gpt.load_state_dict(rank_state_dict(hf.state_dict(), shape, tp=world, tp_rank=rank), strict=False)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab_size, (3, 17), generator=gen)
    pos = torch.arange(17).unsqueeze(0).expand(3, 17)
    gpt.eval()
    with torch.no_grad():
        local = gpt(ids, pos, None).contiguous()  # [b, s, V_padded / tp]
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local)
        logits = torch.cat(parts, dim=-1)[..., : shape.vocab_size]
        diff = (logits - hf(ids).logits).abs().max().item()
    print(
        json.dumps(
            {
                "missing": [k for k in result.missing_keys if not k.endswith("_extra_state")],
                "unexpected": list(result.unexpected_keys),
                "max_abs_diff": diff,
            }
        )
    )
    end_group()


if __name__ == "__main__":
    _worker(sys.argv[1])
