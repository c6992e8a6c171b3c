"""What the megatron backend can build from an HF ``config.json``: the model shape, and megatron-core's rules.

Pure Python (no torch, no megatron-core), so ``slime-submit validate``, ``render`` and the backend
run the same checks: a spec that validates with a readable ``model.path/config.json`` does not fail
them at launch. Families: qwen2, llama, qwen3, qwen3_moe, qwen2_moe, deepseek_v3 (checked against
megatron-core 0.16.1 and transformers 5); ``config.py`` turns a shape into arguments.
Refused with a clear problem rather than a silently different model: other model types, non-SiLU
activations, MLP/o_proj biases, sliding windows, rope scaling or router maths megatron-core cannot
reproduce. DeepSeek's multi-token-prediction layers are not built. Mapping: docs/design-notes.md.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "ATTENTION_BACKENDS",
    "FAMILIES",
    "VOCAB_MULTIPLE",
    "Finding",
    "MLAShape",
    "MegatronConfigError",
    "MoEShape",
    "ModelShape",
    "padded_vocab_size",
    "parallel_findings",
]

Finding = tuple[str, str, str | None]  # (spec field, message, hint), as slime.spec.rules yields them

FAMILIES = ("qwen2", "llama", "qwen3", "qwen2_moe", "qwen3_moe", "deepseek_v3")
VOCAB_MULTIPLE = 128
# Our own choices (te, sdpa) and megatron-core's AttnBackend names (flash, fused, unfused, local, auto).
ATTENTION_BACKENDS = ("auto", "te", "sdpa", "local", "flash", "fused", "unfused")
# llama3 rope scaling as megatron-core implements it (RotaryEmbedding._apply_scaling).
_MCORE_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_HF_MLA_NORM_EPS = 1e-6  # transformers' DeepseekV3 q_a/kv_a_layernorm use the RMSNorm default, not rms_norm_eps
_MODEL = "model.path"


class MegatronConfigError(ValueError):
    """The model or parallel layout cannot run on megatron-core; ``problems`` lists every reason."""

    def __init__(self, problems: list[str] | list[Finding]) -> None:
        self.findings: list[Finding] = [p if isinstance(p, tuple) else (_MODEL, p, None) for p in problems]
        self.problems = [msg for _, msg, _ in self.findings]
        super().__init__(
            "; ".join(self.problems)
            if len(self.problems) == 1
            else f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class MoEShape:
    """Routed experts (megatron-core ``MoELayer``) and what the router computes."""

    num_experts: int
    topk: int
    ffn_hidden_size: int  # per expert
    layer_pattern: tuple[int, ...]  # 1 = MoE layer, 0 = dense MLP (megatron's moe_layer_freq as a list)
    score_function: str = "softmax"  # or "sigmoid"
    pre_softmax: bool = False  # softmax before top-k (HF norm_topk_prob=False)
    expert_bias: bool = False  # DeepSeek's e_score_correction_bias (routing only)
    num_groups: int | None = None
    group_topk: int | None = None
    topk_scaling_factor: float | None = None
    shared_ffn_hidden_size: int | None = None
    shared_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert
    shared_prefix: str = "shared_expert"  # HF module name: Qwen "shared_expert", DeepSeek "shared_experts"
    hf_aux_loss_coef: float | None = None  # router_aux_loss_coef of config.json (informational)


@dataclass(frozen=True, kw_only=True, slots=True)
class MLAShape:
    """DeepSeek multi-latent attention (megatron-core ``MLASelfAttention``)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int  # HF qk_nope_head_dim
    qk_pos_emb_head_dim: int  # HF qk_rope_head_dim
    v_head_dim: int
    yarn: Mapping[str, float] | None = None  # megatron's YaRN fields when rope_type is yarn


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
    qk_layernorm: bool = False
    moe: MoEShape | None = None
    mla: MLAShape | None = None
    layer_offset: int = field(default=0)  # global index of layer 0 (a pipeline stage's shape)

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def qkv_rows(self) -> int:
        return (self.num_attention_heads + 2 * self.num_query_groups) * self.kv_channels

    def is_moe_layer(self, i: int) -> bool:
        """Whether stage-local layer ``i`` has routed experts."""
        return self.moe is not None and bool(self.moe.layer_pattern[i])

    def stage(self, first: int, count: int) -> ModelShape:
        """The shape of layers ``[first, first + count)`` as a model of their own (a pipeline stage)."""
        moe = self.moe and replace(self.moe, layer_pattern=self.moe.layer_pattern[first : first + count])
        return replace(self, num_layers=count, moe=moe, layer_offset=self.layer_offset + first)

    def num_params(self) -> int:
        """Parameters of the HF model (embedding and output counted once when tied)."""
        h, v = self.hidden_size, self.vocab_size
        total = h + v * h * (1 if self.tie_embeddings else 2)
        for i in range(self.num_layers):
            total += self._attention_params() + 2 * h + self._mlp_params(i)
        return total

    def _attention_params(self) -> int:
        h, m = self.hidden_size, self.mla
        if m is None:
            attn = h * self.qkv_rows + self.num_attention_heads * self.kv_channels * h
            attn += self.qkv_rows if self.qkv_bias else 0
            return attn + (2 * self.kv_channels if self.qk_layernorm else 0)
        n, qd = self.num_attention_heads, m.qk_head_dim + m.qk_pos_emb_head_dim
        q = h * n * qd if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * qd
        kv = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank
        kv += m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim)
        return q + kv + n * m.v_head_dim * h

    def _mlp_params(self, i: int) -> int:
        h = self.hidden_size
        if not self.is_moe_layer(i):
            return 3 * h * self.ffn_hidden_size
        e = self.moe
        total = e.num_experts * 3 * h * e.ffn_hidden_size + e.num_experts * h
        total += 3 * h * (e.shared_ffn_hidden_size or 0) + (h if e.shared_gate else 0)
        return total

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | Any) -> ModelShape:
        """Read an HF ``config.json`` dict (or a ``PretrainedConfig``); raise MegatronConfigError if unsupported."""
        cfg = dict(config) if isinstance(config, Mapping) else config.to_dict()
        family = cfg.get("model_type")
        if family not in FAMILIES:
            raise MegatronConfigError(
                [
                    f"config.json model_type {family!r} is not supported by the megatron backend; "
                    f"supported: {', '.join(FAMILIES)} (use train.backend: torch for others)"
                ]
            )
        reader = _Reader(cfg)
        base = _dense_fields(reader, family)
        moe = _moe_shape(reader, family, base["num_layers"])
        mla = _mla_shape(reader) if family == "deepseek_v3" else None
        if reader.problems:
            raise MegatronConfigError(reader.problems)
        return cls(**base, moe=moe, mla=mla)


