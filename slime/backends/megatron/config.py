"""HF config (Qwen2 / Llama families) → megatron-core model arguments, plus the parallel rules.

Pure Python: importing this module imports neither torch nor megatron-core, so
the CLI's ``render`` and the spec validator can use it. The one function that
needs megatron-core (:func:`build_transformer_config`) imports it lazily.

Mapping (HF → megatron-core ``TransformerConfig`` / ``GPTModel``):

==========================  ===========================================
hidden_size                 hidden_size
intermediate_size           ffn_hidden_size
num_hidden_layers           num_layers
num_attention_heads         num_attention_heads
num_key_value_heads         num_query_groups (GQA; = heads when absent)
head_dim (or hidden/heads)  kv_channels
rms_norm_eps                layernorm_epsilon, normalization="RMSNorm"
hidden_act == "silu"        gated_linear_unit=True, activation_func=silu (SwiGLU)
rope theta                  GPTModel rotary_base (position_embedding_type="rope")
rope_type "llama3"          GPTModel rope_scaling=True, rope_scaling_factor
tie_word_embeddings         GPTModel share_embeddings_and_output_weights
Qwen2 (always)              add_qkv_bias=True; no other linear has a bias
vocab_size                  padded up to a multiple of 128 x TP (rows are zeros;
                            their logits are masked before any softmax)
==========================  ===========================================

Attention backend (``train.backend_args.attention-backend``: auto|te|sdpa|local):
``auto`` picks Transformer Engine's fused attention when ``transformer_engine``
is importable, else ``sdpa`` — our core-attention module calling
``torch.nn.functional.scaled_dot_product_attention`` (flash/efficient kernels,
causal, GQA without materialising repeated K/V) plugged into the local layer
spec. ``local`` is megatron's unfused softmax(QK^T)V, measured ~3x slower than
SDPA on an H200 (team notes); it exists for comparisons only.

Guaranteed: every rule violation is reported at once, each naming the numbers
involved and the spec field to change. Not supported (rejected with a clear
error rather than silently wrong): sliding-window attention, biased MLP/o_proj,
rope scaling other than default/llama3 (megatron hard-codes llama3's
low/high-frequency factors 1/4 and original context 8192), context parallel
without Transformer Engine.
"""

from __future__ import annotations

import difflib
import importlib.util
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "ATTENTION_BACKENDS",
    "FAMILIES",
    "VOCAB_MULTIPLE",
    "MegatronConfigError",
    "ModelShape",
    "RankCoords",
    "build_transformer_config",
    "check_parallel",
    "choose_attention_backend",
    "ddp_config_kwargs",
    "describe",
    "gpt_model_kwargs",
    "optimizer_config_kwargs",
    "padded_vocab_size",
    "parallel_problems",
    "rank_coords",
    "scheduler_kwargs",
    "split_backend_args",
    "transformer_config_kwargs",
]

FAMILIES = ("qwen2", "llama")
VOCAB_MULTIPLE = 128
ATTENTION_BACKENDS = ("auto", "te", "sdpa", "local")
# llama3 rope scaling as megatron-core implements it (RotaryEmbedding._apply_scaling).
_MCORE_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
# backend_args keys we consume ourselves (everything else goes to TransformerConfig).
_OWN_ARGS = {"attention_backend"}


