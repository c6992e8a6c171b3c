"""Training FLOPs of a megatron model shape, and model FLOPs utilisation (MFU) for the GPU benchmarks."""

from __future__ import annotations

import math

from slime.backends.megatron import config as mcfg

__all__ = ["mfu", "model_flops_per_token"]


def model_flops_per_token(shape: mcfg.ModelShape, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), dense matmuls + causal attention."""
    h, d = shape.hidden_size, shape.kv_channels
    per_layer = 2 * h * shape.qkv_rows + 2 * shape.num_attention_heads * d * h + 6 * h * shape.ffn_hidden_size
    attn = 2 * 2 * shape.num_attention_heads * d * seq_len / 2  # QK^T and PV, causal half
    return 3 * (shape.num_layers * (per_layer + attn) + 2 * h * shape.vocab_size)


def mfu(shape: mcfg.ModelShape, tokens: int, seq_len: int, seconds: float, peak_flops: float) -> float:
    return model_flops_per_token(shape, seq_len) * tokens / seconds / peak_flops if seconds > 0 else math.nan
