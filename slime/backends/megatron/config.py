"""HF config -> megatron-core model arguments, plus the parallel rules.

Pure Python (neither torch nor megatron-core at import), so ``render`` and the spec validator can
use it; :func:`build_transformer_config` imports megatron-core lazily. The model shape and its rules
live in ``slime.backends.megatron.model_check``; this module turns a shape into arguments. MoE defaults (each
overridable in ``train.megatron.args``): fp32 router, no aux loss in the gradient, frozen expert bias,
sequential experts. Attention: ``auto`` = TE when importable (dense models), else SDPA.
Guaranteed: every rule violation is reported at once, naming the numbers and the spec field.
Not supported: see ``slime.backends.megatron.model_check``; TE specs for MoE and MLA. Table: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from slime.backends.megatron.model_check import (
    ATTENTION_BACKENDS,
    FAMILIES,
    VOCAB_MULTIPLE,
    MegatronConfigError,
    ModelShape,
    has_transformer_engine,
    padded_vocab_size,
    parallel_findings,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "FAMILIES",
    "VOCAB_MULTIPLE",
    "MegatronConfigError",
    "ModelShape",
    "RankCoords",
    "check_parallel",
    "choose_attention_backend",
    "ddp_config_kwargs",
    "describe",
    "gpt_model_kwargs",
    "mcore_attention_backend",
    "mla_config_kwargs",
    "moe_config_kwargs",
    "optimizer_config_kwargs",
    "padded_vocab_size",
    "parallel_problems",
    "rank_coords",
    "scheduler_kwargs",
    "split_backend_args",
    "transformer_config_kwargs",
]

# backend_args keys we consume ourselves (everything else goes to TransformerConfig).
_OWN_ARGS = {"attention_backend"}


def parallel_problems(shape: ModelShape, **kwargs: Any) -> list[str]:
    """Every way the layout fails megatron-core's rules, each naming the numbers and the field."""
    return [message for _, message, _ in parallel_findings(shape, **kwargs)]


def check_parallel(shape: ModelShape, **kwargs: Any) -> None:
    """Raise MegatronConfigError listing every :func:`parallel_problems` entry (if any)."""
    findings = parallel_findings(shape, **kwargs)
    if findings:
        raise MegatronConfigError(findings)


@dataclass(frozen=True, slots=True)
class RankCoords:
    tp: int
    cp: int
    dp: int
    pp: int
    dp_size: int