class _Reader:
    """config.json values with every problem collected (never raising on the first)."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg, self.problems = cfg, []

    def get(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.cfg.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            self.problems.append(f"config.json {key}={value!r}: expected {what}")
            return max(minimum, 1)
        return value

    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.problems.append(message)


def _rope(r: _Reader) -> tuple[float, str, dict[str, Any]]:
    rope = r.get("rope_parameters") or r.get("rope_scaling") or {}
    theta = rope.get("rope_theta", r.get("rope_theta", 10000.0))
    return float(theta), rope.get("rope_type", rope.get("type", "default")) or "default", rope


def _dense_fields(r: _Reader, family: str) -> dict[str, Any]:
    hidden, layers, heads = r.int("hidden_size"), r.int("num_hidden_layers"), r.int("num_attention_heads")
    vocab, ffn = r.int("vocab_size"), r.int("intermediate_size")
    groups = r.get("num_key_value_heads") or heads
    head_dim = r.get("head_dim") or hidden // heads
    mla = family == "deepseek_v3"
    if mla:
        groups, head_dim = heads, r.get("v_head_dim") or head_dim  # MLA has no query groups
    r.need(mla or heads % groups == 0, f"num_attention_heads={heads} is not a multiple of num_key_value_heads={groups}")
    r.need(
        r.get("hidden_act", "silu") == "silu", f"hidden_act={r.get('hidden_act')!r}: only 'silu' (SwiGLU) is supported"
    )
    r.need(
        not r.get("mlp_bias"), "mlp_bias=true is not supported (megatron would need add_bias_linear for every linear)"
    )
    if family in ("llama", "qwen3", "qwen3_moe", "deepseek_v3"):
        r.need(not r.get("attention_bias"), f"attention_bias=true on a {family} model (o_proj bias) is not supported")
    qkv_bias = family == "qwen2" or (family == "qwen2_moe" and bool(r.get("qkv_bias", True)))
    sliding = r.get("use_sliding_window") or any(t != "full_attention" for t in r.get("layer_types") or ())
    r.need(not sliding, "sliding-window attention layers are not supported")
    theta, rope_type, rope = _rope(r)
    factor = None
    if rope_type == "llama3" and not mla:
        mismatched = {k: rope.get(k) for k, v in _MCORE_LLAMA3_ROPE.items() if float(rope.get(k, v)) != v}
        r.need(
            not mismatched,
            f"llama3 rope scaling with {mismatched} differs from megatron-core's fixed {_MCORE_LLAMA3_ROPE}",
        )
        factor = float(rope.get("factor", 8.0))
    elif rope_type != "default" and not (mla and rope_type == "yarn"):
        allowed = "'default' and 'yarn'" if mla else "'default' and 'llama3'"
        r.problems.append(f"rope_type={rope_type!r} is not supported for {family} (only {allowed})")
    return dict(
        family=family,
        vocab_size=vocab,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_layers=layers,
        num_attention_heads=heads,
        num_query_groups=int(groups),
        kv_channels=int(head_dim),
        rope_theta=theta,
        norm_eps=float(r.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(r.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        max_position_embeddings=int(r.get("max_position_embeddings") or 4096),
        rope_scaling_factor=factor,
        qk_layernorm=family in ("qwen3", "qwen3_moe", "deepseek_v3"),
    )


def _moe_shape(r: _Reader, family: str, layers: int) -> MoEShape | None:
    if family in ("qwen3_moe", "qwen2_moe"):
        experts = r.int("num_experts" if "num_experts" in r.cfg else "num_local_experts")
        topk, step = r.int("num_experts_per_tok"), r.int("decoder_sparse_step", 1)
        dense = set(r.get("mlp_only_layers") or ())
        pattern = tuple(int(i not in dense and (i + 1) % step == 0) for i in range(layers))
        norm = bool(r.get("norm_topk_prob", family == "qwen3_moe"))
        # megatron: softmax over the top-k logits (= normalised top-k) unless pre-softmax; at k=1 it
        # demands pre-softmax (TransformerConfig), which HF's normalised k=1 (weight 1) is not.
        r.need(
            not (norm and topk == 1), "norm_topk_prob=true with num_experts_per_tok=1 cannot be expressed in megatron"
        )
        shared = r.int("shared_expert_intermediate_size") if family == "qwen2_moe" else None
        return MoEShape(
            num_experts=experts,
            topk=topk,
            ffn_hidden_size=r.int("moe_intermediate_size"),
            layer_pattern=pattern,
            pre_softmax=not norm,
            shared_ffn_hidden_size=shared,
            shared_gate=shared is not None,
            hf_aux_loss_coef=r.get("router_aux_loss_coef"),
        )
    if family != "deepseek_v3":
        return None
    return _deepseek_moe(r, layers)


def _deepseek_moe(r: _Reader, layers: int) -> MoEShape:
    experts = r.int("n_routed_experts" if "n_routed_experts" in r.cfg else "num_local_experts")
    topk, ffn = r.int("num_experts_per_tok"), r.int("moe_intermediate_size")
    first_dense = r.int("first_k_dense_replace", 0, minimum=0)
    r.need(r.get("moe_layer_freq", 1) == 1, f"moe_layer_freq={r.get('moe_layer_freq')!r}: only 1 is supported")
    r.need(r.get("scoring_func", "sigmoid") == "sigmoid", f"scoring_func={r.get('scoring_func')!r}: only sigmoid")
    r.need(r.get("topk_method", "noaux_tc") == "noaux_tc", f"topk_method={r.get('topk_method')!r}: only noaux_tc")
    # megatron normalises sigmoid top-k weights whenever k > 1 and never at k = 1 (topk_routing_with_score_function)
    norm = bool(r.get("norm_topk_prob", True))
    r.need(norm == (topk > 1), f"norm_topk_prob={norm} with num_experts_per_tok={topk}: megatron normalises iff k > 1")
    groups, group_topk = r.int("n_group", 1), r.int("topk_group", 1)
    if groups > 1:
        r.need(experts % groups == 0, f"n_routed_experts={experts} is not divisible by n_group={groups}")
        r.need(group_topk <= groups, f"topk_group={group_topk} is above n_group={groups}")
        # HF scores a group by its top-2 experts; megatron by its top (topk // group_topk)
        r.need(
            topk == 2 * group_topk,
            f"num_experts_per_tok={topk} with topk_group={group_topk}: megatron scores a group by its top "
            f"{topk // max(group_topk, 1)} experts, transformers' DeepseekV3 by its top 2",
        )
    shared = r.int("n_shared_experts", 0, minimum=0)
    scale = float(r.get("routed_scaling_factor", 1.0))
    return MoEShape(
        num_experts=experts,
        topk=topk,
        ffn_hidden_size=ffn,
        layer_pattern=tuple(int(i >= first_dense) for i in range(layers)),
        score_function="sigmoid",
        expert_bias=True,
        num_groups=groups if groups > 1 else None,
        group_topk=group_topk if groups > 1 else None,
        topk_scaling_factor=scale if scale != 1.0 else None,
        shared_ffn_hidden_size=shared * ffn if shared else None,
        shared_prefix="shared_experts",
    )


def _mla_shape(r: _Reader) -> MLAShape:
    q_lora = r.get("q_lora_rank")
    if q_lora is not None:
        q_lora = r.int("q_lora_rank")
    r.need(bool(r.get("rope_interleave", True)), "rope_interleave=false: megatron's MLA rotary is the interleaved one")
    r.need(
        float(r.get("rms_norm_eps", 1e-6)) == _HF_MLA_NORM_EPS,
        f"rms_norm_eps={r.get('rms_norm_eps')}: transformers' q_a/kv_a norms use {_HF_MLA_NORM_EPS}, "
        "megatron one epsilon for every norm",
    )
    _, rope_type, rope = _rope(r)
    yarn = None
    if rope_type == "yarn":
        yarn = {
            "rotary_scaling_factor": float(rope.get("factor", 1.0)),
            "original_max_position_embeddings": int(rope.get("original_max_position_embeddings", 4096)),
            "beta_fast": float(rope.get("beta_fast", 32)),
            "beta_slow": float(rope.get("beta_slow", 1)),
            "mscale": float(rope.get("mscale", 1.0)),
            "mscale_all_dim": float(rope.get("mscale_all_dim", 0.0)),
        }
    return MLAShape(
        q_lora_rank=q_lora,
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_head_dim=r.int("qk_nope_head_dim"),
        qk_pos_emb_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
        yarn=yarn,
    )


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = VOCAB_MULTIPLE) -> int:
    """Round ``vocab_size`` up to a multiple of ``multiple * tp`` (what Megatron-LM does)."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def parallel_findings(
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int | None = None,
    sequence_parallel: bool = False,
    world_size: int | None = None,
    seq_length: int | None = None,
    attention_backend: str | None = None,
) -> list[Finding]:
    """Every way the layout fails megatron-core's own checks, each at its spec field, naming the numbers."""
    out = _dense_findings(shape, tp=tp, pp=pp, sequence_parallel=sequence_parallel)
    out += _moe_findings(shape, tp=tp, ep=ep, etp=etp or tp, sequence_parallel=sequence_parallel)
    out += _mla_findings(shape, tp=tp, cp=cp, sequence_parallel=sequence_parallel)
    if cp > 1:
        backend = attention_backend or ("te" if has_transformer_engine() else "sdpa")
        if backend not in ("te", "sdpa", "flash", "fused"):
            out.append(
                (
                    "train.parallel.context",
                    f"train.parallel.context={cp} needs Transformer Engine or SDPA attention (backend is {backend!r})",
                    "set train.megatron.args.attention-backend to auto, te or sdpa",
                )
            )
        if seq_length is not None and seq_length % (2 * cp):
            out.append(
                (
                    "train.parallel.context",
                    f"sequence length {seq_length} is not divisible by 2 x train.parallel.context={2 * cp}",
                    None,
                )
            )
    if world_size is not None and world_size % (tp * pp * cp):
        out.append(
            (
                "train.parallel.tensor",
                f"trainer world size {world_size} is not divisible by tensor x pipeline x context = "
                f"{tp} x {pp} x {cp} = {tp * pp * cp}",
                None,
            )
        )
    return out


