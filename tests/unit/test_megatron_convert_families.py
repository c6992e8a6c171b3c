"""HF ↔ Megatron conversion for Qwen3, Qwen3-MoE, Qwen2-MoE and DeepSeek-V3 (MLA + MoE): exact round trips
with TP, PP and EP sharding, on tiny random checkpoints built with transformers' own classes.

Torch only (no megatron-core): the forward comparison against the HF models runs through the real backend
in ``test_megatron_moe_cpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from slime.backends.megatron.config import ModelShape
from slime.backends.megatron.convert import (
    ConversionError,
    gather_ep,
    gather_tp,
    hf_to_megatron,
    iter_hf_names,
    megatron_to_hf,
    merge_pp,
    rank_state_dict,
    shard_ep,
    shard_param,
    shard_tp,
    split_pp,
)
from slime.backends.megatron.hf_io import read_tensors
from tests.fixtures.tiny_families import FAMILIES, MOE_FAMILIES, build


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    out = {}
    for family in FAMILIES:
        model = build(family, root / family)
        out[family] = (model, read_tensors(root / family), ModelShape.from_hf_config(model.config))
    return out


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b), set(a) ^ set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_bit_identical(checkpoints, family):
    model, saved, shape = checkpoints[family]
    assert sorted(saved) == sorted(iter_hf_names(shape))  # the checkpoint is exactly what we expect to read
    full = hf_to_megatron(saved, shape)
    _equal(megatron_to_hf(full, shape), saved)
    # transformers 5 keeps experts fused in memory; the same megatron tensors come out of either form
    _equal(hf_to_megatron(model.state_dict(), shape), full)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_names_and_layouts(checkpoints, family):
    _, saved, shape = checkpoints[family]
    full = hf_to_megatron(saved, shape)
    layer = next(i for i in range(shape.num_layers) if shape.is_moe_layer(i))
    p, m = f"model.layers.{layer}.mlp.", f"decoder.layers.{layer}.mlp."
    assert torch.equal(full[m + "router.weight"], saved[p + "gate.weight"])
    fc1 = full[m + "experts.local_experts.3.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([saved[p + "experts.3.gate_proj.weight"], saved[p + "experts.3.up_proj.weight"]]))
    assert torch.equal(full[m + "experts.local_experts.3.linear_fc2.weight"], saved[p + "experts.3.down_proj.weight"])
    e = shape.moe
    if e.expert_bias:
        assert torch.equal(full[m + "router.expert_bias"], saved[p + "gate.e_score_correction_bias"])
    if e.shared_ffn_hidden_size:
        shared = f"{p}{e.shared_prefix}."
        assert torch.equal(full[m + "shared_experts.linear_fc2.weight"], saved[shared + "down_proj.weight"])
    if e.shared_gate:
        assert torch.equal(full[m + "shared_experts.gate_weight"], saved[p + "shared_expert_gate.weight"])
    if family == "deepseek_v3":  # layer 0 is dense (first_k_dense_replace=1)
        assert "decoder.layers.0.mlp.linear_fc1.weight" in full and "decoder.layers.0.mlp.router.weight" not in full


def test_mla_and_qk_norm_names(checkpoints):
    _, saved, shape = checkpoints["deepseek_v3"]
    full = hf_to_megatron(saved, shape)
    a, m = "model.layers.1.self_attn.", "decoder.layers.1.self_attention."
    for mc, hf in (
        ("linear_q_down_proj", "q_a_proj"),
        ("linear_q_up_proj", "q_b_proj"),
        ("linear_kv_down_proj", "kv_a_proj_with_mqa"),
        ("linear_kv_up_proj", "kv_b_proj"),
        ("q_layernorm", "q_a_layernorm"),
        ("kv_layernorm", "kv_a_layernorm"),
        ("linear_proj", "o_proj"),
    ):
        assert torch.equal(full[f"{m}{mc}.weight"], saved[f"{a}{hf}.weight"]), mc
    _, saved, shape = checkpoints["deepseek_v3_noqlora"]
    assert torch.equal(hf_to_megatron(saved, shape)[m + "linear_q_proj.weight"], saved[a + "q_proj.weight"])
    _, saved, shape = checkpoints["qwen3"]
    full = hf_to_megatron(saved, shape)
    assert torch.equal(full[m + "q_layernorm.weight"], saved[a + "q_norm.weight"])
    assert torch.equal(full[m + "k_layernorm.weight"], saved[a + "k_norm.weight"])


@pytest.mark.parametrize("family", FAMILIES)
def test_tp2_pp2_ep2_shard_and_gather_round_trip(checkpoints, family):
    _, saved, shape = checkpoints[family]
    full = hf_to_megatron(saved, shape, tp=2)
    ep = 2 if shape.moe else 1
    stages = split_pp(full, shape, 2)
    rebuilt = []
    for stage in stages:
        ep_shards = [shard_ep(stage, shape, ep, r) for r in range(ep)]
        # TP 2 with expert-tensor 1: experts whole on every TP rank; attention / dense MLP split
        tp_shards = [shard_tp(s, 2, etp=1) for s in ep_shards]
        rebuilt.append(gather_ep([gather_tp(t, etp=1) for t in tp_shards], shape))
    _equal(megatron_to_hf(merge_pp(rebuilt, shape), shape), saved)
    # and expert-tensor 2: expert fc1 holds [gate_r; up_r] like a dense fc1
    if shape.moe:
        name = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
        shards = shard_tp(full, 2, etp=2)
        gate, up = torch.chunk(full[name], 2)
        assert torch.equal(shards[1][name], torch.cat([torch.chunk(gate, 2)[1], torch.chunk(up, 2)[1]]))
        assert torch.equal(gather_tp(shards, etp=2)[name], full[name])


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_expert_parallel_rank_holds_its_experts_renumbered(checkpoints, family):
    _, saved, shape = checkpoints[family]
    full = hf_to_megatron(saved, shape)
    r1 = shard_ep(full, shape, 2, 1)
    name = "decoder.layers.1.mlp.experts.local_experts.{}.linear_fc2.weight"
    assert torch.equal(r1[name.format(0)], full[name.format(2)]) and torch.equal(
        r1[name.format(1)], full[name.format(3)]
    )
    assert name.format(2) not in r1 and torch.equal(
        r1["decoder.layers.1.mlp.router.weight"], full["decoder.layers.1.mlp.router.weight"]
    )
    rank = rank_state_dict(saved, shape, tp=2, ep=2, etp=1, tp_rank=1, ep_rank=1)
    assert torch.equal(rank[name.format(1)], full[name.format(3)])  # experts are not split with expert-tensor 1
    qkv = "decoder.layers.1.self_attention." + ("linear_q_up_proj.weight" if shape.mla else "linear_qkv.weight")
    assert torch.equal(rank[qkv], shard_param(qkv, full[qkv], 2, 1))
    with pytest.raises(ConversionError, match="4 experts are not divisible by expert parallel 3"):
        shard_ep(full, shape, 3, 0)


def test_unknown_expert_tensors_are_named(checkpoints):
    _, saved, shape = checkpoints["qwen3_moe"]
    extra = {**saved, "model.layers.0.mlp.experts.4.up_proj.weight": torch.zeros(1)}
    with pytest.raises(ConversionError, match="does not know: model.layers.0.mlp.experts.4.up_proj.weight"):
        hf_to_megatron(extra, shape)
    missing = {k: v for k, v in saved.items() if k != "model.layers.1.mlp.experts.2.down_proj.weight"}
    with pytest.raises(ConversionError, match="lacks 'model.layers.1.mlp.experts.2.down_proj.weight'"):
        hf_to_megatron(missing, shape)