def rank_coords(rank: int, world_size: int, *, tp: int = 1, pp: int = 1, cp: int = 1) -> RankCoords:
    """A global rank's (tp, cp, dp, pp) indices in megatron-core's default 'tp-cp-ep-dp-pp' order.

    Ranks with equal ``dp`` (and any tp/cp/pp) form one model replica and must be fed the same batch.
    """
    if world_size % (tp * pp * cp):
        raise MegatronConfigError([f"world size {world_size} is not divisible by tp*pp*cp={tp * pp * cp}"])
    dp_size = world_size // (tp * pp * cp)
    return RankCoords(
        tp=rank % tp,
        cp=(rank // tp) % cp,
        dp=(rank // (tp * cp)) % dp_size,
        pp=rank // (tp * cp * dp_size),
        dp_size=dp_size,
    )


def choose_attention_backend(requested: str = "auto", shape: ModelShape | None = None) -> str:
    """The layer spec a requested backend runs with: 'te', 'sdpa' or 'local' (see docs/design-notes.md)."""
    if requested not in ATTENTION_BACKENDS:
        raise MegatronConfigError(
            [f"train.megatron.args.attention-backend={requested!r}: valid values are {', '.join(ATTENTION_BACKENDS)}"]
        )
    te_ok = has_transformer_engine() and (shape is None or (shape.moe is None and shape.mla is None))
    if requested in ("auto", "flash"):
        return "te" if te_ok else "sdpa"
    if requested == "unfused" and te_ok:
        return "te"
    if requested == "unfused":
        requested = "local"
    if requested in ("te", "fused") and not te_ok:
        why = (
            "transformer_engine is not installed"
            if not has_transformer_engine()
            else f"Transformer Engine layer specs are not mapped for {shape.family} (MoE / MLA) models"
        )
        raise MegatronConfigError(
            [f"train.megatron.args.attention-backend={requested} but {why}; use 'auto' or 'sdpa'"]
        )
    choice = "te" if requested == "fused" else requested
    if choice == "local" and shape is not None and shape.mla is not None:
        raise MegatronConfigError(
            [
                "train.megatron.args.attention-backend=local: megatron's DotProductAttention cannot run multi-latent "
                "attention (different key and value head sizes); use 'auto' or 'sdpa'"
            ]
        )
    return choice


def mcore_attention_backend(requested: str) -> str:
    """megatron-core's ``AttnBackend`` name for a request (which of TE's kernels a TE layer spec uses)."""
    return requested if requested in ("flash", "fused", "unfused", "local") else "auto"


def split_backend_args(backend_args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``train.megatron.args`` → (our own options, TransformerConfig overrides); '-' becomes '_'."""
    ours, overrides = {}, {}
    for key, value in backend_args.items():
        name = key.replace("-", "_")
        (ours if name in _OWN_ARGS else overrides)[name] = value
    return ours, overrides


def _shape_kwargs(shape: ModelShape) -> dict[str, Any]:
    """The ``TransformerConfig`` fields read off the model (a llama-style RMSNorm / SwiGLU block)."""
    return dict(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        ffn_hidden_size=shape.ffn_hidden_size,
        num_attention_heads=shape.num_attention_heads,
        num_query_groups=shape.num_query_groups,
        kv_channels=shape.kv_channels,
        normalization="RMSNorm",
        layernorm_epsilon=shape.norm_eps,
        gated_linear_unit=True,
        activation_func="silu",
        add_bias_linear=False,
        add_qkv_bias=shape.qkv_bias,
        qk_layernorm=shape.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _run_kwargs(*, tp, pp, cp, ep, etp, sequence_parallel, precision, te) -> dict[str, Any]:
    """The parallel layout, dtypes and kernel fusions of a ``TransformerConfig``."""
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32")
    return dict(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        expert_model_parallel_size=ep,
        expert_tensor_parallel_size=etp or tp,
        sequence_parallel=sequence_parallel,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        # Pipeline stages exchange activations whose length varies per micro-batch.
        variable_seq_lengths=pp > 1,
        # Fusions that need Transformer Engine or apex kernels are off without TE.
        apply_rope_fusion=te,
        masked_softmax_fusion=te,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        persist_layer_norm=False,
    )


def transformer_config_kwargs(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    sequence_parallel: bool = False,
    precision: str = "bf16",
    attention_backend: str = "sdpa",
    mcore_attention: str = "auto",
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``TransformerConfig`` (``MLATransformerConfig`` when ``multi_latent_attention``);
    the activation is given as the name 'silu' and dtypes as names (``build_transformer_config`` resolves them)."""
    te = attention_backend == "te"
    kwargs: dict[str, Any] = {
        **_shape_kwargs(shape),
        **_run_kwargs(
            tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, sequence_parallel=sequence_parallel, precision=precision, te=te
        ),
    }
    if te and mcore_attention != "auto":
        kwargs["attention_backend"] = mcore_attention
    if pp > 1 or ep > 1:
        # megatron rejects all-gather dispatch with variable lengths (pp > 1); expert-parallel ranks are
        # different data-parallel ranks whose micro-batches differ in length: all-to-all takes any split
        kwargs["moe_token_dispatcher_type"] = "alltoall"
    kwargs.update(moe_config_kwargs(shape))
    kwargs.update(mla_config_kwargs(shape))
    for key, value in (overrides or {}).items():
        kwargs[key] = value
    return kwargs


def moe_config_kwargs(shape: ModelShape) -> dict[str, Any]:
    """The MoE fields of ``TransformerConfig`` ({} for a dense model); see docs/design-notes.md."""
    e = shape.moe
    if e is None:
        return {}
    kwargs: dict[str, Any] = dict(
        num_moe_experts=e.num_experts,
        moe_router_topk=e.topk,
        moe_ffn_hidden_size=e.ffn_hidden_size,
        moe_layer_freq=list(e.layer_pattern),
        moe_router_score_function=e.score_function,
        moe_router_pre_softmax=e.pre_softmax,
        moe_router_enable_expert_bias=e.expert_bias,
        moe_router_num_groups=e.num_groups,
        moe_router_group_topk=e.group_topk,
        moe_router_topk_scaling_factor=e.topk_scaling_factor,
        moe_shared_expert_intermediate_size=e.shared_ffn_hidden_size,
        moe_shared_expert_gate=e.shared_gate,
        moe_router_dtype="fp32",
        moe_aux_loss_coeff=0.0,
        moe_grouped_gemm=False,
    )
    if e.expert_bias:
        kwargs["moe_router_bias_update_rate"] = 0.0
    return kwargs


def mla_config_kwargs(shape: ModelShape) -> dict[str, Any]:
    """The multi-latent-attention fields of ``MLATransformerConfig`` ({} without MLA)."""
    m = shape.mla
    if m is None:
        return {}
    kwargs: dict[str, Any] = dict(
        multi_latent_attention=True,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
        rotary_base=shape.rope_theta,
        rope_type="yarn" if m.yarn else "rope",
        rotary_scaling_factor=1.0,  # no YaRN: mscale 1, softmax scale 1/sqrt(q head dim) as in transformers
    )
    kwargs.update(m.yarn or {})
    return kwargs


def gpt_model_kwargs(shape: ModelShape, *, tp: int = 1) -> dict[str, Any]:
    """Keyword arguments of ``megatron.core.models.gpt.GPTModel`` besides config/spec/pre/post_process."""
    kwargs: dict[str, Any] = dict(
        vocab_size=padded_vocab_size(shape.vocab_size, tp),
        max_sequence_length=shape.max_position_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(shape.rope_theta) if float(shape.rope_theta).is_integer() else shape.rope_theta,
        share_embeddings_and_output_weights=shape.tie_embeddings,
        parallel_output=True,
    )
    if shape.rope_scaling_factor is not None:
        kwargs.update(rope_scaling=True, rope_scaling_factor=shape.rope_scaling_factor)
    return kwargs


def ddp_config_kwargs(train: Any) -> dict[str, Any]:
    """``DistributedDataParallelConfig`` kwargs from ``spec.train`` (fp32 gradient reduction)."""
    return dict(grad_reduce_in_fp32=True, use_distributed_optimizer=train.optimizer.distributed)


def optimizer_config_kwargs(train: Any, *, lr: float | None = None) -> dict[str, Any]:
    """``OptimizerConfig`` kwargs (AdamW; fp32 master weights for bf16/fp16) from ``spec.train``."""
    o = train.optimizer
    return dict(
        optimizer="adam",
        lr=o.lr if lr is None else lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        adam_eps=o.eps,
        clip_grad=o.clip_grad,
        bf16=train.precision == "bf16",
        fp16=train.precision == "fp16",
        params_dtype={"bf16": "bfloat16", "fp16": "float16"}.get(train.precision, "float32"),
        use_distributed_optimizer=o.distributed,
        **_offload_kwargs(train),
    )


def _offload_kwargs(train: Any) -> dict[str, Any]:
    """megatron-core's hybrid optimizer: its state and step on the host for ``train.megatron.optimizer_offload``
    of the parameters (Megatron-LM requires the precision-aware path with it; the copies overlap the step)."""
    fraction = train.megatron.optimizer_offload if getattr(train, "megatron", None) else 0.0
    if not fraction:
        return {}
    return dict(
        optimizer_cpu_offload=True,
        optimizer_offload_fraction=fraction,
        use_precision_aware_optimizer=True,
        overlap_cpu_optimizer_d2h_h2d=True,
    )


def scheduler_kwargs(train: Any, num_rollouts: int | None, *, lr: float | None = None) -> dict[str, Any]:
    """``OptimizerParamScheduler`` kwargs: linear warm-up then the spec's decay over all optimizer steps."""
    o = train.optimizer
    peak = o.lr if lr is None else lr
    total = max(1, (num_rollouts or 1) * (train.num_steps_per_rollout or 1))
    return dict(
        init_lr=0.0 if o.warmup_steps else peak,
        max_lr=peak,
        min_lr=o.min_lr,
        lr_warmup_steps=o.warmup_steps,
        lr_decay_steps=max(total, o.warmup_steps + 1),
        lr_decay_style=o.lr_schedule,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=total,
        wd_incr_style="constant",
    )


def describe(shape: ModelShape) -> dict[str, Any]:
    """The shape as a plain dict (for provenance and rendering)."""
    return asdict(shape)