def _dense_findings(shape: ModelShape, *, tp: int, pp: int, sequence_parallel: bool) -> list[Finding]:
    out: list[Finding] = []
    heads, groups = shape.num_attention_heads, shape.num_query_groups
    if heads % tp or (shape.mla is None and groups % tp):
        both = shape.mla is None and groups != heads
        out.append(
            (
                "train.parallel.tensor",
                f"train.parallel.tensor={tp} does not divide the model's {heads} attention heads"
                + (f" and {groups} key/value heads (query groups)" if both else "")
                + " (megatron-core splits them across the tensor-parallel ranks)",
                f"choose a tensor size that divides {f'{heads} and {groups}' if both else heads}",
            )
        )
    dense_layers = shape.moe is None or not all(shape.moe.layer_pattern)
    if dense_layers and shape.ffn_hidden_size % tp:
        out.append(
            (
                "train.parallel.tensor",
                f"train.parallel.tensor={tp} does not divide the model's intermediate_size={shape.ffn_hidden_size}",
                None,
            )
        )
    if shape.num_layers % pp:
        out.append(
            (
                "train.parallel.pipeline",
                f"train.parallel.pipeline={pp} does not divide the model's {shape.num_layers} layers",
                "choose a pipeline size that divides num_hidden_layers",
            )
        )
    if sequence_parallel and tp == 1:
        out.append(
            (
                "train.parallel.sequence_parallel",
                "train.parallel.sequence_parallel needs train.parallel.tensor > 1",
                None,
            )
        )
    return out


