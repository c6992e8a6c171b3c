"""The model's sizes the memory estimate needs, read from an HF config.json (dense, MoE, MLA).

Its own small reader rather than ``slime.backends.megatron.model_check.ModelShape``: the spec layer
may not import a backend; tests check that both count the same parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Dims", "dims_from_config"]

VOCAB_MULTIPLE = 128  # megatron pads the vocabulary to a multiple of this x tensor parallel


@dataclass(frozen=True, kw_only=True, slots=True)
class Dims:
    """Sizes of a decoder-only transformer (counts of parameters are per layer, before any sharding)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # dense MLP width
    vocab: int
    tied: bool
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    moe_pattern: tuple[int, ...] = ()  # 1 = layer i has routed experts (empty: dense model)
    kv_lora_rank: int = 0  # MLA: the latent a token keeps in the KV cache (0 = not MLA)
    rope_dim: int = 0  # MLA: the decoupled rope key dim
    attn_params: int = 0  # per layer (q/k/v/o and their norms and biases)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        return sum(self.moe_pattern)

    def is_moe(self, i: int) -> bool:
        return bool(self.moe_pattern) and bool(self.moe_pattern[i])

    @property
    def expert_params(self) -> int:
        """Routed-expert parameters of one MoE layer."""
        return self.experts * 3 * self.hidden * self.moe_ffn

    def layer_params(self, moe: bool) -> int:
        """Parameters of one layer outside the routed experts (attention, norms, router, shared or dense MLP)."""
        mlp = 3 * self.hidden * (self.shared_ffn if moe else self.ffn) + (self.experts * self.hidden if moe else 0)
        return self.attn_params + 2 * self.hidden + mlp

    def dense_params(self) -> int:
        """Every parameter but the routed experts (embedding and output counted once when tied)."""
        body = sum(self.layer_params(self.is_moe(i)) for i in range(self.layers))
        return body + self.hidden + self.vocab * self.hidden * (1 if self.tied else 2)

    def total_params(self) -> int:
        return self.dense_params() + self.moe_layers * self.expert_params

    def ffn_active(self, moe: bool) -> int:
        """MLP width a token passes through (routed: top-k experts plus the shared one)."""
        return self.topk * self.moe_ffn + self.shared_ffn if moe else self.ffn


def _int(cfg: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _moe_pattern(cfg: Mapping[str, Any], layers: int) -> tuple[int, ...]:
    if "first_k_dense_replace" in cfg:  # DeepSeek: the first k layers are dense
        return tuple(int(i >= _int(cfg, "first_k_dense_replace")) for i in range(layers))
    step, dense = max(1, _int(cfg, "decoder_sparse_step", default=1)), set(cfg.get("mlp_only_layers") or ())
    return tuple(int(i not in dense and (i + 1) % step == 0) for i in range(layers))


def _attention(cfg: Mapping[str, Any], h: int, heads: int, kv: int, hd: int) -> int:
    if cfg.get("kv_lora_rank"):
        qlr, klr = _int(cfg, "q_lora_rank"), _int(cfg, "kv_lora_rank")
        qd = _int(cfg, "qk_nope_head_dim") + _int(cfg, "qk_rope_head_dim")
        q = h * heads * qd if not qlr else h * qlr + qlr + qlr * heads * qd
        kvp = h * (klr + _int(cfg, "qk_rope_head_dim")) + klr + klr * heads * (_int(cfg, "qk_nope_head_dim") + hd)
        return q + kvp + heads * hd * h
    rows = (heads + 2 * kv) * hd
    bias = rows if cfg.get("model_type") in ("qwen2", "qwen2_moe") or cfg.get("attention_bias") else 0
    qk_norm = 2 * hd if cfg.get("model_type") in ("qwen3", "qwen3_moe") else 0
    return h * rows + heads * hd * h + bias + qk_norm


def dims_from_config(cfg: Mapping[str, Any] | None) -> Dims | None:
    """The sizes in an HF config.json dict, or None when it lacks the basic ones."""
    cfg = cfg or {}
    h, layers, heads = _int(cfg, "hidden_size"), _int(cfg, "num_hidden_layers"), _int(cfg, "num_attention_heads")
    vocab = _int(cfg, "vocab_size")
    if min(h, layers, heads, vocab) < 1:
        return None
    mla = bool(cfg.get("kv_lora_rank"))
    kv = heads if mla else _int(cfg, "num_key_value_heads", default=heads)
    hd = _int(cfg, "v_head_dim") if mla else _int(cfg, "head_dim", default=h // heads)
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts")
    shared = _int(cfg, "shared_expert_intermediate_size")
    if experts and not shared and cfg.get("n_shared_experts"):
        shared = _int(cfg, "n_shared_experts") * _int(cfg, "moe_intermediate_size")
    return Dims(
        hidden=h,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        head_dim=hd,
        ffn=_int(cfg, "intermediate_size", default=4 * h),
        vocab=vocab,
        tied=bool(cfg.get("tie_word_embeddings", False)),
        experts=experts,
        topk=_int(cfg, "num_experts_per_tok") if experts else 0,
        moe_ffn=_int(cfg, "moe_intermediate_size") if experts else 0,
        shared_ffn=shared,
        moe_pattern=_moe_pattern(cfg, layers) if experts else (),
        kv_lora_rank=_int(cfg, "kv_lora_rank") if mla else 0,
        rope_dim=_int(cfg, "qk_rope_head_dim") if mla else 0,
        attn_params=_attention(cfg, h, heads, kv, hd),
    )
