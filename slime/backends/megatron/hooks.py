"""The megatron backend's rules, derived values, smoke notes and preview (torch-free).

What megatron-core would refuse at launch is refused at validate: an option it does not have (the pinned
version's table, options.json, written by ``gen_options``), options the spec decides itself, and when
``model.path/config.json`` is readable the model family and shape, the parallel sizes against heads,
layers and experts, and the attention backend.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from msgspec.structs import fields, replace

from slime.backends.megatron.model_check import ATTENTION_BACKENDS, MegatronConfigError, ModelShape, parallel_findings
from slime.spec.plugin import Finding
from slime.spec.resolve import model_config
from slime.spec.types import Parallel

__all__ = ["RULES", "preview", "resolve", "untested"]

# TransformerConfig options the spec already decides: a train.megatron.args entry for one of them would
# silently disagree with the rest of the job (the process groups, the weight converter, the rules here).
_SPEC_OWNED_BACKEND_ARGS = {
    "tensor_model_parallel_size": "train.parallel.tensor",
    "pipeline_model_parallel_size": "train.parallel.pipeline",
    "context_parallel_size": "train.parallel.context",
    "expert_model_parallel_size": "train.parallel.expert",
    "expert_tensor_parallel_size": "train.parallel.expert_tensor",
    "sequence_parallel": "train.parallel.sequence_parallel",
    "bf16": "train.precision",
    "fp16": "train.precision",
    "params_dtype": "train.precision",
    "pipeline_dtype": "train.precision",
    **dict.fromkeys(
        (
            "num_layers",
            "hidden_size",
            "ffn_hidden_size",
            "num_attention_heads",
            "num_query_groups",
            "kv_channels",
            "layernorm_epsilon",
            "add_qkv_bias",
            "add_bias_linear",
            "normalization",
            "gated_linear_unit",
            "activation_func",
            "num_moe_experts",
            "moe_router_topk",
            "moe_ffn_hidden_size",
            "moe_layer_freq",
            "moe_router_score_function",
            "moe_router_pre_softmax",
            "moe_router_enable_expert_bias",
            "moe_router_num_groups",
            "moe_router_group_topk",
            "moe_router_topk_scaling_factor",
            "moe_shared_expert_intermediate_size",
            "moe_shared_expert_gate",
            "qk_layernorm",
            "multi_latent_attention",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_head_dim",
            "qk_pos_emb_head_dim",
            "v_head_dim",
            "rotary_base",
            "rope_type",
        ),
        "the model's config.json",
    ),
}


def spec_owned_args(s) -> Iterator[Finding]:
    for key in s.train.megatron.args:
        owner = _SPEC_OWNED_BACKEND_ARGS.get(key.replace("-", "_"))
        if owner is not None:
            yield (
                f"train.megatron.args.{key}",
                f"'{key}' is decided by {owner}; a megatron.args value would silently disagree with the rest of "
                "the job",
                f"remove it and set {owner}" if owner.startswith("train.") else "remove it",
            )


@cache
def megatron_options() -> tuple[str, frozenset[str]]:
    """(the pinned megatron-core version, the option names train.megatron.args takes) from options.json."""
    table = json.loads(Path(__file__).with_name("options.json").read_text())
    return table["megatron_core"], frozenset(table["options"])


def unknown_option(key: str) -> tuple[str, str] | None:
    """(message, hint) when ``key`` ('-' or '_') is not an option train.megatron.args takes, else None."""
    version, options = megatron_options()
    name = key.strip().replace("-", "_")
    if name in options:
        return None
    close = [c.replace("_", "-") if "-" in key else c for c in difflib.get_close_matches(name, sorted(options))]
    mean = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (
        f"'{key}' is not a megatron-core {version} option (TransformerConfig) nor one the megatron backend reads{mean}",
        f"write '{close[0]}'" if close else "remove it",
    )


def megatron_options_known(s) -> Iterator[Finding]:
    """Each key a TransformerConfig / MLATransformerConfig field or a key the backend reads ('-' or '_')."""
    for key in s.train.megatron.args:
        if (problem := unknown_option(key)) is not None:
            yield (f"train.megatron.args.{key}", *problem)


_TE_ONLY_MOE = dict.fromkeys(("moe_grouped_gemm", "moe_permute_fusion", "moe_router_fusion"), True)


def megatron_model(s) -> Iterator[Finding]:
    """What the megatron backend checks at launch, run here when model.path/config.json is readable."""
    args = s.train.megatron.args
    requested = args.get("attention-backend", args.get("attention_backend"))
    if requested is not None and requested not in ATTENTION_BACKENDS:
        key = "attention-backend" if "attention-backend" in args else "attention_backend"
        yield (
            f"train.megatron.args.{key}",
            f"attention backend {requested!r} is not one of {', '.join(ATTENTION_BACKENDS)}",
            "flash/fused/unfused/local/auto are megatron-core's names; te and sdpa pick a layer spec directly",
        )
    cfg = model_config(s.model.path)
    if cfg is None:
        return
    try:
        shape = ModelShape.from_hf_config(cfg)
    except MegatronConfigError as exc:
        for message in exc.problems:
            yield (
                "model.path",
                f"{message} ({s.model.path}/config.json)",
                "use another train backend (train.backend) for this model",
            )
        return
    p = s.train.parallel
    yield from parallel_findings(
        shape,
        tp=p.tensor,
        pp=p.pipeline,
        cp=p.context,
        ep=p.expert,
        etp=p.expert_tensor,
        sequence_parallel=p.sequence_parallel,
        attention_backend=None if requested in (None, "auto", "flash") else str(requested),
    )
    if shape.mla and requested in ("local", "unfused"):
        yield (
            "train.megatron.args.attention-backend",
            f"attention-backend {requested}: megatron-core's local DotProductAttention cannot take multi-latent "
            "attention's different key and value head sizes",
            "use auto or sdpa",
        )
    for key, value in s.train.megatron.args.items():
        if shape.moe and _TE_ONLY_MOE.get(key.replace("-", "_")) and value not in (False, None):
            yield (
                f"train.megatron.args.{key}",
                f"'{key}' needs Transformer Engine layer specs, which the megatron backend does not map for MoE "
                "models (its experts run one by one as SequentialMLP)",
                "remove it",
            )
    if requested in ("te", "fused") and (shape.moe or shape.mla):
        yield (
            "train.megatron.args.attention-backend",
            f"attention-backend {requested} uses Transformer Engine layer specs, which are not mapped for "
            f"{shape.family} (MoE / multi-latent attention) models",
            "use auto or sdpa",
        )


def offload_needs_distributed_optimizer(s) -> Iterator[Finding]:
    """megatron-core's hybrid CPU optimizer runs only inside its distributed optimizer (precision-aware path)."""
    if s.train.megatron.optimizer_offload and s.train.optimizer.distributed is False:
        yield (
            "train.megatron.optimizer_offload",
            "optimizer offload needs megatron's distributed optimizer, but train.optimizer.distributed is false",
            "set train.optimizer.distributed: true (or leave it unset), or train.megatron.optimizer_offload: 0",
        )