class MegatronConfigError(ValueError):
    """The model or parallel layout cannot run on megatron-core; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "; ".join(self.problems)
            if len(self.problems) == 1
            else f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """The architecture facts both the model builder and the weight converter need."""

    family: str
    vocab_size: int
    hidden_size: int
    ffn_hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    rope_theta: float
    norm_eps: float
    tie_embeddings: bool
    qkv_bias: bool
    max_position_embeddings: int
    rope_scaling_factor: float | None = None  # llama3-style scaling when set

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.kv_channels

    def num_params(self) -> int:
        """Parameters of the HF model (embedding and output counted once when tied)."""
        h, f, v = self.hidden_size, self.ffn_hidden_size, self.vocab_size
        attn = h * self.qkv_rows + self.num_attention_heads * self.kv_channels * h
        attn += self.qkv_rows if self.qkv_bias else 0
        layer = attn + 3 * h * f + 2 * h
        return self.num_layers * layer + h + v * h * (1 if self.tie_embeddings else 2)

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> ModelShape:
        """Read an HF ``config.json`` dict (or a ``PretrainedConfig``); raise MegatronConfigError if unsupported."""
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        problems: list[str] = []
        family = cfg.get("model_type")
        if family not in FAMILIES:
            raise MegatronConfigError(
                [
                    f"model_type {family!r} is not supported by the megatron backend; "
                    f"supported: {', '.join(FAMILIES)} (use train.backend: torch for others)"
                ]
            )

        def need_int(key: str) -> int:
            value = cfg.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"config.json {key}={value!r}: expected a positive integer")
                return 1
            return value

        hidden = need_int("hidden_size")
        ffn = need_int("intermediate_size")
        layers = need_int("num_hidden_layers")
        heads = need_int("num_attention_heads")
        vocab = need_int("vocab_size")
        groups = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or (hidden // heads if heads else 0)
        if heads and groups and heads % groups:
            problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={groups}")
        if cfg.get("hidden_act", "silu") != "silu":
            problems.append(f"hidden_act={cfg.get('hidden_act')!r}: only 'silu' (SwiGLU) is supported")
        if cfg.get("mlp_bias"):
            problems.append("mlp_bias=true is not supported (megatron would need add_bias_linear for every linear)")
        qkv_bias = family == "qwen2"
        if family == "llama" and cfg.get("attention_bias"):
            problems.append("attention_bias=true on a Llama model (o_proj bias) is not supported")
        if cfg.get("use_sliding_window") or any(t != "full_attention" for t in cfg.get("layer_types") or ()):
            problems.append("sliding-window attention layers are not supported")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
        factor = None
        if rope_type == "llama3":
            mismatched = {k: rope.get(k) for k, v in _MCORE_LLAMA3_ROPE.items() if float(rope.get(k, v)) != v}
            if mismatched:
                problems.append(
                    f"llama3 rope scaling with {mismatched} differs from megatron-core's fixed {_MCORE_LLAMA3_ROPE}"
                )
            factor = float(rope.get("factor", 8.0))
        elif rope_type != "default":
            problems.append(f"rope_type={rope_type!r} is not supported (only 'default' and 'llama3')")
        if problems:
            raise MegatronConfigError(problems)
        return cls(
            family=family,
            vocab_size=vocab,
            hidden_size=hidden,
            ffn_hidden_size=ffn,
            num_layers=layers,
            num_attention_heads=heads,
            num_query_groups=int(groups),
            kv_channels=int(head_dim),
            rope_theta=float(theta),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
            rope_scaling_factor=factor,
        )


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Round ``vocab_size`` up to a multiple of ``multiple * tp`` (what Megatron-LM does)."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def parallel_problems(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    world_size: int | None = None,
    seq_length: int | None = None,
    attention_backend: str | None = None,
) -> list[str]:
    """Every way the layout fails megatron-core's rules, each naming the numbers and the field."""
    out = []
    if shape.num_attention_heads % tp:
        out.append(f"num_attention_heads={shape.num_attention_heads} is not divisible by train.parallel.tensor={tp}")
    if shape.num_query_groups % tp:
        out.append(
            f"num_key_value_heads (query groups)={shape.num_query_groups} is not divisible by "
            f"train.parallel.tensor={tp}; use a tensor size that divides it"
        )
    if shape.ffn_hidden_size % tp:
        out.append(f"intermediate_size={shape.ffn_hidden_size} is not divisible by train.parallel.tensor={tp}")
    if shape.num_layers % pp:
        out.append(f"num_hidden_layers={shape.num_layers} is not divisible by train.parallel.pipeline={pp}")
    if padded_vocab_size(shape.vocab_size, tp) % tp:  # cannot happen; kept as the stated rule
        out.append(f"padded vocab is not divisible by train.parallel.tensor={tp}")
    if sequence_parallel and tp == 1:
        out.append("train.parallel.sequence_parallel needs train.parallel.tensor > 1")
    if cp > 1:
        backend = attention_backend or choose_attention_backend("auto")
        if backend not in ("te", "sdpa"):
            out.append(
                f"train.parallel.context={cp} needs Transformer Engine or SDPA attention (backend is "
                f"{backend!r}); set train.backend_args.attention-backend to auto, te or sdpa"
            )
        if seq_length is not None and seq_length % (2 * cp):
            out.append(f"sequence length {seq_length} is not divisible by 2 x train.parallel.context={2 * cp}")
    if world_size is not None and world_size % (tp * pp * cp):
        out.append(
            f"trainer world size {world_size} is not divisible by tensor x pipeline x context = "
            f"{tp} x {pp} x {cp} = {tp * pp * cp}"
        )
    return out


