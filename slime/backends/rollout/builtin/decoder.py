"""A lean decoder-only forward pass over a Hugging Face model's weights, with a static KV cache.

Why not ``model.generate``: on CPU its step cost is framework overhead, not arithmetic. This reads
the weights once, fuses q/k/v and gate/up (oneDNN on CPU, ``linear.py``) and decodes against a
preallocated cache with one slot per sequence, so sequences of any length share a batch and a freed
slot is refilled while others decode (continuous batching). Supported: Llama-family layouts
(llama, mistral, qwen2, qwen3), static RoPE, GQA, tied or untied embeddings; others fail at load.
Logits match ``model(input_ids).logits`` to fp32 rounding (parity tests). Not guaranteed:
bit-identical results across batch compositions, any speed-up on GPU. See docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .linear import Linear

__all__ = ["LeanDecoder", "UnsupportedModel"]

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


class UnsupportedModel(ValueError):
    """The checkpoint's architecture is outside what the lean decoder implements."""


@dataclass
class _Layer:
    ln_in: torch.Tensor | None  # None when folded into qkv
    qkv: Linear  # [hidden, (Hq + 2 Hkv) * D]
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: Linear
    ln_post: torch.Tensor | None  # None when folded into gate_up
    gate_up: Linear
    down: Linear


def _check_supported(config, max_len: int) -> None:
    mt = getattr(config, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"the built-in engine runs model_type in {SUPPORTED_MODEL_TYPES}, not {mt!r}; "
            "use the SGLang backend for other architectures"
        )
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act={config.hidden_act!r} is not supported (only 'silu')")
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            raise UnsupportedModel("sliding-window attention layers are not supported by the built-in engine")
    elif window and window < max_len:  # Mistral style: one window for every layer
        raise UnsupportedModel(
            f"the model attends through a sliding window of {window} tokens; the built-in "
            f"engine needs context_length <= {window} (got {max_len})"
        )
    if int(getattr(config, "num_hidden_layers", 0) or 0) < 1:
        raise UnsupportedModel("the model has no decoder layers (num_hidden_layers < 1)")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModel("mlp_bias=True is not supported by the built-in engine")


