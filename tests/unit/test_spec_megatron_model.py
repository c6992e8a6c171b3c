"""The megatron model checks run by ``validate`` (and submit) when model.path/config.json is readable.

Configs are the published ``config.json`` files of the models slime users train (the fields that
matter). Every rule has a failing and a passing case with its field path and message asserted; the
CLI cases check the exit codes (2 for a spec problem, never 1 with a traceback). Nothing here
imports torch or megatron-core (the spec layer must stay light; ``test_imports`` checks render).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.backends.megatron.model_check import MegatronConfigError, ModelShape, parallel_findings
from slime.cli.main import main
from tests.fixtures.spec_helpers import GPU_SPEC, errors_at, load, problems, spec, to_yaml

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "router_aux_loss_coef": 0.001,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
}
QWEN15_MOE = {
    "model_type": "qwen2_moe",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "norm_topk_prob": False,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "vocab_size": 151936,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_act": "silu",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rope_theta": 10000,
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "vocab_size": 129280,
}
MISTRAL_7B = {
    "model_type": "mistral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "sliding_window": 4096,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
}


def _model(tmp_path: Path, config: dict, name: str = "m") -> str:
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


def _one_node(model: str, **parallel) -> dict:
    """slime's 8-GPU colocated MoE recipe shape (one node, 8 engines' worth of GPUs)."""
    return spec(
        GPU_SPEC,
        **{
            "cluster.nodes": 1,
            "model.path": model,
            "train.parallel": parallel,
            "rollout.gpus_per_engine": 8,
            "train.global_batch_size": 32,
        },
    )


# ----------------------------------------------------------------------------- shapes
def test_qwen3_moe_shape():
    s = ModelShape.from_hf_config(QWEN3_30B_A3B)
    e = s.moe
    assert s.qk_layernorm and not s.qkv_bias and s.kv_channels == 128
    assert (e.num_experts, e.topk, e.ffn_hidden_size, e.pre_softmax) == (128, 8, 768, False)
    assert e.layer_pattern == (1,) * 48 and e.shared_ffn_hidden_size is None
    assert 30.0e9 < s.num_params() < 31.0e9  # Qwen3-30B-A3B: 30.5B
    # transformers 5 writes num_local_experts (attribute_map) when it saves a Qwen3-MoE config
    alt = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"} | {"num_local_experts": 128}
    assert ModelShape.from_hf_config(alt).moe.num_experts == 128
    sparse = ModelShape.from_hf_config({**QWEN3_30B_A3B, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    assert sparse.moe.layer_pattern[:4] == (0, 0, 0, 1)


def test_qwen2_moe_shape_has_a_gated_shared_expert_and_pre_softmax_routing():
    s = ModelShape.from_hf_config(QWEN15_MOE)
    assert s.qkv_bias and not s.qk_layernorm
    assert s.moe.shared_ffn_hidden_size == 5632 and s.moe.shared_gate and s.moe.pre_softmax
    assert s.moe.shared_prefix == "shared_expert"
    assert 14.0e9 < s.num_params() < 14.6e9  # Qwen1.5-MoE-A2.7B: 14.3B


def test_deepseek_v3_shape():
    s = ModelShape.from_hf_config(DEEPSEEK_V3)
    e, m = s.moe, s.mla
    assert e.layer_pattern[:4] == (0, 0, 0, 1) and sum(e.layer_pattern) == 58
    assert (e.score_function, e.expert_bias, e.num_groups, e.group_topk, e.topk_scaling_factor) == (
        "sigmoid",
        True,
        8,
        4,
        2.5,
    )
    assert e.shared_ffn_hidden_size == 2048 and not e.shared_gate and e.shared_prefix == "shared_experts"
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim) == (
        1536,
        512,
        128,
        64,
        128,
    )
    assert m.yarn["rotary_scaling_factor"] == 40.0 and m.yarn["mscale_all_dim"] == 1.0
    assert 670e9 < s.num_params() < 672e9  # 671B without the multi-token-prediction layer


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        ({"norm_topk_prob": False}, "megatron normalises iff k > 1"),
        ({"topk_group": 2}, "scores a group by its top 4 experts, transformers' DeepseekV3 by its top 2"),
        ({"scoring_func": "softmax"}, "only sigmoid"),
        ({"rope_interleave": False}, "interleaved"),
        ({"rms_norm_eps": 1e-5}, "q_a/kv_a norms use 1e-06"),
        ({"attention_bias": True}, "attention_bias=true"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type='linear' is not supported for deepseek_v3"),
    ],
)
def test_deepseek_configs_megatron_computes_differently_are_refused(edit, words):
    with pytest.raises(MegatronConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        ModelShape.from_hf_config({**DEEPSEEK_V3, **edit})


def test_moe_router_that_megatron_cannot_express_is_refused():
    with pytest.raises(MegatronConfigError, match="norm_topk_prob=true with num_experts_per_tok=1"):
        ModelShape.from_hf_config({**QWEN3_30B_A3B, "num_experts_per_tok": 1})
    assert ModelShape.from_hf_config({**QWEN3_30B_A3B, "num_experts_per_tok": 1, "norm_topk_prob": False})


def test_parallel_findings_name_fields_and_numbers():
    s = ModelShape.from_hf_config(QWEN3_30B_A3B)
    assert parallel_findings(s, tp=4, ep=8, etp=1, sequence_parallel=True) == []
    found = {path: msg for path, msg, _ in parallel_findings(s, tp=4, ep=3, etp=5)}
    assert found["train.parallel.expert"] == "train.parallel.expert=3 does not divide the model's 128 experts"
    assert (
        "moe_intermediate_size=768 is not divisible by train.parallel.expert_tensor=5"
        in found["train.parallel.expert_tensor"]
    )
    assert "needs sequence parallelism" in found["train.parallel.sequence_parallel"]


# ----------------------------------------------------------------------------- validate
def test_slimes_qwen3_30b_a3b_recipe_validates(tmp_path):
    """8 GPUs, TP 4, EP 8, expert-tensor 1, sequence parallel (slime's scripts/run-qwen3-30B-A3B.sh)."""
    model = _model(tmp_path, QWEN3_30B_A3B)
    loaded = load(_one_node(model, tensor=4, expert=8, expert_tensor=1, sequence_parallel=True))
    p = loaded.spec.train.parallel
    assert (p.tensor, p.expert, p.expert_tensor, p.sequence_parallel) == (4, 8, 1, True)


@pytest.mark.parametrize(
    ("config", "bad", "path", "words", "good"),
    [
        (
            QWEN3_30B_A3B,
            {"tensor": 4, "expert": 8},
            "train.parallel.sequence_parallel",
            "a MoE model with train.parallel.tensor=4 needs sequence parallelism",
            {"tensor": 4, "expert": 8, "sequence_parallel": True},
        ),
        (QWEN15_MOE, {"expert": 8}, "train.parallel.expert", "does not divide the model's 60 experts", {"expert": 4}),
        (
            {**QWEN3_30B_A3B, "moe_intermediate_size": 767},
            {"tensor": 1, "expert": 4, "expert_tensor": 2},
            "train.parallel.expert_tensor",
            "moe_intermediate_size=767 is not divisible by train.parallel.expert_tensor=2",
            {"tensor": 1, "expert": 4, "expert_tensor": 1},
        ),
        (
            {**QWEN15_MOE, "shared_expert_intermediate_size": 5630},
            {"tensor": 4, "sequence_parallel": True},
            "train.parallel.tensor",
            "shared experts' size 5630 is not divisible by train.parallel.tensor=4",
            {"tensor": 2, "sequence_parallel": True},
        ),
        (
            DEEPSEEK_V3,
            {"tensor": 4},
            "train.parallel.sequence_parallel",
            "multi-latent attention with train.parallel.tensor=4 needs sequence parallelism",
            {"tensor": 4, "sequence_parallel": True},
        ),
        (
            {**QWEN3_30B_A3B, "num_experts_per_tok": 200},
            {"tensor": 1},
            "model.path",
            "num_experts_per_tok=200 is above the 128 experts",
            None,
        ),
        (
            {**QWEN3_30B_A3B, "model_type": "qwen3", "num_experts": None},
            {"tensor": 1, "expert": 8},
            "train.parallel.expert",
            "train.parallel.expert=8 on a model without experts (qwen3)",
            {"tensor": 1, "expert": 1},
        ),
        (DEEPSEEK_V3, {"tensor": 1, "context": 2}, "train.parallel.context", "multi-latent attention", {"tensor": 1}),
    ],
)
def test_megatron_rules_need_the_config(tmp_path, config, bad, path, words, good):
    model = _model(tmp_path, config)
    found = errors_at(problems(_one_node(model, **bad)), path)
    assert any(words in p.message for p in found), [p.format() for p in problems(_one_node(model, **bad))]
    if good is not None:  # None: only a different config.json fixes it
        assert not errors_at(problems(_one_node(model, **good)), path)
    # without a readable config.json nothing is known about the model: no finding
    assert not errors_at(problems(_one_node(str(tmp_path / "absent"), **bad)), path)


def test_unsupported_model_is_a_spec_problem_at_model_path(tmp_path):
    model = _model(tmp_path, MISTRAL_7B)
    (p,) = errors_at(problems(spec(GPU_SPEC, **{"model.path": model})), "model.path")
    assert "model_type 'mistral' is not supported by the megatron backend" in p.message and model in p.message
    assert "another train backend (train.backend)" in p.hint


def test_sglang_expert_parallel_must_divide_the_experts(tmp_path):
    model = _model(tmp_path, QWEN15_MOE)  # 60 experts
    bad = _one_node(model, tensor=1)
    bad["rollout"]["sglang"] = {"args": {"expert-parallel-size": 8}}
    (p,) = errors_at(problems(bad), "rollout.sglang.args.expert-parallel-size")
    assert "expert-parallel size 8 does not divide the model's 60 experts" in p.message
    bad["rollout"]["sglang"] = {"args": {"expert-parallel-size": 4}}
    assert not errors_at(problems(bad), "rollout.sglang.args.expert-parallel-size")


def test_transformer_engine_moe_switches_are_refused(tmp_path):
    """--moe-grouped-gemm (in slime's MoE recipes) would build megatron's legacy GroupedMLP, whose weights the
    converter does not map: refused at validate, and the importer reports it as not mapped."""
    from slime.migrate.slime_flags import SLIME_ONLY, slime_only_reason

    model = _model(tmp_path, QWEN3_30B_A3B)
    bad = _one_node(model, tensor=1)
    bad["train"]["megatron"] = {"args": {"moe-grouped-gemm": True}}
    (p,) = errors_at(problems(bad), "train.megatron.args.moe-grouped-gemm")
    assert "needs Transformer Engine layer specs" in p.message and p.hint == "remove it"
    bad["train"]["megatron"] = {"args": {"moe-grouped-gemm": False}}
    assert not errors_at(problems(bad), "train.megatron.args.moe-grouped-gemm")
    assert "--moe-grouped-gemm" in SLIME_ONLY and "SequentialMLP" in slime_only_reason("--moe-grouped-gemm")


def test_te_attention_is_refused_for_moe_models(tmp_path):
    model = _model(tmp_path, QWEN3_30B_A3B)
    bad = _one_node(model, tensor=1)
    bad["train"]["megatron"] = {"args": {"attention-backend": "te"}}
    (p,) = errors_at(problems(bad), "train.megatron.args.attention-backend")
    assert "not mapped for qwen3_moe" in p.message
    bad["train"]["megatron"] = {"args": {"attention-backend": "flash"}}
    assert not errors_at(problems(bad), "train.megatron.args.attention-backend")


# ----------------------------------------------------------------------------- the CLI
def _write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(to_yaml(data))
    return str(path)


def test_validate_and_render_exit_2_for_a_mistral_config(tmp_path, capsys):
    """Was: validate passed and render exited 1 ("a bug") with a traceback."""
    job = _write(tmp_path, spec(GPU_SPEC, **{"model.path": _model(tmp_path, MISTRAL_7B)}))
    for command in (["validate", job], ["render", job], ["submit", "--dry-run", job]):
        assert main(command) == 2, command
        out = capsys.readouterr()
        assert "model_type 'mistral' is not supported" in out.out + out.err and "Traceback" not in out.err


def test_render_with_flash_attention_and_a_moe_model_shows_the_moe_fields(tmp_path, capsys):
    """Was: attention-backend flash made render exit 1 with a traceback."""
    model = _model(tmp_path, QWEN3_30B_A3B)
    data = _one_node(model, tensor=4, expert=8, expert_tensor=1, sequence_parallel=True)
    data["train"]["megatron"] = {"args": {"attention-backend": "flash"}}
    assert main(["render", _write(tmp_path, data)]) == 0
    text = capsys.readouterr().out
    assert "expert_model_parallel_size=8, expert_tensor_parallel_size=1)" in text
    assert "qwen3_moe, 30.53B parameters; 128 experts, top-8 (softmax router), 48 MoE / 0 dense layers" in text
    for field in (
        "num_moe_experts=128,",
        "moe_router_topk=8,",
        "moe_ffn_hidden_size=768,",
        "moe_router_pre_softmax=False,",
        "qk_layernorm=True,",
        "moe_router_dtype='fp32',",
        "moe_aux_loss_coeff=0.0,",
    ):
        assert field in text, field
    assert "# attention: flash -> Transformer Engine's flash attention when importable" in text


def test_render_shows_the_mla_fields(tmp_path, capsys):
    model = _model(tmp_path, DEEPSEEK_V3)
    data = spec(GPU_SPEC, **{"model.path": model, "train.parallel": {"tensor": 2, "sequence_parallel": True}})
    assert main(["render", _write(tmp_path, data)]) == 0
    text = capsys.readouterr().out
    for field in (
        "multi_latent_attention=True,",
        "q_lora_rank=1536,",
        "kv_lora_rank=512,",
        "qk_head_dim=128,",
        "qk_pos_emb_head_dim=64,",
        "v_head_dim=128,",
        "rope_type='yarn',",
        "rotary_scaling_factor=40.0,",
        "mscale_all_dim=1.0,",
        "moe_router_score_function='sigmoid',",
        "moe_router_enable_expert_bias=True,",
        "moe_router_num_groups=8,",
        "moe_router_group_topk=4,",
        "moe_router_topk_scaling_factor=2.5,",
        "moe_shared_expert_intermediate_size=2048,",
        "moe_router_bias_update_rate=0.0,",
        "moe_layer_freq=[0, 0, 0, 1, 1,",
    ):
        assert field in text, field
    assert "multi-latent attention with YaRN rope" in text
