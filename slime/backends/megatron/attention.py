"""Core attention through ``torch.nn.functional.scaled_dot_product_attention``, and the layer specs.

Why: megatron-core's local ``DotProductAttention`` materialises the ``[b, heads, s, s]`` scores and
repeats K/V for GQA. :class:`SDPACoreAttention` has its constructor and ``forward`` contract and
fills the local spec's ``core_attention`` slot (all else stock megatron-core); PyTorch picks its
flash / memory-efficient kernels, GQA via ``enable_gqa``. No mask means causal; a boolean megatron
mask is honoured. Not supported (clear errors): packed/THD sequences, attention bias, sliding
windows, non-vanilla softmax, query-key layer scaling. TE is preferred when installed. Context
parallel uses ``context_parallel.cp_attention``. Imports megatron-core (megatron backend only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

__all__ = ["SDPACoreAttention", "layer_spec"]


class SDPACoreAttention(MegatronModule):
    """Drop-in ``core_attention`` for megatron-core's local spec, backed by SDPA."""

    def __init__(
        self,
        config,
        layer_number: int,
        attn_mask_type,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection=None,
        k_channels: int | None = None,
        v_channels: int | None = None,
    ) -> None:
        super().__init__(config=config)
        unsupported = []
        if getattr(config, "window_size", None) is not None:
            unsupported.append("sliding-window attention")
        if getattr(config, "softmax_type", "vanilla") != "vanilla":
            unsupported.append(f"softmax_type={config.softmax_type!r}")
        if config.apply_query_key_layer_scaling:
            unsupported.append("apply_query_key_layer_scaling")
        if unsupported:
            raise ValueError(f"SDPA core attention does not support: {', '.join(unsupported)}")
        if pg_collection is None:
            from megatron.core.process_groups_config import ProcessGroupCollection

            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        tp = pg_collection.tp.size()
        self.cp_group = pg_collection.cp if config.context_parallel_size > 1 else None
        self.attn_mask_type = attn_mask_type
        self.heads = config.num_attention_heads // tp
        self.groups = config.num_query_groups // tp
        # multi-latent attention passes its query/key and value head sizes (they differ)
        self.head_dim = k_channels or config.kv_channels
        self.v_head_dim = v_channels or config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None:
            raise ValueError("SDPA core attention does not support packed (THD) sequences")
        if attention_bias is not None:
            raise ValueError("SDPA core attention does not support an attention bias")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        s, b = query.shape[0], query.shape[1]
        # [s, b, h, d] -> [b, h, s, d]: a view; SDPA accepts strided inputs.
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask = None
        causal = mask_type == AttnMaskType.causal
        if attention_mask is not None and mask_type != AttnMaskType.causal:
            mask, causal = ~attention_mask.bool(), False
        dropout = self.dropout if self.training else 0.0
        if self.cp_group is not None:
            if not causal:
                raise ValueError("context-parallel SDPA attention supports causal masks only")
            from slime.backends.megatron.context_parallel import cp_attention

            out = cp_attention(
                q,
                k,
                v,
                self.cp_group,
                scale=self.softmax_scale,
                dropout_p=dropout,
                enable_gqa=self.heads != self.groups,
            )
            return out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.v_head_dim)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            scale=self.softmax_scale,
            dropout_p=dropout,
            enable_gqa=self.heads != self.groups,
        )
        # [b, h, s, d] -> [s, b, h * d]
        return out.permute(2, 0, 1, 3).reshape(s, b, self.heads * self.v_head_dim)


class RMSNorm(torch.nn.RMSNorm):
    """megatron's norm constructor contract over ``torch.nn.RMSNorm`` (what its local spec builds without
    Apex), usable with sequence parallelism: the weight is tagged ``sequence_parallel`` as megatron's fused
    norms tag theirs, so ``finalize_model_grads`` sums its gradient over the tensor-parallel ranks (each saw
    its slice of the sequence). megatron's own ``WrappedTorchNorm`` refuses sequence parallelism for lack of
    exactly this, which made ``sequence_parallel: true`` — and any MoE model at tensor > 1 — impossible
    without Transformer Engine or Apex."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused) -> None:
        if config.normalization != "RMSNorm":
            raise ValueError(f"normalization={config.normalization!r}: only RMSNorm is mapped")
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


def layer_spec(attention_backend: str, config=None):
    """The GPT layer spec for 'te', 'sdpa' or 'local' (see ``config.choose_attention_backend``).

    Without Transformer Engine and given the ``config``, it is megatron's decoder block spec (one layer
    spec per layer of this pipeline stage: dense or MoE MLP as ``moe_layer_freq`` says, self-attention or
    MLA), local modules only, experts as ``SequentialMLP``, every norm our :class:`RMSNorm`; ``sdpa`` puts
    :class:`SDPACoreAttention` into every layer."""
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )
    from megatron.core.transformer.identity_op import IdentityOp

    if attention_backend not in ("te", "sdpa", "local"):
        raise ValueError(f"unknown attention backend {attention_backend!r}; valid: te, sdpa, local")
    if config is not None and (config.num_moe_experts or config.multi_latent_attention):
        from slime.backends.megatron import mcore_fixes

        mcore_fixes.apply()
        if attention_backend == "te":
            raise ValueError("Transformer Engine layer specs are not mapped for MoE / multi-latent attention models")
    if attention_backend == "te":
        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=bool(config and config.qk_layernorm))
    if config is None:  # one dense layer spec (callers without a config: conversion tests)
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        layers = [spec]
    else:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization="RMSNorm")
        spec.layer_norm = RMSNorm
        layers = spec.layer_specs
    for layer in layers:
        sub = layer.submodules
        sub.input_layernorm = sub.pre_mlp_layernorm = RMSNorm
        attn = sub.self_attention.submodules
        for name in ("q_layernorm", "k_layernorm", "kv_layernorm"):
            if getattr(attn, name, IdentityOp) not in (IdentityOp, None):
                setattr(attn, name, RMSNorm)
        if attention_backend == "sdpa":
            attn.core_attention = SDPACoreAttention
        if hasattr(attn, "linear_kv_down_proj"):
            _replicated_mla_down_projections(attn)
    return spec


def _replicated_mla_down_projections(attn) -> None:
    """Multi-latent attention's q/kv down-projections as one full (replicated) linear per tensor-parallel rank.

    megatron-core 0.16.1's local spec builds them column-parallel and all-gathers their output; the rope
    part of the kv down-projection (``k_pos_emb``, shared by all heads) then gets on each rank only its own
    heads' gradient, never summed: wrong gradients in the layers below at tensor > 1 (found by the
    TP=2 x EP=2 test). Replicated, as the Transformer Engine spec builds them, with sequence
    parallelism megatron gathers ``k_pos_emb`` over the sequence and its backward sums the heads' parts;
    megatron's ``Linear`` (modelopt) tags the weights ``sequence_parallel`` so their gradients, computed on
    each rank's slice of the sequence, are summed too. Hence MLA at tensor > 1 needs sequence parallelism
    (a spec rule)."""
    from megatron.core.post_training.modelopt.layers import Linear

    attn.linear_kv_down_proj = Linear
    if attn.linear_q_down_proj is not None:
        attn.linear_q_down_proj = Linear


def state_dict_naming(attention_backend: str) -> str:
    """Which norm naming (``convert.Naming``) the spec of ``attention_backend`` uses."""
    return "te" if attention_backend == "te" else "local"
