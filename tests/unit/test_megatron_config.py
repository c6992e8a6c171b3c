"""HF config → megatron-core arguments, parallel rules, rank coordinates, attention choice."""

from __future__ import annotations

import importlib.util

import pytest

from slime.backends.megatron.config import (
    MegatronConfigError,
    ModelShape,
    check_parallel,
    choose_attention_backend,
    gpt_model_kwargs,
    padded_vocab_size,
    parallel_problems,
    rank_coords,
    split_backend_args,
    transformer_config_kwargs,
)
from tests.fixtures.hf_configs import QWEN25_7B

LLAMA_31_8B = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "vocab_size": 128256,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}
HAS_MEGATRON = importlib.util.find_spec("megatron.core") is not None


def test_qwen2_mapping():
    s = ModelShape.from_hf_config(QWEN25_7B)
    assert (s.family, s.hidden_size, s.ffn_hidden_size, s.num_layers) == ("qwen2", 3584, 18944, 28)
    assert (s.num_attention_heads, s.num_query_groups, s.kv_channels) == (28, 4, 128)
    assert s.qkv_bias and not s.tie_embeddings and s.rope_theta == 1e6 and s.norm_eps == 1e-6
    assert s.qkv_rows == (28 + 2 * 4) * 128
    # 7.6B parameters, as published for Qwen2.5-7B.
    assert 7.5e9 < s.num_params() < 7.7e9
    kw = transformer_config_kwargs(s, tp=2, precision="bf16")
    assert kw["num_query_groups"] == 4 and kw["kv_channels"] == 128 and kw["add_qkv_bias"] is True
    assert kw["gated_linear_unit"] and kw["activation_func"] == "silu" and kw["normalization"] == "RMSNorm"
    assert kw["add_bias_linear"] is False and kw["bf16"] and kw["params_dtype"] == "bfloat16"
    g = gpt_model_kwargs(s, tp=2)
    assert g["vocab_size"] == 152064 and g["rotary_base"] == 1000000 and not g["share_embeddings_and_output_weights"]
    assert g["position_embedding_type"] == "rope" and "rope_scaling" not in g


def test_llama_mapping_with_llama3_rope_and_transformers5_rope_parameters():
    s = ModelShape.from_hf_config(LLAMA_31_8B)
    assert s.family == "llama" and not s.qkv_bias and s.rope_scaling_factor == 8.0 and s.rope_theta == 5e5
    assert gpt_model_kwargs(s)["rope_scaling"] is True
    # transformers 5 writes rope_parameters instead of rope_theta
    cfg = {
        **LLAMA_31_8B,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
        "head_dim": 64,
    }
    s2 = ModelShape.from_hf_config(cfg)
    assert s2.rope_theta == 1e4 and s2.rope_scaling_factor is None and s2.kv_channels == 64


def test_unsupported_configs_list_every_problem():
    with pytest.raises(MegatronConfigError, match="model_type 'gemma'"):
        ModelShape.from_hf_config({**QWEN25_7B, "model_type": "gemma"})
    bad = {
        **LLAMA_31_8B,
        "attention_bias": True,
        "mlp_bias": True,
        "hidden_act": "gelu",
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0},
    }
    with pytest.raises(MegatronConfigError) as err:
        ModelShape.from_hf_config(bad)
    text = str(err.value)
    assert len(err.value.problems) == 4
    for needle in ("attention_bias", "mlp_bias", "hidden_act", "yarn"):
        assert needle in text
    with pytest.raises(MegatronConfigError, match="sliding-window"):
        ModelShape.from_hf_config({**QWEN25_7B, "use_sliding_window": True})
    with pytest.raises(MegatronConfigError, match="differs from megatron-core"):
        ModelShape.from_hf_config(
            {**LLAMA_31_8B, "rope_scaling": {**LLAMA_31_8B["rope_scaling"], "high_freq_factor": 2.0}}
        )
    with pytest.raises(MegatronConfigError, match="hidden_size=None"):
        ModelShape.from_hf_config({**QWEN25_7B, "hidden_size": None})


@pytest.mark.parametrize(
    ("vocab", "tp", "expected"),
    [(261, 1, 384), (261, 2, 512), (151936, 2, 152064), (152064, 4, 152064), (128256, 8, 129024), (128, 1, 128)],
)
def test_vocab_padding(vocab, tp, expected):
    assert padded_vocab_size(vocab, tp) == expected
    assert expected % (128 * tp) == 0


def test_parallel_rules_report_all_at_once():
    s = ModelShape.from_hf_config(QWEN25_7B)  # 28 heads, 4 groups, 28 layers
    assert parallel_problems(s, tp=2, pp=2, world_size=16) == []
    assert parallel_problems(s, tp=4, pp=7, world_size=28) == []
    problems = parallel_problems(
        s, tp=8, pp=3, cp=2, sequence_parallel=False, world_size=20, seq_length=1001, attention_backend="local"
    )
    text = "\n".join(problems)
    assert "train.parallel.tensor=8 does not divide the model's 28 attention heads and 4 key/value heads" in text
    assert "train.parallel.pipeline=3 does not divide the model's 28 layers" in text
    assert "needs Transformer Engine or SDPA attention (backend is 'local')" in text
    # SDPA attention is context-parallel aware now: only the divisibility rules remain
    assert parallel_problems(s, tp=2, cp=2, world_size=8, seq_length=1024, attention_backend="sdpa") == []
    assert "sequence length 1001 is not divisible by 2 x train.parallel.context=4" in text
    assert "world size 20 is not divisible by tensor x pipeline x context = 8 x 3 x 2 = 48" in text
    with pytest.raises(MegatronConfigError, match="sequence_parallel needs train.parallel.tensor > 1"):
        check_parallel(s, tp=1, sequence_parallel=True)


