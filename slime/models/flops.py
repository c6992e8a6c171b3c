"""Model FLOPs of a decoder-only transformer from its HF ``config.json``: dense, MoE and MLA.

The standard count (Kaplan et al.; PaLM appendix B; Megatron's MFU): a matmul is ``2·m·n·k``, a
training pass 3 forward passes, so a step costs ``6·N·T`` for the matmul parameters a token meets
(LM head, routed experts only) plus causal attention (half the square). MLA formulas apply only
when ``config.json`` sets ``kv_lora_rank``. Not counted: norms, activations, softmax, rotary, the
embedding lookup, the optimizer, recomputation (these are *model* FLOPs, what MFU divides), padding.
Assumes a gated MLP; an unreadable config gives ``None``. Formulas: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["TRAIN_PASSES", "Mla", "ModelShape", "forward_flops", "model_shape"]

TRAIN_PASSES = 3  # forward + backward (2 × forward)


@dataclass(frozen=True, kw_only=True, slots=True)
class Mla:
    """Multi-head latent attention sizes (DeepSeek-V2/V3)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelShape:
    """What the FLOPs depend on. ``moe_layers`` of the ``layers`` are MoE layers, the rest dense."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense intermediate size
    vocab: int
    moe_layers: int = 0
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0  # one expert's intermediate size
    shared_ffn: int = 0  # shared experts' total intermediate size
    mla: Mla | None = None

    def without_lm_head(self) -> ModelShape:
        """The same backbone with a scalar head (a critic's value head): ``vocab = 1``."""
        return replace(self, vocab=1)


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _moe_layer_count(cfg: Mapping[str, Any], layers: int) -> int:
    """Layers with routed experts: DeepSeek (``first_k_dense_replace``, ``moe_layer_freq``), Qwen-MoE
    (``decoder_sparse_step``, ``mlp_only_layers``), else every layer (Mixtral)."""
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        first = _int(cfg, "first_k_dense_replace", default=0) or 0
        freq = _int(cfg, "moe_layer_freq", default=1) or 1
        return sum(1 for i in range(first, layers) if i % freq == 0)
    step = _int(cfg, "decoder_sparse_step", default=1) or 1
    only_dense = set(cfg.get("mlp_only_layers") or ())
    return sum(1 for i in range(layers) if (i + 1) % step == 0 and i not in only_dense)


def _mla(cfg: Mapping[str, Any]) -> Mla | None:
    kv_lora = _int(cfg, "kv_lora_rank")
    if not kv_lora:  # absent or null: not an MLA model, whatever other MLA-looking keys it carries
        return None
    return Mla(
        q_lora_rank=_int(cfg, "q_lora_rank"),
        kv_lora_rank=kv_lora,
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0) or 0,
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0) or 0,
        v_head_dim=_int(cfg, "v_head_dim", default=0) or 0,
    )


def model_shape(cfg: Mapping[str, Any]) -> ModelShape | None:
    """The shape of an HF causal-LM ``config.json`` (a VLM's ``text_config`` too); None if unreadable."""
    if isinstance(cfg.get("text_config"), Mapping) and "hidden_size" not in cfg:
        cfg = cfg["text_config"]
    hidden, layers = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers")
    heads, vocab = _int(cfg, "num_attention_heads"), _int(cfg, "vocab_size")
    if not (hidden and layers and heads and vocab):
        return None
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0) or 0
    topk = _int(cfg, "num_experts_per_tok", "moe_topk", default=0) or 0
    moe_ffn = _int(cfg, "moe_intermediate_size", default=0) or 0
    if experts and not moe_ffn:  # Mixtral: every expert is an ordinary MLP
        moe_ffn = _int(cfg, "intermediate_size", default=0) or 0
    shared = _int(cfg, "shared_expert_intermediate_size", default=0) or 0
    if not shared and _int(cfg, "n_shared_experts"):
        shared = (_int(cfg, "n_shared_experts") or 0) * moe_ffn
    return ModelShape(
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", default=heads) or heads,
        head_dim=_int(cfg, "head_dim", default=hidden // heads) or hidden // heads,
        ffn=_int(cfg, "intermediate_size", default=0) or 0,
        vocab=vocab,
        moe_layers=_moe_layer_count(cfg, layers) if experts and topk else 0,
        experts=experts,
        topk=topk,
        moe_ffn=moe_ffn,
        shared_ffn=shared,
        mla=_mla(cfg),
    )


def _attention(m: ModelShape, s: int) -> float:
    """One layer's attention FLOPs (projections + causal core) for a sequence of ``s`` tokens."""
    h, H = m.hidden, m.heads
    if m.mla is None:
        d = m.head_dim
        return 2 * s * h * d * (H + 2 * m.kv_heads) + 2 * s * H * d * h + 2 * s * s * H * d
    a = m.mla
    qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    q = 2 * s * (h * a.q_lora_rank + a.q_lora_rank * H * qk) if a.q_lora_rank else 2 * s * h * H * qk
    kv = 2 * s * (h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * H * (a.qk_nope_head_dim + a.v_head_dim))
    return q + kv + 2 * s * H * a.v_head_dim * h + s * s * H * (qk + a.v_head_dim)


def forward_flops(m: ModelShape, lengths: Iterable[int]) -> float:
    """Forward FLOPs of sequences of these lengths (each its own causal sequence; see the module doc)."""
    h = m.hidden
    dense_mlp = 6 * h * m.ffn
    moe_mlp = 6 * h * (m.topk * m.moe_ffn + m.shared_ffn) + 2 * h * m.experts
    per_token = (m.layers - m.moe_layers) * dense_mlp + m.moe_layers * moe_mlp + 2 * h * m.vocab
    total = 0.0
    for s in lengths:
        total += s * per_token + m.layers * _attention(m, s)
    return float(total)
