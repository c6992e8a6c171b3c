"""The trainer's estimate against hand-computed numbers (dense, MoE with expert parallel, MLA) and
against Megatron-LM's own accounting (``megatron/training/theoretical_memory_usage.py``:
``compute_weight_and_optimizer_memory`` and ``compute_activation_memory``), re-derived here from its text."""

from __future__ import annotations

import math

import pytest

from slime.backends.megatron.model_check import ModelShape
from slime.fit.breakdown import GIB
from slime.fit.model import dims_from_config
from slime.fit.trainer import CUDA_CONTEXT, TrainerLayout, layer_activations, stage_layers, trainer_memory
from tests.fixtures.fit_configs import KIMI_K2, MOONLIGHT_16B, QWEN3_30B_A3B, QWEN25_0P5B, QWEN25_1P5B, QWEN25_7B

QWEN7B = dims_from_config(QWEN25_7B)


@pytest.mark.parametrize("cfg", [QWEN25_0P5B, QWEN25_1P5B, QWEN25_7B, QWEN3_30B_A3B, MOONLIGHT_16B, KIMI_K2])
def test_parameters_agree_with_the_megatron_backend_shape(cfg):
    assert dims_from_config(cfg).total_params() == ModelShape.from_hf_config(cfg).num_params()


def test_qwen25_7b_tp2_distributed_optimizer_full_recompute_by_hand():
    # Qwen2.5-7B: h 3584, 28 layers, 28 heads / 4 kv heads of 128, ffn 18944, vocab 152064 (untied), q/k/v bias
    qkv = (28 + 2 * 4) * 128
    layer = 3584 * qkv + 3584 * 3584 + qkv + 2 * 3584 + 3 * 3584 * 18944
    assert layer == 233_057_792
    per_rank = (28 * layer + 2 * 152064 * 3584) / 2 + 3584  # tp 2; both embeddings on the one stage
    lay = TrainerLayout(tp=2, dp=8, tokens=9216, seq_len=9216, recompute="full", distributed_optimizer=True)
    m = trainer_memory(QWEN7B, lay)
    assert m.get("weights") == int(2 * per_rank) and m.get("gradients") == int(4 * per_rank)
    assert m.get("optimizer") == int(12 * per_rank / 8)
    sbh = 9216 * 3584
    one_layer = sbh * (10 + (8 + 4 * 18944 / 3584) / 2)  # tp 2 without sequence parallel
    assert m.get("activations") == pytest.approx(28 * 2 * sbh + one_layer, abs=2)
    assert m.get("logits") == 2 * 9216 * (152064 // 2) * 4
    assert m.get("cuda context") == CUDA_CONTEXT and m.get("reference") == 0


def test_without_the_distributed_optimizer_every_rank_keeps_all_12_bytes():
    on = trainer_memory(QWEN7B, TrainerLayout(tp=2, dp=8, distributed_optimizer=True))
    off = trainer_memory(QWEN7B, TrainerLayout(tp=2, dp=8, distributed_optimizer=False))
    assert off.get("optimizer") == pytest.approx(8 * on.get("optimizer"), abs=8)
    assert off.get("weights") == on.get("weights")


def test_optimizer_offload_moves_the_optimizer_state_to_the_host():
    from slime.fit.plan import trainer_layout
    from slime.fit.trainer import offloaded_optimizer
    from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

    lay = TrainerLayout(tp=2, dp=8, distributed_optimizer=True)
    on_gpu = trainer_memory(QWEN7B, lay).get("optimizer")
    for fraction in (0.25, 1.0):
        moved = TrainerLayout(tp=2, dp=8, distributed_optimizer=True, optimizer_offload=fraction)
        assert trainer_memory(QWEN7B, moved).get("optimizer") == pytest.approx((1 - fraction) * on_gpu, abs=1)
        assert offloaded_optimizer(QWEN7B, moved) == pytest.approx(fraction * on_gpu, abs=1)
    assert offloaded_optimizer(QWEN7B, lay) == 0
    offload = load(spec(GPU_SPEC, **{"train.megatron": {"optimizer_offload": 0.5}})).spec
    assert (
        trainer_layout(offload).optimizer_offload == 0.5 and trainer_layout(load(GPU_SPEC).spec).optimizer_offload == 0
    )


def test_recompute_full_keeps_layer_inputs_and_selective_drops_the_score_term():
    base = dict(tp=2, dp=8, tokens=8192, seq_len=8192, sequence_parallel=True, attention_scores=True)
    none = trainer_memory(QWEN7B, TrainerLayout(**base)).get("activations")
    selective = trainer_memory(QWEN7B, TrainerLayout(**base, recompute="selective")).get("activations")
    full = trainer_memory(QWEN7B, TrainerLayout(**base, recompute="full")).get("activations")
    sbh, a_s_h = 8192 * 3584, 5 * 28 * 8192 / 3584
    per_layer = sbh * (18 + 4 * 18944 / 3584 + a_s_h) / 2  # Korthikanti Table 2, tensor + sequence parallel
    assert none == pytest.approx(28 * per_layer, abs=2)
    assert selective == pytest.approx(28 * sbh * (18 + 4 * 18944 / 3584) / 2, abs=2)
    assert full == pytest.approx(28 * 2 * sbh / 2 + per_layer, abs=2)
    assert full < selective < none


def test_context_parallel_divides_the_tokens_of_a_gpu():
    lay = TrainerLayout(tp=1, cp=1, tokens=8192, seq_len=8192)
    cp2 = TrainerLayout(tp=1, cp=2, tokens=4096, seq_len=8192)
    assert layer_activations(QWEN7B, cp2, False) == layer_activations(QWEN7B, lay, False) / 2


def test_qwen3_moe_with_expert_parallel_by_hand():
    d = dims_from_config(QWEN3_30B_A3B)
    # per layer outside the experts: q/k/v/o (32 heads, 4 kv heads of 128), q/k norms, 2 norms, router
    attn = 2048 * (32 + 8) * 128 + 32 * 128 * 2048 + 2 * 128
    dense_layer = attn + 2 * 2048 + 128 * 2048
    experts_layer = 128 * 3 * 2048 * 768
    lay = TrainerLayout(tp=1, ep=8, etp=1, dp=16, distributed_optimizer=True)  # 16 GPUs: expert dp = 16 / 8
    m = trainer_memory(d, lay)
    dense = 48 * dense_layer + 2 * 151936 * 2048 + 2048
    experts = 48 * experts_layer / 8
    assert m.get("weights") == int(2 * (dense + experts))
    assert m.get("optimizer") == int(12 * (dense / 16 + experts / 2))
    routed = TrainerLayout(tp=1, ep=8, etp=1, dp=16, tokens=4096, seq_len=4096)
    assert layer_activations(d, routed, True) == 4096 * 2048 * (18 + 4 * (8 * 768) / 2048)


def test_mla_stages_put_the_dense_layer_and_embedding_first():
    d = dims_from_config(MOONLIGHT_16B)
    assert d.mla and d.moe_layers == 26 and not d.is_moe(0)
    assert list(stage_layers(27, 4, 0)) == [0, 1, 2, 3, 4, 5, 6] and len(stage_layers(27, 4, 3)) == 6
    m = trainer_memory(d, TrainerLayout(tp=1, pp=4, ep=4, dp=4, distributed_optimizer=True))
    assert m.notes == ("pipeline stage 0 of 4",) or m.notes == ("pipeline stage 3 of 4",)
    # MLA attention as Megatron-LM counts it (q without LoRA, kv LoRA with its norm, rope key, o proj)
    n, h = 16, 2048
    mla = h * n * (128 + 64) + 512 * (h + n * (128 + 128) + 1) + h * 64 + n * 128 * h
    assert d.attn_params == mla


def _megatron_weight_and_optimizer(cfg: dict, *, tp: int, pp: int, dp: int, distributed: bool) -> float:
    """``compute_weight_and_optimizer_memory`` for a dense GQA SwiGLU model, re-derived from its text."""
    h, L, a, g = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    kv_channels = h // a
    attn = 2 * h * h * ((1 + g / a) * (kv_channels * a / h))
    layer = 2 * h * (cfg["intermediate_size"] * 3 / 2 + 1) + attn  # RMSNorm: one weight per norm
    vocab = math.ceil(cfg["vocab_size"] / (128 * tp)) * 128 * tp
    block = layer * L + h
    most_loaded = (block / pp + h * vocab) / tp
    if not cfg["tie_word_embeddings"] and pp == 1:
        most_loaded += h * vocab / tp
    return most_loaded * (18 if not distributed else 6 + 12 / dp)


@pytest.mark.parametrize(("tp", "dp", "distributed"), [(1, 8, True), (2, 8, True), (4, 2, False)])
def test_weights_and_optimizer_agree_with_megatron_lm(tp, dp, distributed):
    ours = trainer_memory(QWEN7B, TrainerLayout(tp=tp, dp=dp, distributed_optimizer=distributed))
    state = ours.get("weights") + ours.get("gradients") + ours.get("optimizer")
    theirs = _megatron_weight_and_optimizer(QWEN25_7B, tp=tp, pp=1, dp=dp, distributed=distributed)
    # Megatron leaves out the q/k/v bias and divides no norm by tp: a few MB on 7B
    assert state == pytest.approx(theirs, rel=2e-3)


def test_activations_agree_with_megatron_lm_under_sequence_parallel_and_selective_recompute():
    # compute_activation_memory: s*b*h*(18 + 4*ffn/h) per layer, x layers, / tp (pp 1, no embedding terms)
    s, b, h, f = 4096, 2, 3584, 18944
    theirs = s * b * h * (18 + 4 * f / h) * 28 / 2
    lay = TrainerLayout(tp=2, dp=8, tokens=s * b, seq_len=s, sequence_parallel=True, recompute="selective")
    assert trainer_memory(QWEN7B, lay).get("activations") == pytest.approx(theirs, rel=1e-9)


def test_reference_and_critic_models_are_held_on_the_actor_gpus():
    lay = TrainerLayout(tp=2, dp=8)
    plain = trainer_memory(QWEN7B, lay)
    both = trainer_memory(QWEN7B, lay, reference=True, critic=True)
    assert both.get("reference") == plain.get("weights")
    assert both.get("critic") == plain.get("weights") + plain.get("gradients") + plain.get("optimizer")
    assert both.total - plain.total == both.get("reference") + both.get("critic")
    assert plain.total < 80 * GIB


def _megatron_moe_weight_and_optimizer(cfg: dict, *, dp: int) -> float:
    """The same function for a MoE model at tp = pp = 1: every expert counted on every rank (it has no
    expert-parallel term), gated MLPs as 3/2 x 2h x ffn, one norm weight per RMSNorm."""
    h, L, a, g = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    q = cfg["head_dim"] * a
    attn = 2 * h * h * ((1 + g / a) * (q / h))
    moe_layer = 2 * h * (cfg["moe_intermediate_size"] * cfg["num_experts"] * 3 / 2 + 1) + attn
    vocab = math.ceil(cfg["vocab_size"] / 128) * 128
    most_loaded = moe_layer * L + h + 2 * h * vocab
    return most_loaded * (6 + 12 / dp)


def test_moe_state_agrees_with_megatron_lm_without_expert_parallel_and_is_smaller_with_it():
    d = dims_from_config(QWEN3_30B_A3B)
    theirs = _megatron_moe_weight_and_optimizer(QWEN3_30B_A3B, dp=8)
    one = trainer_memory(d, TrainerLayout(dp=8, distributed_optimizer=True))
    state = one.get("weights") + one.get("gradients") + one.get("optimizer")
    assert state == pytest.approx(theirs, rel=2e-3)  # Megatron leaves out the router and the q/k norms
    ep8 = trainer_memory(d, TrainerLayout(dp=8, ep=8, distributed_optimizer=True))
    # experts / 8 per rank (6 B each), their 12 B over the expert data-parallel group of 8 / 8 = 1
    assert ep8.get("weights") < one.get("weights") / 5
