"""``render_megatron_args(spec)``: the exact megatron-core arguments a spec's trainer ranks use.

The backend builds megatron-core objects in-process, so "the command" is the constructor
arguments, printed by the same functions the backend calls: the rendering cannot drift from what
runs. Shape fields come from ``<model.path>/config.json``; when it is not readable here they are
listed as "from config.json at launch" and the rest stays exact. ``auto`` attention depends on the
trainer nodes and is rendered for SDPA, saying so. Imports neither torch nor megatron-core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from slime.backends.megatron import config as mcfg

if TYPE_CHECKING:
    from slime.spec.types import Spec

__all__ = ["render_megatron_args"]

_SHAPE_KEYS = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "layernorm_epsilon",
    "add_qkv_bias",
    "qk_layernorm",
)
_GPT_SHAPE_KEYS = (
    "vocab_size",
    "max_sequence_length",
    "rotary_base",
    "share_embeddings_and_output_weights",
    "rope_scaling",
    "rope_scaling_factor",
)


class _Raw(str):
    def __repr__(self) -> str:
        return str(self)


def _call(name: str, kwargs: Mapping[str, Any], pending: tuple[str, ...] = ()) -> list[str]:
    lines = [f"{name}("]
    lines += [f"    {k}={v!r}," for k, v in kwargs.items()]
    lines += [f"    {k}=<from config.json at launch>," for k in pending]
    return lines + [")"]


# What each attention request runs without Transformer Engine (render cannot know the trainer nodes).
_WITHOUT_TE = {"auto": "sdpa", "flash": "sdpa", "unfused": "local", "fused": "te"}
_TE_NOTE = {
    "auto": " -> Transformer Engine when importable on the trainer nodes (dense models), else SDPA (rendered for SDPA)",
    "flash": " -> Transformer Engine's flash attention when importable on the trainer nodes (dense models), else "
    "SDPA, which runs PyTorch's FlashAttention kernel where it applies (rendered for SDPA)",
    "unfused": " -> Transformer Engine's unfused attention when importable, else megatron's local one (rendered so)",
    "fused": " -> Transformer Engine's cuDNN fused attention (needs transformer_engine on the trainer nodes)",
}
_PLACEHOLDER = mcfg.ModelShape(
    family="qwen2",
    vocab_size=1,
    hidden_size=1,
    ffn_hidden_size=1,
    num_layers=1,
    num_attention_heads=1,
    num_query_groups=1,
    kv_channels=1,
    rope_theta=1.0,
    norm_eps=1.0,
    tie_embeddings=False,
    qkv_bias=False,
    max_position_embeddings=1,
)


def _describe_model(shape: mcfg.ModelShape) -> str:
    text = f"{shape.family}, {shape.num_params() / 1e9:.2f}B parameters"
    if shape.moe:
        e = shape.moe
        moe_layers = sum(e.layer_pattern)
        text += (
            f"; {e.num_experts} experts, top-{e.topk} ({e.score_function} router), "
            f"{moe_layers} MoE / {shape.num_layers - moe_layers} dense layers"
        )
        if e.shared_ffn_hidden_size:
            text += f", shared experts {e.shared_ffn_hidden_size}" + (" (gated)" if e.shared_gate else "")
    if shape.mla:
        text += "; multi-latent attention" + (" with YaRN rope" if shape.mla.yarn else "")
    return text


def _attention(backend_args: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(requested attention, the one rendered, megatron overrides) from ``train.megatron.args``."""
    ours, overrides = mcfg.split_backend_args(backend_args)
    requested = str(ours.get("attention_backend", "auto"))
    if requested not in mcfg.ATTENTION_BACKENDS:
        mcfg.choose_attention_backend(requested)  # raises the clear error
    # Transformer Engine is decided on the trainer nodes: render the layer spec used without it.
    return requested, _WITHOUT_TE.get(requested, requested), overrides


def _model_kwargs(spec: Spec, shape, layout: dict, requested: str, attention: str, overrides) -> tuple:
    """TransformerConfig and GPTModel kwargs, plus the shape keys left to launch when ``shape`` is unknown."""
    t, par = spec.train, spec.train.parallel
    tc = mcfg.transformer_config_kwargs(
        shape or _PLACEHOLDER,
        **layout,
        sequence_parallel=par.sequence_parallel,
        precision=t.precision,
        attention_backend=attention,
        mcore_attention=mcfg.mcore_attention_backend(requested),
        overrides=overrides,
    )
    gpt = mcfg.gpt_model_kwargs(shape or _PLACEHOLDER, tp=par.tensor)
    pending_tc: tuple[str, ...] = ()
    pending_gpt: tuple[str, ...] = ()
    if shape is None:
        tc = {k: v for k, v in tc.items() if k not in _SHAPE_KEYS}
        gpt = {k: v for k, v in gpt.items() if k not in _GPT_SHAPE_KEYS}
        pending_tc, pending_gpt = _SHAPE_KEYS, _GPT_SHAPE_KEYS[:4]
    return tc, gpt, pending_tc, pending_gpt