def _softmax_last(s: torch.Tensor) -> torch.Tensor:
    """fp32 softmax over the last dim. torch's CPU kernel falls back to scalar code for rows
    shorter than 16 (much slower than these four vectorised passes), which every
    decode step with a short context hits; longer rows keep the fused kernel."""
    if s.device.type != "cpu" or s.shape[-1] >= 16:
        return torch.softmax(s, dim=-1, dtype=torch.float32)
    s = s.float()
    e = (s - s.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


class LeanDecoder:
    """Fused-weight forward with a slot-indexed KV cache.

    ``max_slots`` sequences of at most ``max_len`` tokens (prompt + output) each.
    Call :meth:`refresh_weights` after the HF model's parameters change.
    ``onednn``: run projections through oneDNN with pre-packed weights when
    available (CPU fp32; see ``linear.py``) once a call has ``onednn_min_rows``
    rows (default: per weight shape, where oneDNN starts to beat MKL).
    """

    def __init__(
        self, hf_model, *, max_slots: int, max_len: int, onednn: bool = True, onednn_min_rows: int | None = None
    ) -> None:
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
        self.scale = self.head_dim**-0.5
        self.onednn = bool(onednn)
        self.onednn_min_rows = None if onednn_min_rows is None else int(onednn_min_rows)
        n_layers = config.num_hidden_layers
        self._rows = torch.arange(self.max_slots, device=self.device)
        self._keys = torch.arange(self.max_len, device=self.device)
        S, T, nkv, d = self.max_slots, self.max_len, self.n_kv, self.head_dim
        kv_i = torch.arange(2, device=self.device)
        # Two cache layouts, one tensor per layer with K at [0] and V at [1] so the k|v
        # columns of the fused projection land in it with one copy per step (a slice when
        # every row is at the same position, else an index_copy_):
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
            # The block-diagonal query lives in a zeroed buffer [S, Hq, Hkv*D]: only its diagonal
            # blocks (head h, KV head h // G) are ever written, through one strided view, so a step
            # spreads q with a single copy; the same view picks each head's output block.
            hq, g = self.n_heads, self.group
            self._q_spread = torch.zeros(S, hq, nkv * d, dtype=self.dtype, device=self.device)
            self._diag_strides = (hq * nkv * d, g * nkv * d + d, nkv * d, 1)  # [b, Hkv, G, D] view
        else:
            shape = (2, S, nkv, T, d)
            self._kv_base = (
                (kv_i[None, :, None] * S + self._rows[:, None, None]) * nkv
                + torch.arange(nkv, device=self.device)[None, None, :]
            ) * T  # [S, 2, Hkv]
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
            layers.append(
                _Layer(
                    ln_in=ln_in,
                    qkv=self._linear(w_qkv, b_qkv),
                    q_norm=q_norm,
                    k_norm=k_norm,
                    o=self._linear(att.o_proj.weight.t(), att.o_proj.bias),
                    ln_post=ln_post,
                    gate_up=self._linear(w_gate_up),
                    down=self._linear(mlp.down_proj.weight.t()),
                )
            )
        self.layers = layers
        self.embed = m.embed_tokens.weight.detach()
        lm_head = self.hf_model.lm_head.weight.detach().t()
        self.norm = m.norm.weight.detach()
        if fold:
            lm_head, self.norm = lm_head * self.norm[:, None], None
        self.lm_head = self._linear(lm_head)
        self.intermediate = mlp.down_proj.weight.shape[1]

    def _linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        return Linear(
            weight.detach(), None if bias is None else bias.detach(), packed=self.onednn, min_rows=self.onednn_min_rows
        )

    # ----------------------------------------------------------------- pieces
    def _rms(self, x: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * h.to(x.dtype)

    def _qkv_rope(self, L: _Layer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Fused projection -> [..., Hq + 2 Hkv, D] with RoPE applied in place to q and k."""
        qkv = L.qkv(h.reshape(-1, h.shape[-1]))
        qkv = qkv.view(*h.shape[:-1], self.n_heads + 2 * self.n_kv, self.head_dim)
        nq, nkv = self.n_heads, self.n_kv
        if L.q_norm is not None:
            qkv[..., :nq, :] = self._rms(qkv[..., :nq, :], L.q_norm)
            qkv[..., nq : nq + nkv, :] = self._rms(qkv[..., nq : nq + nkv, :], L.k_norm)
        qk = qkv[..., : nq + nkv, :]
        # rotate_half(x) * sin == roll(x, D/2) * sin_signed; the temporaries make out=qk safe.
        torch.addcmul(qk * cos, torch.roll(qk, self.head_dim // 2, dims=-1), sin, out=qk)
        return qkv

    def _mlp_residual(self, L: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = self._rms(x, L.ln_post)
        gu = L.gate_up(h.reshape(-1, h.shape[-1]))
        a = F.silu(gu[:, : self.intermediate]).mul_(gu[:, self.intermediate :])
        return L.down(a, residual=x.reshape(-1, x.shape[-1])).view_as(x)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self._rms(x, self.norm)).float()

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
        rows, last = torch.arange(n, device=x.device), lengths - 1
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.ln_in)
            qkv = self._qkv_rope(L, h, cos, sin)  # [n, Lp, Hq + 2 Hkv, D]
            if self.rowwise:
                self.kv_cache[i][:, slots, :lp] = qkv[:, :, nq:].reshape(n, lp, 2, -1).permute(2, 0, 1, 3)
                qkv = qkv.transpose(1, 2)  # [n, Hq + 2 Hkv, Lp, D]
            else:
                qkv = qkv.transpose(1, 2)
                self.kv_cache[i][:, slots, :, :lp] = qkv[:, nq:].unflatten(1, (2, nkv)).transpose(0, 1)
            o = F.scaled_dot_product_attention(
                qkv[:, :nq],
                qkv[:, nq : nq + nkv],
                qkv[:, nq + nkv :],
                is_causal=True,
                scale=1.0 if self.folded else self.scale,
                enable_gqa=self.group > 1,
            )
            o = o.transpose(1, 2)  # [n, Lp, Hq, D]
            if i == len(self.layers) - 1:
                # Only the last token's hidden state feeds the logits: the final layer's output
                # projection and MLP run on n rows, not n * Lp.
                x = L.o(o[rows, last].reshape(n, -1), residual=x[rows, last])
            else:
                x = L.o(o.reshape(n * lp, -1), residual=x.reshape(n * lp, -1)).view(n, lp, -1)
            x = self._mlp_residual(L, x)
        return self._logits(x)  # [n, V]: _check_supported guarantees at least one layer

    @torch.inference_mode()
    def _step_geometry(self, b: int, positions: torch.Tensor, kv_len: int, same_position: bool):
        """(cos, sin, mask, cache rows to write, shared position) of one decode step; see ``decode``."""
        mask = write_rows = pos = None
        if same_position:  # one position: broadcast its cos/sin, write the cache through a slice
            pos = kv_len - 1
            cos = self.cos[pos : pos + 1][:, None, :]
            sin = self.sin_signed[pos : pos + 1][:, None, :]
            return cos, sin, mask, write_rows, pos
        cos = self.cos[positions][:, None, :]
        sin = self.sin_signed[positions][:, None, :]
        mask = torch.zeros(b, kv_len, dtype=self.dtype, device=self.embed.device)
        mask.masked_fill_(self._keys[:kv_len][None, :] > positions[:, None], float("-inf"))
        if self.rowwise:
            mask = mask[:, None, :]
            write_rows = (self._kv_base[:b] + positions[:, None]).view(-1)  # [b * 2]
        else:
            mask = mask[:, None, None, :]
            write_rows = (self._kv_base[:b] + positions[:, None, None]).view(-1)  # [b * 2 * Hkv]
        return cos, sin, mask, write_rows, pos

    def decode(
        self, tokens: torch.Tensor, positions: torch.Tensor, kv_len: int, same_position: bool = False
    ) -> torch.Tensor:
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
        cos, sin, mask, write_rows, pos = self._step_geometry(b, positions, kv_len, same_position)
        width = nkv * d if self.rowwise else d
        if self.rowwise:
            q_spread = self._q_spread[:b]
            q_diag = q_spread.as_strided((b, nkv, g, d), self._diag_strides)
        for i, L in enumerate(self.layers):
            h = self._rms(x, L.ln_in)
            qkv = self._qkv_rope(L, h, cos, sin)  # [b, Hq + 2 Hkv, D]
            kv = self.kv_cache[i]
            new_kv = qkv[:, nq:]
            if write_rows is not None:
                kv.view(-1, width).index_copy_(0, write_rows, new_kv.reshape(-1, width))
            elif self.rowwise:
                kv[:, :b, pos] = new_kv.reshape(b, 2, width).transpose(0, 1)
            else:
                kv[:, :b, :, pos] = new_kv.reshape(b, 2, nkv, d).transpose(0, 1)
            if self.rowwise:
                q_diag.copy_(qkv[:, :nq].view(b, nkv, g, d))
                s = torch.bmm(q_spread, kv[0, :b, :kv_len].transpose(1, 2))  # [b, Hq, T]
            else:
                s = torch.matmul(qkv[:, :nq].view(b, nkv, g, d), kv[0, :b, :, :kv_len].transpose(-1, -2))
            if not self.folded:
                s.mul_(self.scale)
            if mask is not None:
                s.add_(mask)
            p = _softmax_last(s).to(self.dtype)
            if self.rowwise:
                o = torch.bmm(p, kv[1, :b, :kv_len]).as_strided((b, nkv, g, d), self._diag_strides)
            else:
                o = torch.matmul(p, kv[1, :b, :, :kv_len])
            x = L.o(o.reshape(b, nq * d), residual=x)
            x = self._mlp_residual(L, x)
        return self._logits(x)
