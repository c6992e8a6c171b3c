"""A causal LM in plain torch for the Llama-family checkpoints the CPU path runs, loaded without transformers.

Why: importing transformers' modeling code is a large share of every run's start-up, paid by the
trainer rank and the built-in engine. :func:`load_causal_lm` builds this module for the checkpoints
:func:`lean_config` accepts (llama, mistral, qwen2, qwen3 with default RoPE, plain SiLU MLPs,
matching safetensors names) and falls back to ``AutoModelForCausalLM`` otherwise. Guaranteed: HF's
parameter names, shapes, tying and arithmetic, so state dicts move unchanged and logits and
gradients agree to float rounding (``tests/unit/test_lean_lm.py``); rows are right-padded. Not
provided: generation, KV caches, gradient checkpointing, ``save_pretrained``, other outputs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["LeanCausalLM", "LeanConfig", "lean_config", "load_causal_lm"]

_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, kw_only=True, slots=True)
class LeanConfig:
    """The fields of an HF ``config.json`` this module reads, under HF's attribute names."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # q/k/v projections (qwen2 always; llama/qwen3 by attention_bias)
    o_bias: bool
    qk_norm: bool  # qwen3's per-head RMSNorm of q and k
    pad_token_id: int | None
    bos_token_id: Any
    eos_token_id: Any
    dtype: str | None
    hidden_act: str = "silu"
    sliding_window: int | None = None
    mlp_bias: bool = False


def _rope(raw: dict) -> tuple[str, float]:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    return str(kind), theta


def lean_config(raw: dict) -> tuple[LeanConfig | None, str]:
    """``(config, "")`` when this module runs the checkpoint, else ``(None, why not)``."""
    mt = raw.get("model_type")
    if mt not in _TYPES:
        return None, f"model_type {mt!r}"
    kind, theta = _rope(raw)
    if kind != "default":
        return None, f"RoPE type {kind!r}"
    if raw.get("hidden_act", "silu") != "silu" or raw.get("mlp_bias"):
        return None, "a non-SiLU or biased MLP"
    if float(raw.get("attention_dropout") or 0.0) != 0.0:
        return None, "attention dropout"
    windowed = mt == "mistral" or raw.get("use_sliding_window")
    if (windowed and raw.get("sliding_window")) or any(t != "full_attention" for t in raw.get("layer_types") or ()):
        return None, "a sliding attention window"
    heads = int(raw["num_attention_heads"])
    bias = bool(raw.get("attention_bias", False))
    return (
        LeanConfig(
            model_type=mt,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=True if mt == "qwen2" else bias and mt != "mistral",
            o_bias=bias and mt in ("llama", "qwen3"),
            qk_norm=mt == "qwen3",
            pad_token_id=raw.get("pad_token_id"),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            dtype=raw.get("dtype") or raw.get("torch_dtype"),
        ),
        "",
    )


def _param(*shape: int) -> nn.Parameter:
    # Uninitialised: every tensor is loaded from the checkpoint (nn.Linear's random init, or building on the
    # meta device, would cost more than the load: the meta route imports torch._dynamo).
    return nn.Parameter(torch.empty(*shape))