def test_rank_coords_follow_tp_cp_dp_pp_order():
    # world 8, tp 2, pp 2 -> dp 2. Ranks 0,1 = tp pair of (dp0, pp0); 2,3 = (dp1, pp0); 4..7 = pp1.
    coords = [rank_coords(r, 8, tp=2, pp=2) for r in range(8)]
    assert [(c.tp, c.dp, c.pp) for c in coords] == [
        (0, 0, 0),
        (1, 0, 0),
        (0, 1, 0),
        (1, 1, 0),
        (0, 0, 1),
        (1, 0, 1),
        (0, 1, 1),
        (1, 1, 1),
    ]
    assert {c.dp_size for c in coords} == {2}
    with pytest.raises(MegatronConfigError):
        rank_coords(0, 6, tp=4)


def test_attention_backend_choice():
    has_te = importlib.util.find_spec("transformer_engine") is not None
    assert choose_attention_backend("auto") == ("te" if has_te else "sdpa")
    assert choose_attention_backend("sdpa") == "sdpa" and choose_attention_backend("local") == "local"
    # megatron-core's AttnBackend names are accepted (slime users pass --attention-backend flash)
    assert choose_attention_backend("flash") == ("te" if has_te else "sdpa")
    assert choose_attention_backend("unfused") == ("te" if has_te else "local")
    with pytest.raises(MegatronConfigError, match="valid values are auto, te, sdpa, local, flash, fused, unfused"):
        choose_attention_backend("flashy")
    if not has_te:
        for name in ("te", "fused"):
            with pytest.raises(MegatronConfigError, match="transformer_engine is not installed"):
                choose_attention_backend(name)


def test_backend_args_split_and_override():
    ours, overrides = split_backend_args(
        {"attention-backend": "sdpa", "recompute-granularity": "full", "recompute_num_layers": 1}
    )
    assert ours == {"attention_backend": "sdpa"}
    assert overrides == {"recompute_granularity": "full", "recompute_num_layers": 1}
    s = ModelShape.from_hf_config(QWEN25_7B)
    kw = transformer_config_kwargs(s, pp=2, overrides=overrides)
    assert kw["recompute_granularity"] == "full" and kw["variable_seq_lengths"] is True
    assert transformer_config_kwargs(s)["variable_seq_lengths"] is False


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (optional extra 'megatron')")
def test_transformer_config_builds_and_rejects_unknown_options():
    from slime.backends.megatron.transformer_config import build_transformer_config

    s = ModelShape.from_hf_config({**QWEN25_7B, "num_hidden_layers": 2})
    cfg = build_transformer_config(
        transformer_config_kwargs(s, precision="fp32", overrides={"use_cpu_initialization": True})
    )
    assert cfg.num_query_groups == 4 and cfg.kv_channels == 128 and cfg.gated_linear_unit
    with pytest.raises(MegatronConfigError, match=r"'recompute_granularty' \(did you mean 'recompute_granularity'"):
        build_transformer_config(transformer_config_kwargs(s, overrides={"recompute_granularty": "full"}))


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed (optional extra 'megatron')")
def test_optimizer_offload_reaches_megatron_cores_hybrid_optimizer_or_a_clear_refusal():
    """train.megatron.optimizer_offload becomes megatron-core's CPU-offload settings (none without it). They take
    the precision-aware path, whose config checks Transformer Engine: where it is missing (this machine) the
    backend refuses naming the field instead of megatron-core's TypeError; where present, the config builds."""
    from megatron.core.optimizer import OptimizerConfig

    from slime.backends.megatron.backend import megatron_optimizer
    from slime.backends.megatron.config import has_transformer_engine, optimizer_config_kwargs
    from tests.fixtures.spec_helpers import GPU_SPEC, load, spec

    train = load(spec(GPU_SPEC, **{"train.megatron": {"optimizer_offload": 0.75}})).spec.train
    kwargs = optimizer_config_kwargs(train)
    assert (kwargs["optimizer_cpu_offload"], kwargs["optimizer_offload_fraction"]) == (True, 0.75)
    assert kwargs["use_precision_aware_optimizer"] and kwargs["use_distributed_optimizer"]
    assert "optimizer_cpu_offload" not in optimizer_config_kwargs(load(GPU_SPEC).spec.train)
    if has_transformer_engine():
        assert OptimizerConfig(**{**kwargs, "params_dtype": None}).optimizer_cpu_offload
    else:
        with pytest.raises(MegatronConfigError) as exc:
            megatron_optimizer(train, model=None)
        assert exc.value.findings[0][0] == "train.megatron.optimizer_offload"
        assert "transformer_engine is not installed" in str(exc.value)