def _moe_findings(shape: ModelShape, *, tp: int, ep: int, etp: int, sequence_parallel: bool) -> list[Finding]:
    e = shape.moe
    if e is None:
        if ep > 1:
            return [
                (
                    "train.parallel.expert",
                    f"train.parallel.expert={ep} on a model without experts ({shape.family}); megatron-core "
                    "refuses expert parallelism without num_moe_experts",
                    "set train.parallel.expert: 1",
                )
            ]
        return []
    out: list[Finding] = []
    if e.num_experts % ep:
        out.append(
            (
                "train.parallel.expert",
                f"train.parallel.expert={ep} does not divide the model's {e.num_experts} experts",
                "choose an expert-parallel size that divides the expert count",
            )
        )
    if e.topk > e.num_experts:
        out.append((_MODEL, f"num_experts_per_tok={e.topk} is above the {e.num_experts} experts", None))
    if e.ffn_hidden_size % etp:
        out.append(
            (
                "train.parallel.expert_tensor",
                f"moe_intermediate_size={e.ffn_hidden_size} is not divisible by train.parallel.expert_tensor={etp}",
                "choose an expert_tensor size that divides it (it defaults to train.parallel.tensor)",
            )
        )
    if e.shared_ffn_hidden_size and e.shared_ffn_hidden_size % tp:
        out.append(
            (
                "train.parallel.tensor",
                f"the shared experts' size {e.shared_ffn_hidden_size} is not divisible by train.parallel.tensor={tp}",
                None,
            )
        )
    if tp > 1 and not sequence_parallel:
        # MoELayer.forward raises in training when tensor parallel > 1 runs without sequence parallel
        out.append(
            (
                "train.parallel.sequence_parallel",
                f"a MoE model with train.parallel.tensor={tp} needs sequence parallelism (megatron-core's "
                "MoE layer refuses to train without it)",
                "set train.parallel.sequence_parallel: true",
            )
        )
    return out


def _mla_findings(shape: ModelShape, *, tp: int, cp: int, sequence_parallel: bool) -> list[Finding]:
    if shape.mla is None:
        return []
    out: list[Finding] = []
    if tp > 1 and not sequence_parallel:
        # the down-projections are replicated: the rope key's gradient is summed over the heads of every
        # tensor-parallel rank only through sequence parallelism's gather (slime/backends/megatron/attention.py)
        out.append(
            (
                "train.parallel.sequence_parallel",
                f"multi-latent attention with train.parallel.tensor={tp} needs sequence parallelism",
                "set train.parallel.sequence_parallel: true",
            )
        )
    if cp > 1:
        out.append(
            (
                "train.parallel.context",
                "context parallelism with multi-latent attention is not supported by this backend",
                "set train.parallel.context: 1",
            )
        )
    return out