def _layer_spec_name(shape, attention: str) -> str:
    spec_name = {
        "sdpa": "local layer spec + SDPACoreAttention (torch scaled_dot_product_attention)",
        "te": "Transformer Engine layer spec",
        "local": "local layer spec (unfused DotProductAttention)",
    }
    if shape is not None and (shape.moe or shape.mla):
        spec_name = {k: v.replace("layer spec", "decoder block spec") for k, v in spec_name.items()}
    return spec_name[attention]


def _header(spec: Spec, shape, world: int, etp: int, requested: str) -> list[str]:
    """The comment lines above the calls: ranks and parallel layout, attention, model."""
    t, par = spec.train, spec.train.parallel
    dp = world // (par.tensor * par.pipeline * par.context)
    model_line = (
        f"# model: {spec.model.path}/config.json -> {_describe_model(shape)}"
        if shape
        else f"# model: {spec.model.path}/config.json is not readable here; shape fields are read from it at launch"
        " (MoE / multi-latent-attention fields too, when the model has them)"
    )
    return [
        f"# megatron-core arguments for {spec.name} (train.backend: megatron)",
        f"# trainer: {world} rank(s) = {t.nodes} node(s) x {t.gpus_per_node} GPU(s); tensor {par.tensor} x "
        f"pipeline {par.pipeline} x context {par.context} -> data parallel {dp}; experts: expert_tensor {etp} x "
        f"expert {par.expert} x pipeline {par.pipeline} -> expert data parallel "
        f"{world // (etp * par.expert * par.pipeline)}",
        f"# attention: {requested}" + _TE_NOTE.get(requested, ""),
        model_line,
    ]


def _footer(spec: Spec) -> list[str]:
    """The comment lines below the calls: batches and losses."""
    t, dyn = spec.train, spec.train.dynamic_batch
    return [
        f"# batches: global_batch_size={t.global_batch_size} per optimizer step, {t.num_steps_per_rollout} "
        f"step(s) per rollout, micro_batch_size={t.micro_batch_size}"
        + (f", dynamic micro-batches up to {dyn.max_tokens_per_gpu} padded tokens per GPU" if dyn.enabled else ""),
        f"# losses: slime.rl.losses.total_loss(estimator={spec.algorithm.estimator!r}, "
        f"eps_clip={spec.algorithm.eps_clip}, eps_clip_high={spec.algorithm.eps_clip_high}, "
        f"agg={spec.algorithm.loss_agg!r}), logits / temperature {spec.rollout.temperature}",
    ]


def render_megatron_args(spec: Spec, hf_config: Mapping[str, Any] | None = None) -> str:
    """Text listing every megatron-core argument of the spec's trainer (raises MegatronConfigError on bad layouts)."""
    from slime.spec.resolve import model_config

    t, par = spec.train, spec.train.parallel
    if t.backend != "megatron":
        raise mcfg.MegatronConfigError(
            [f"train.backend is {t.backend!r}; megatron arguments exist only for 'megatron'"]
        )
    cfg = hf_config if hf_config is not None else model_config(spec.model.path)
    requested, attention, overrides = _attention(t.megatron.args)
    world = (t.nodes or 1) * (t.gpus_per_node or 1)
    shape = mcfg.ModelShape.from_hf_config(cfg) if cfg is not None else None
    etp = par.expert_tensor or par.tensor
    layout = dict(tp=par.tensor, pp=par.pipeline, cp=par.context, ep=par.expert, etp=etp)
    if shape is not None:
        mcfg.check_parallel(
            shape,
            **layout,
            sequence_parallel=par.sequence_parallel,
            world_size=world,
            attention_backend=attention,
        )
    tc, gpt, pending_tc, pending_gpt = _model_kwargs(spec, shape, layout, requested, attention, overrides)
    layer_spec = _Raw(f"<{_layer_spec_name(shape, attention)}>")
    lines = [
        *_header(spec, shape, world, etp, requested),
        f"initialize_model_parallel(tensor_model_parallel_size={par.tensor}, "
        f"pipeline_model_parallel_size={par.pipeline}, context_parallel_size={par.context}, "
        f"expert_model_parallel_size={par.expert}, expert_tensor_parallel_size={etp})",
        *_call("TransformerConfig", tc, pending_tc),
        *_call("GPTModel", {"transformer_layer_spec": layer_spec, **gpt}, pending_gpt),
        *_call("DistributedDataParallelConfig", mcfg.ddp_config_kwargs(t)),
        *_call("OptimizerConfig", mcfg.optimizer_config_kwargs(t)),
        *_call("OptimizerParamScheduler", mcfg.scheduler_kwargs(t, spec.rollout.num_rollouts)),
        *_footer(spec),
    ]
    if spec.kind == "SFTJob":  # what slime's SFT scripts pass: --loss-type sft_loss --calculate-per-token-loss ...
        lines.append(
            "loss: sft_loss (per-token mean NLL of the assistant turns, slime's --calculate-per-token-loss); "
            "no advantages or returns; the OptimizerConfig and scheduler above (no warm-up optimizer)"
        )
    return "\n".join(lines) + "\n"
