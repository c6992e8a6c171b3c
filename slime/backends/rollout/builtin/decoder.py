"""A lean decoder-only forward pass over a Hugging Face model's weights, with a static KV cache.

Why not ``model.generate``: on CPU its per-step cost is dominated by framework
overhead (a growing cache concatenated every step, mask construction, separate
q/k/v and gate/up matmuls, logits processors), not by arithmetic. This module
reads the weights of an already loaded HF model once, fuses q/k/v and gate/up
into single matrices, and runs decode steps against a preallocated cache with
one row ("slot") per running sequence. Each slot keeps its own length, so
sequences of different lengths share a batch without padding tokens, and a slot
freed by a finished sequence can be refilled while others keep decoding
(continuous batching).

Supported: the Llama family layout (``llama``, ``mistral``, ``qwen2``, ``qwen3``
with per-head q/k RMSNorm), optional q/k/v biases, any static RoPE variant HF
precomputes (the inverse frequencies and scaling are taken from the HF rotary
module), grouped-query attention, tied or untied output embeddings.
Not supported (a clear error at load): sliding-window attention, dynamic RoPE,
MoE, biased MLPs, activations other than SiLU.

Numerics: the arithmetic mirrors the HF modules (RMSNorm in fp32, RoPE via
``cat(freqs, freqs)`` cos/sin, softmax attention with scale ``head_dim**-0.5``);
in fp32 the norm weights and the attention scale are folded into the adjacent
matrices, which changes only rounding. Logits agree with
``model(input_ids).logits`` to ~1e-6 in fp32, which the engine's log-prob parity
tests check for every supported architecture and both cache layouts.

Not guaranteed: bit-identical results across batch compositions (GEMM blocking
may change with the number of rows), or any speed-up on GPU (the code runs
there, but was written against CPU overheads).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["LeanDecoder", "UnsupportedModel"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModel(ValueError):
    """The checkpoint's architecture is outside what the lean decoder implements."""


@dataclass
class _Layer:
    ln_in: torch.Tensor | None  # None when folded into w_qkv
    w_qkv: torch.Tensor  # [hidden, (Hq + 2 Hkv) * D], pre-transposed for x @ w
    b_qkv: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    w_o: torch.Tensor
    ln_post: torch.Tensor | None  # None when folded into w_gate_up
    w_gate_up: torch.Tensor
    w_down: torch.Tensor


def _check_supported(config, max_len: int) -> None:
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"the built-in engine runs model_type in {SUPPORTED_MODEL_TYPES}, not {mt!r}; "
            "use the SGLang backend for other architectures")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act={config.hidden_act!r} is not supported (only 'silu')")
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            raise UnsupportedModel("sliding-window attention layers are not supported by the built-in engine")
    elif window and window < max_len:  # Mistral style: one window for every layer
        raise UnsupportedModel(f"the model attends through a sliding window of {window} tokens; the built-in "
                               f"engine needs context_length <= {window} (got {max_len})")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModel("mlp_bias=True is not supported by the built-in engine")