def check_parallel(shape: ModelShape, **kwargs: Any) -> None:
    """Raise MegatronConfigError listing every :func:`parallel_problems` entry (if any)."""
    problems = parallel_problems(shape, **kwargs)
    if problems:
        raise MegatronConfigError(problems)


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


def choose_attention_backend(requested: str = "auto") -> str:
    """'te' when Transformer Engine is importable (for 'auto'), else 'sdpa'; explicit choices are checked."""
    if requested not in ATTENTION_BACKENDS:
        raise MegatronConfigError(
            [f"train.backend_args.attention-backend={requested!r}: valid values are {', '.join(ATTENTION_BACKENDS)}"]
        )
    has_te = importlib.util.find_spec("transformer_engine") is not None
    if requested == "auto":
        return "te" if has_te else "sdpa"
    if requested == "te" and not has_te:
        raise MegatronConfigError(
            ["train.backend_args.attention-backend=te but transformer_engine is not installed; use 'auto' or 'sdpa'"]
        )
    return requested


def split_backend_args(backend_args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``train.backend_args`` → (our own options, TransformerConfig overrides); '-' becomes '_'."""
    ours, overrides = {}, {}
    for key, value in backend_args.items():
        name = key.replace("-", "_")
        (ours if name in _OWN_ARGS else overrides)[name] = value
    return ours, overrides


def transformer_config_kwargs(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    precision: str = "bf16",
    attention_backend: str = "sdpa",
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``megatron.core.transformer.TransformerConfig`` (activation as the name 'silu')."""
    te = attention_backend == "te"
    kwargs: dict[str, Any] = dict(
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
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        sequence_parallel=sequence_parallel,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        params_dtype={"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32"),
        pipeline_dtype={"bf16": "bfloat16", "fp16": "float16"}.get(precision, "float32"),
        # Pipeline stages exchange activations whose length varies per micro-batch.
        variable_seq_lengths=pp > 1,
        # Fusions that need Transformer Engine or apex kernels are off without TE.
        apply_rope_fusion=te,
        masked_softmax_fusion=te,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        persist_layer_norm=False,
    )
    if pp > 1:
        kwargs["moe_token_dispatcher_type"] = "alltoall"  # megatron rejects its default with variable lengths
    for key, value in (overrides or {}).items():
        kwargs[key] = value
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


def build_transformer_config(kwargs: Mapping[str, Any]):
    """Instantiate ``TransformerConfig`` (imports megatron-core); unknown keys get a clear error."""
    import dataclasses

    import torch
    from megatron.core.transformer import TransformerConfig

    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    unknown = [k for k in kwargs if k not in fields]
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(k, sorted(fields), n=1)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise MegatronConfigError(
            [f"train.backend_args: unknown megatron-core TransformerConfig option(s) {', '.join(hints)}"]
        )
    resolved = dict(kwargs)
    if resolved.get("activation_func") == "silu":
        resolved["activation_func"] = torch.nn.functional.silu
    for key in ("params_dtype", "pipeline_dtype"):
        if isinstance(resolved.get(key), str):
            resolved[key] = getattr(torch, resolved[key])
    return TransformerConfig(**resolved)


def describe(shape: ModelShape) -> dict[str, Any]:
    """The shape as a plain dict (for provenance and rendering)."""
    return asdict(shape)