RULES = (megatron_options_known, megatron_model, spec_owned_args, offload_needs_distributed_optimizer)


def resolve(spec):
    """``train.optimizer.distributed``: true (megatron's distributed optimizer)."""
    o = spec.train.optimizer
    if o.distributed is None:
        spec = replace(spec, train=replace(spec.train, optimizer=replace(o, distributed=True)))
    return spec


def untested(spec) -> Iterator[str]:
    t = spec.train
    p = t.parallel
    derived = {"expert_tensor": p.tensor}  # resolved to tensor unless set otherwise
    sizes = [
        f"{f.encode_name} {getattr(p, f.name)}"
        for f in fields(Parallel)
        if getattr(p, f.name) not in (f.default, derived.get(f.name, f.default))
    ]
    args = t.megatron.args if t.megatron else {}
    yield (
        "Megatron-core training: "
        + (f"parallel sizes ({', '.join(sizes)}), " if sizes else "")
        + f"precision {t.precision}, the distributed optimizer, HF<->Megatron weight conversion"
        + (f", megatron.args {', '.join(args)}" if args else "")
    )


def preview(spec) -> tuple[str, str]:
    from slime.backends.megatron.render import render_megatron_args

    return "megatron-core arguments of the trainer ranks", render_megatron_args(spec)