class LeanDecoder:
    """Fused-weight forward with a slot-indexed KV cache.

    ``max_slots`` sequences of at most ``max_len`` tokens (prompt + output) each.
    Call :meth:`refresh_weights` after the HF model's parameters change.
    """

    def __init__(self, hf_model, *, max_slots: int, max_len: int) -> None:
        config = hf_model.config
        _check_supported(config, int(max_len))
        self.hf_model = hf_model
        self.config = config
        self.device = next(hf_model.parameters()).device
        self.dtype = next(hf_model.parameters()).dtype
        self.n_heads = config.num_attention_heads
        self.n_kv = getattr(config, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.n_heads
        self.group = self.n_heads // self.n_kv
        self.eps = float(config.rms_norm_eps)
        self.vocab_size = config.vocab_size
        self.max_slots = int(max_slots)
        self.max_len = int(max_len)
        self.scale = self.head_dim ** -0.5
        n_layers = config.num_hidden_layers
        self._rows = torch.arange(self.max_slots, device=self.device)
        self._keys = torch.arange(self.max_len, device=self.device)
        S, T, nkv, d = self.max_slots, self.max_len, self.n_kv, self.head_dim
        kv_i = torch.arange(2, device=self.device)
        # Two cache layouts, one tensor per layer with K at [0] and V at [1] so the k|v
        # columns of the fused projection land in it with one index_copy_ per step:
        # * "rowwise" [2, S, T, Hkv*D] (CPU, at most 2 KV heads): each slot's keys are one
        #   contiguous block, and a step is one [Hq, Hkv*D] x [Hkv*D, T] product per slot with
        #   the query spread block-diagonally over the KV heads. Per-matrix overhead and cache
        #   misses, not flops, bound CPU decode; half as many, contiguous matrices beat the
        #   per-head form although the zero blocks double the (tiny) arithmetic.
        # * per head [2, S, Hkv, T, D] otherwise: one [G, D] x [D, T] product per (slot, head).
        self.rowwise = self.device.type == "cpu" and nkv <= 2
        if self.rowwise:
            shape: tuple = (2, S, T, nkv * d)
            self._kv_base = (kv_i[None, :] * S + self._rows[:, None]) * T  # [S, 2] first row of each block
            heads = torch.arange(self.n_heads, device=self.device)
            spread = torch.zeros(self.n_heads, nkv, dtype=self.dtype, device=self.device)
            spread[heads, heads // self.group] = 1
            self._spread = spread.view(1, self.n_heads, nkv, 1)
            self._pick = (heads, heads // self.group)
        else:
            shape = (2, S, nkv, T, d)
            self._kv_base = ((kv_i[None, :, None] * S + self._rows[:, None, None]) * nkv
                             + torch.arange(nkv, device=self.device)[None, None, :]) * T  # [S, 2, Hkv]
        self.kv_cache = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(n_layers)]
        self._build_rope()
        self.refresh_weights()

    @staticmethod
    def cache_bytes(config, max_slots: int, max_len: int, dtype: torch.dtype) -> int:
        """Bytes the KV cache of :class:`LeanDecoder` will allocate for these sizes."""
        heads = config.num_attention_heads
        n_kv = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        itemsize = torch.empty((), dtype=dtype).element_size()
        return config.num_hidden_layers * 2 * max_slots * n_kv * max_len * head_dim * itemsize

    # ----------------------------------------------------------------- weights
    def _build_rope(self) -> None:
        rotary = self.hf_model.model.rotary_emb
        if getattr(rotary, "rope_type", "default") == "dynamic":
            raise UnsupportedModel("dynamic RoPE scaling is not supported by the built-in engine")
        inv_freq = rotary.inv_freq.detach().to(self.device, torch.float32)
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        pos = torch.arange(self.max_len, device=self.device, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        half = self.head_dim // 2
        self.cos = (emb.cos() * scaling).to(self.dtype)
        sin = (emb.sin() * scaling).to(self.dtype)
        # rotate_half(x) * sin == roll(x, half) * cat(-sin1, sin2): one roll instead of slice/neg/cat.
        self.sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)

    @torch.inference_mode()
    def refresh_weights(self) -> None:
        """(Re)build the fused weight copies from the HF model's current parameters.

        In fp32 the RMSNorm weights are folded into the matrices that follow them
        and the attention scale into the query projection, saving an elementwise
        pass per norm and per score matrix; (x * w) @ W == x @ (w * W) up to float
        rounding (~1e-7 relative). Lower precisions keep the HF order of rounding.
        """
        m = self.hf_model.model
        fold = self.folded = self.dtype == torch.float32
        layers = []
        for layer in m.layers:
            att, mlp = layer.self_attn, layer.mlp
            wq, bq = att.q_proj.weight, att.q_proj.bias
            q_norm = None if getattr(att, "q_norm", None) is None else att.q_norm.weight.detach()
            k_norm = None if getattr(att, "k_norm", None) is None else att.k_norm.weight.detach()
            if fold:  # softmax(q k^T * s) with s folded into q (RoPE and q_norm's weight are linear)
                if q_norm is not None:
                    q_norm = q_norm * self.scale
                else:
                    wq = wq * self.scale
                    bq = None if bq is None else bq * self.scale
            w_qkv = torch.cat([wq, att.k_proj.weight, att.v_proj.weight], 0).t()
            b_qkv = None if bq is None else torch.cat([bq, att.k_proj.bias, att.v_proj.bias], 0).contiguous()
            w_gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], 0).t()
            ln_in = layer.input_layernorm.weight.detach()
            ln_post = layer.post_attention_layernorm.weight.detach()
            if fold:
                w_qkv, ln_in = w_qkv * ln_in[:, None], None
                w_gate_up, ln_post = w_gate_up * ln_post[:, None], None
            layers.append(_Layer(
                ln_in=ln_in, w_qkv=w_qkv.contiguous(), b_qkv=b_qkv, q_norm=q_norm, k_norm=k_norm,
                w_o=att.o_proj.weight.t().contiguous(), ln_post=ln_post, w_gate_up=w_gate_up.contiguous(),
                w_down=mlp.down_proj.weight.t().contiguous(),
            ))
        self.layers = layers
        self.embed = m.embed_tokens.weight.detach()
        lm_head = self.hf_model.lm_head.weight.detach().t()
        self.norm = m.norm.weight.detach()
        if fold:
            lm_head, self.norm = lm_head * self.norm[:, None], None
        self.lm_head = lm_head.contiguous()
        self.intermediate = layers[0].w_down.shape[0]

    # ----------------------------------------------------------------- pieces
    def _rms(self, x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    def _qkv_rope(self, L: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Fused projection -> [..., Hq + 2 Hkv, D] with RoPE applied in place to q and k."""
        h2 = h.reshape(-1, h.shape[-1])
        qkv = h2 @ L.w_qkv if L.b_qkv is None else torch.addmm(L.b_qkv, h2, L.w_qkv)
        qkv = qkv.view(*h.shape[:-1], self.n_heads + 2 * self.n_kv, self.head_dim)
        nq, nkv = self.n_heads, self.n_kv
        if L.q_norm is not None:
            qkv[..., :nq, :] = self._rms(qkv[..., :nq, :], L.q_norm)
            qkv[..., nq: nq + nkv, :] = self._rms(qkv[..., nq: nq + nkv, :], L.k_norm)
        qk = qkv[..., : nq + nkv, :]
        # rotate_half(x) * sin == roll(x, D/2) * sin_signed; the temporaries make out=qk safe.
        torch.addcmul(qk * cos, torch.roll(qk, self.head_dim // 2, dims=-1), sin, out=qk)
        return qkv

    def _mlp_residual(self, L: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = self._rms(x, L.ln_post)
        gu = h.reshape(-1, h.shape[-1]) @ L.w_gate_up
        a = F.silu(gu[:, : self.intermediate]).mul_(gu[:, self.intermediate:])
        return torch.addmm(x.reshape(-1, x.shape[-1]), a, L.w_down).view_as(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return (self._rms(x, self.norm) @ self.lm_head).float()

    # ----------------------------------------------------------------- passes
    @torch.inference_mode()
    def prefill(self, slots: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Run right-padded prompts ``tokens`` [n, Lp] into cache ``slots`` [n].

        Returns fp32 logits [n, V] at each prompt's last token. Cache entries past
        a prompt's length hold padding garbage that later decode steps overwrite
        before any query can attend to them (attention stops at the query's own
        position).
        """
        n, lp = tokens.shape
        if lp > self.max_len:
            raise ValueError(f"prompt of {lp} tokens exceeds the cache length {self.max_len}")
        nq, nkv = self.n_heads, self.n_kv
        x = F.embedding(tokens, self.embed)
        cos = self.cos[:lp][None, :, None, :]
        sin = self.sin_signed[:lp][None, :, None, :]
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.ln_in)
            qkv = self._qkv_rope(L, h, cos, sin)  # [n, Lp, Hq + 2 Hkv, D]
            if self.rowwise:
                self.kv_cache[i][:, slots, :lp] = qkv[:, :, nq:].reshape(n, lp, 2, -1).permute(2, 0, 1, 3)
                qkv = qkv.transpose(1, 2)  # [n, Hq + 2 Hkv, Lp, D]
            else:
                qkv = qkv.transpose(1, 2)
                self.kv_cache[i][:, slots, :, :lp] = qkv[:, nq:].unflatten(1, (2, nkv)).transpose(0, 1)
            o = F.scaled_dot_product_attention(qkv[:, :nq], qkv[:, nq: nq + nkv], qkv[:, nq + nkv:],
                                               is_causal=True, scale=1.0 if self.folded else self.scale,
                                               enable_gqa=self.group > 1)
            o = o.transpose(1, 2).reshape(n * lp, nq * self.head_dim)
            x = torch.addmm(x.reshape(n * lp, -1), o, L.w_o).view(n, lp, -1)
            x = self._mlp_residual(L, x)
        last = x[torch.arange(n, device=x.device), lengths - 1]
        return self._logits(last)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int,
               same_position: bool = False) -> torch.Tensor:
        """One step for slots ``0..len(tokens)-1``: feed ``tokens[b]`` at ``positions[b]``.

        ``kv_len`` must exceed every position; keys past a row's own position are
        masked, unless the caller vouches that every live row sits at position
        ``kv_len - 1`` (``same_position``), when no mask is needed. Rows of free
        slots may hold anything; their outputs are meaningless. Returns fp32
        logits [b, V].
        """
        b = tokens.shape[0]
        nq, nkv, g, d = self.n_heads, self.n_kv, self.group, self.head_dim
        x = F.embedding(tokens, self.embed)
        cos = self.cos[positions][:, None, :]
        sin = self.sin_signed[positions][:, None, :]
        if self.rowwise:
            write_rows = (self._kv_base[:b] + positions[:, None]).view(-1)  # [b * 2]
            src_rows, width = b * 2, nkv * d
        else:
            write_rows = (self._kv_base[:b] + positions[:, None, None]).view(-1)  # [b * 2 * Hkv]
            src_rows, width = b * 2 * nkv, d
        mask = None
        if not same_position:
            mask = torch.zeros(b, kv_len, dtype=self.dtype, device=x.device)
            mask.masked_fill_(self._keys[:kv_len][None, :] > positions[:, None], float("-inf"))
            mask = mask[:, None, :] if self.rowwise else mask[:, None, None, :]
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.ln_in)
            qkv = self._qkv_rope(L, h, cos, sin)  # [b, Hq + 2 Hkv, D]
            kv = self.kv_cache[i]
            kv.view(-1, width).index_copy_(0, write_rows, qkv[:, nq:].reshape(src_rows, width))
            if self.rowwise:
                q = (qkv[:, :nq, None, :] * self._spread).view(b, nq, width)
                s = torch.bmm(q, kv[0, :b, :kv_len].transpose(1, 2))  # [b, Hq, T]
            else:
                s = torch.matmul(qkv[:, :nq].view(b, nkv, g, d), kv[0, :b, :, :kv_len].transpose(-1, -2))
            if not self.folded:
                s.mul_(self.scale)
            if mask is not None:
                s.add_(mask)
            p = torch.softmax(s, dim=-1, dtype=torch.float32).to(self.dtype)
            if self.rowwise:
                o = torch.bmm(p, kv[1, :b, :kv_len]).view(b, nq, nkv, d)[:, self._pick[0], self._pick[1]]
            else:
                o = torch.matmul(p, kv[1, :b, :, :kv_len])
            x = torch.addmm(x, o.reshape(b, nq * d), L.w_o)
            x = self._mlp_residual(L, x)
        return self._logits(x)