class Linear(nn.Module):
    """``nn.Linear``'s tensors (``weight`` [out, in], optional ``bias``) without its initialisation."""

    def __init__(self, n_in: int, n_out: int, *, bias: bool) -> None:
        super().__init__()
        self.weight = _param(n_out, n_in)
        self.bias = _param(n_out) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class Embedding(nn.Module):
    """``nn.Embedding(padding_idx=...)``: the padding row gets no gradient, as in HF's models."""

    def __init__(self, n: int, dim: int, padding_idx: int | None) -> None:
        super().__init__()
        self.weight = _param(n, dim)
        self.padding_idx = padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight, self.padding_idx)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = _param(size)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """Default RoPE; ``inv_freq``, ``rope_type`` and ``attention_scaling`` as HF's rotary module has them."""

    rope_type = "default"
    attention_scaling = 1.0

    def __init__(self, c: LeanConfig) -> None:
        super().__init__()
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float) / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: LeanConfig) -> None:
        super().__init__()
        d, hq, hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        self.head_dim, self.groups, self.scaling = d, hq // hkv, d**-0.5
        self.q_proj = Linear(c.hidden_size, hq * d, bias=c.qkv_bias)
        self.k_proj = Linear(c.hidden_size, hkv * d, bias=c.qkv_bias)
        self.v_proj = Linear(c.hidden_size, hkv * d, bias=c.qkv_bias)
        self.o_proj = Linear(hq * d, c.hidden_size, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm = RMSNorm(d, c.rms_norm_eps)
            self.k_norm = RMSNorm(d, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None):
        B, T, _ = x.shape
        shape = (B, T, -1, self.head_dim)
        q, k, v = self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if self.groups > 1:
            k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, c: LeanConfig) -> None:
        super().__init__()
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: LeanConfig) -> None:
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*`` of the HF checkpoint: embedding, layers, final norm (HF's ``base_model``)."""

    def __init__(self, c: LeanConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size, c.pad_token_id)
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.rotary_emb = Rotary(c)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        x = self.embed_tokens(input_ids)
        T = input_ids.shape[1]
        cos, sin = self.rotary_emb(x, torch.arange(T, device=x.device)[None])
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            # Each query may always see itself: a padding query with no real key before it would get a row
            # of -inf scores (NaN out of softmax, and NaN times a zero loss weight is still NaN).
            mask = (causal & attention_mask.bool()[:, None, None, :]) | torch.eye(T, dtype=torch.bool, device=x.device)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return SimpleNamespace(last_hidden_state=self.norm(x))


class LeanCausalLM(nn.Module):
    """``model(input_ids, attention_mask).logits``, with HF's module tree and tensor names (see the module doc)."""

    def __init__(self, c: LeanConfig, generation: dict | None = None) -> None:
        super().__init__()
        self.config = c
        self.generation_config = SimpleNamespace(**generation) if generation else None
        self.model = Backbone(c)
        self.lm_head = Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def base_model(self) -> Backbone:
        return self.model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> SimpleNamespace:
        hidden = self.model(input_ids, attention_mask).last_hidden_state
        return SimpleNamespace(logits=self.lm_head(hidden))


def _read_tensors(path: Path) -> dict[str, torch.Tensor] | None:
    from safetensors.torch import load_file

    from slime.models.safetensors_files import safetensors_files

    try:
        files = safetensors_files(path)
    except ValueError:
        return None
    return {name: t for f in files for name, t in load_file(str(f)).items()}


def _dtype(requested: torch.dtype | str, c: LeanConfig) -> torch.dtype:
    if isinstance(requested, torch.dtype):
        return requested
    name = c.dtype if requested == "auto" else requested
    dtype = getattr(torch, str(name or "float32"), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def load_lean(path: str | Path, *, dtype: torch.dtype | str = torch.float32) -> tuple[LeanCausalLM | None, str]:
    """The checkpoint at ``path`` as a :class:`LeanCausalLM`, or ``(None, why not)``."""
    path = Path(path)
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return None, f"config.json: {exc}"
    c, why = lean_config(raw)
    if c is None:
        return None, why
    tensors = _read_tensors(path)
    if tensors is None:
        return None, "no safetensors weights"
    gen_file = path / "generation_config.json"
    generation = json.loads(gen_file.read_text()) if gen_file.is_file() else None
    model = LeanCausalLM(c, generation)
    want = dict(model.state_dict())
    if c.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)  # HF ignores a saved copy of a tied head too
        want.pop("lm_head.weight")
    if set(tensors) != set(want):
        extra, missing = sorted(set(tensors) - set(want)), sorted(set(want) - set(tensors))
        return None, f"tensor names differ (unexpected {extra[:3]}, missing {missing[:3]})"
    bad = [k for k, t in tensors.items() if tuple(t.shape) != tuple(want[k].shape)]
    if bad:
        return None, f"tensor shapes differ ({bad[:3]})"
    dt = _dtype(dtype, c)
    model.load_state_dict({k: t.to(dt) for k, t in tensors.items()}, strict=False, assign=True)
    if c.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval(), ""  # as from_pretrained returns it


def load_causal_lm(path: str | Path, *, dtype: torch.dtype | str = torch.float32) -> nn.Module:
    """:class:`LeanCausalLM` when it covers the checkpoint, else HF's ``AutoModelForCausalLM``."""
    model, _ = load_lean(path, dtype=dtype)
    if model is not None:
        return model
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
