"""HF ↔ megatron-core state dicts for the Qwen2 / Llama families, with TP and PP sharding.

Layouts (megatron-core 0.16 ``GPTModel``; N = layer index local to a pipeline stage):

* ``embedding.word_embeddings.weight`` ↔ ``model.embed_tokens.weight`` — rows
  padded with zeros to the padded vocab (:func:`~.config.padded_vocab_size`);
  padding is dropped on the way back.
* ``decoder.layers.N.self_attention.linear_qkv.{weight,bias}`` ↔ ``q_proj``,
  ``k_proj``, ``v_proj``: rows grouped per query group ``g`` as
  ``[q heads of g ..., k_g, v_g]`` — the layout ``SelfAttention`` splits, so a
  contiguous TP chunk holds whole groups.
* ``...self_attention.linear_proj.weight`` ↔ ``o_proj``.
* ``...mlp.linear_fc1.weight`` ↔ ``cat(gate_proj, up_proj)``; under TP each
  rank holds ``cat(gate_r, up_r)`` (not a plain chunk of the concatenation).
* ``...mlp.linear_fc2.weight`` ↔ ``down_proj``.
* Norms: the local spec names them ``input_layernorm.weight`` /
  ``pre_mlp_layernorm.weight``; the Transformer Engine spec fuses them into the
  next linear as ``self_attention.linear_qkv.layer_norm_weight`` /
  ``mlp.linear_fc1.layer_norm_weight`` (``naming="te"``). Reading accepts both.
* ``decoder.final_layernorm.weight`` ↔ ``model.norm.weight``;
  ``output_layer.weight`` ↔ ``lm_head.weight``, absent when embeddings are tied
  (except on the last stage when PP > 1, which holds its own copy).

TP: column-parallel tensors (embedding, output, qkv, fc1) split along rows,
row-parallel (proj, fc2) along columns, norms replicated. PP: stage ``p`` holds
layers ``[p L/pp, (p+1) L/pp)`` renumbered from 0, the embedding on the first
stage and the final norm + output on the last.

Guaranteed: HF → megatron → HF returns bit-identical tensors (only reshapes,
concatenations and slices; no dtype change), for any TP/PP that passes
:func:`~.config.check_parallel`. Unknown or missing tensor names raise
:class:`ConversionError` listing them. Needs torch, not megatron-core.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Literal

import torch

from slime.backends.megatron.config import ModelShape, padded_vocab_size

__all__ = [
    "ConversionError",
    "Naming",
    "gather_param",
    "gather_tp",
    "hf_to_megatron",
    "iter_hf_names",
    "layer_offset",
    "megatron_param_to_hf",
    "megatron_to_hf",
    "merge_pp",
    "rank_state_dict",
    "shard_param",
    "shard_tp",
    "split_pp",
    "tp_split_kind",
]

Naming = Literal["local", "te"]
Tensor = torch.Tensor

_EMB = "embedding.word_embeddings.weight"
_OUT = "output_layer.weight"
_FINAL = "decoder.final_layernorm.weight"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_NORMS: dict[str, tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}
# Layer-local megatron suffix -> how TP splits it: 0/1 = dim, "gated" = fc1, None = replicated.
_TP_SPLIT: dict[str, int | str | None] = {
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "mlp.linear_fc1.weight": "gated",
    "mlp.linear_fc2.weight": 1,
    "input_layernorm.weight": None,
    "pre_mlp_layernorm.weight": None,
    "self_attention.linear_qkv.layer_norm_weight": None,
    "mlp.linear_fc1.layer_norm_weight": None,
}


class ConversionError(ValueError):
    """The state dict does not match the model shape (names listed)."""


def _listed(names: Iterable[str], limit: int = 8) -> str:
    names = sorted(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ----------------------------------------------------------------------------- qkv
def _fuse_qkv(q: Tensor, k: Tensor, v: Tensor, shape: ModelShape) -> Tensor:
    g, d = shape.num_query_groups, shape.kv_channels
    tail = q.shape[1:]
    parts = (q.reshape(g, shape.heads_per_group * d, *tail), k.reshape(g, d, *tail), v.reshape(g, d, *tail))
    return torch.cat(parts, dim=1).reshape(shape.qkv_rows, *tail)


def _split_qkv(qkv: Tensor, shape: ModelShape) -> tuple[Tensor, Tensor, Tensor]:
    g, d = shape.num_query_groups, shape.kv_channels
    tail = qkv.shape[1:]
    grouped = qkv.reshape(g, (shape.heads_per_group + 2) * d, *tail)
    q, k, v = torch.split(grouped, [shape.heads_per_group * d, d, d], dim=1)
    return (q.reshape(shape.num_attention_heads * d, *tail), k.reshape(g * d, *tail), v.reshape(g * d, *tail))


def _pad_rows(w: Tensor, rows: int) -> Tensor:
    if w.shape[0] == rows:
        return w
    return torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])], dim=0)


# ----------------------------------------------------------------------------- HF -> megatron
def hf_to_megatron(
    hf: Mapping[str, Tensor], shape: ModelShape, *, tp: int = 1, naming: Naming = "local"
) -> dict[str, Tensor]:
    """The full (unsharded) megatron state dict of an HF state dict; vocab padded for ``tp``."""
    if naming not in _NORMS:
        raise ConversionError(f"naming must be 'local' or 'te', got {naming!r}")
    vocab = padded_vocab_size(shape.vocab_size, tp)
    used: set[str] = set()

    def take(name: str) -> Tensor:
        if name not in hf:
            raise ConversionError(
                f"HF state dict lacks {name!r} (model_type {shape.family}, {shape.num_layers} layers)"
            )
        used.add(name)
        return hf[name]

    emb = take("model.embed_tokens.weight")
    if emb.shape[0] != shape.vocab_size:
        raise ConversionError(
            f"model.embed_tokens.weight has {emb.shape[0]} rows but config vocab_size is {shape.vocab_size}"
        )
    out: dict[str, Tensor] = {_EMB: _pad_rows(emb, vocab)}
    in_norm, mlp_norm = _NORMS[naming]
    for i in range(shape.num_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        att = p + "self_attn."
        out[m + in_norm] = take(p + "input_layernorm.weight")
        out[m + "self_attention.linear_qkv.weight"] = _fuse_qkv(
            take(att + "q_proj.weight"), take(att + "k_proj.weight"), take(att + "v_proj.weight"), shape
        )
        if shape.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = _fuse_qkv(
                take(att + "q_proj.bias"), take(att + "k_proj.bias"), take(att + "v_proj.bias"), shape
            )
        out[m + "self_attention.linear_proj.weight"] = take(att + "o_proj.weight")
        out[m + mlp_norm] = take(p + "post_attention_layernorm.weight")
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0
        )
        out[m + "mlp.linear_fc2.weight"] = take(p + "mlp.down_proj.weight")
    out[_FINAL] = take("model.norm.weight")
    if shape.tie_embeddings:
        used.add("lm_head.weight")  # a tied copy may be listed; it is the embedding
    else:
        out[_OUT] = _pad_rows(take("lm_head.weight"), vocab)
    extra = set(hf) - used
    if extra:
        raise ConversionError(f"HF state dict has tensors the {shape.family} converter does not know: {_listed(extra)}")
    return out


# ----------------------------------------------------------------------------- megatron -> HF
def megatron_param_to_hf(
    name: str, tensor: Tensor, shape: ModelShape, *, layer_offset: int = 0
) -> list[tuple[str, Tensor]]:
    """One full (TP-gathered) megatron tensor → its HF tensor(s); stage-local layer N becomes N + offset.

    Lets a backend stream weights one parameter at a time (NCCL buckets, disk
    export) without holding a second copy of the model.
    """
    if name == _EMB:
        return [("model.embed_tokens.weight", tensor[: shape.vocab_size])]
    if name == _OUT:
        return [] if shape.tie_embeddings else [("lm_head.weight", tensor[: shape.vocab_size])]
    if name == _FINAL:
        return [("model.norm.weight", tensor)]
    match = _LAYER.match(name)
    if not match:
        raise ConversionError(f"unknown megatron tensor {name!r}")
    i, suffix = int(match.group(1)) + layer_offset, match.group(2)
    p = f"model.layers.{i}."
    if suffix in (_NORMS["local"][0], _NORMS["te"][0]):
        return [(p + "input_layernorm.weight", tensor)]
    if suffix in (_NORMS["local"][1], _NORMS["te"][1]):
        return [(p + "post_attention_layernorm.weight", tensor)]
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _split_qkv(tensor, shape)
        return [(f"{p}self_attn.{n}_proj.{kind}", t) for n, t in (("q", q), ("k", k), ("v", v))]
    if suffix == "self_attention.linear_proj.weight":
        return [(p + "self_attn.o_proj.weight", tensor)]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(p + "mlp.gate_proj.weight", gate), (p + "mlp.up_proj.weight", up)]
    if suffix == "mlp.linear_fc2.weight":
        return [(p + "mlp.down_proj.weight", tensor)]
    raise ConversionError(f"unknown megatron tensor {name!r}")


def _is_state_tensor(name: str, value: object) -> bool:
    # megatron modules add `_extra_state` entries (None or bytes) for TE/fp8 bookkeeping.
    return not name.endswith("._extra_state") and isinstance(value, Tensor)


def megatron_to_hf(mc: Mapping[str, Tensor], shape: ModelShape, *, layer_offset: int = 0) -> dict[str, Tensor]:
    """Full (TP-gathered) megatron state dict → HF state dict (either norm naming)."""
    out: dict[str, Tensor] = {}
    for name, tensor in mc.items():
        if _is_state_tensor(name, tensor):
            out.update(megatron_param_to_hf(name, tensor, shape, layer_offset=layer_offset))
    return out


# ----------------------------------------------------------------------------- tensor parallel
def tp_split_kind(name: str) -> int | str | None:
    """How TP splits a megatron tensor: its dim (0/1), "gated" (fc1), or None (replicated)."""
    if name in (_EMB, _OUT):
        return 0
    if name == _FINAL:
        return None
    match = _LAYER.match(name)
    if match and match.group(2) in _TP_SPLIT:
        return _TP_SPLIT[match.group(2)]
    raise ConversionError(f"no tensor-parallel rule for {name!r}")


def shard_param(name: str, tensor: Tensor, tp: int, rank: int) -> Tensor:
    """Rank ``rank``'s slice of a full megatron tensor under tensor parallel size ``tp``."""
    kind = tp_split_kind(name)
    if tp == 1 or kind is None:
        return tensor
    if kind == "gated":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp, dim=0)[rank], torch.chunk(up, tp, dim=0)[rank]], dim=0)
    if tensor.shape[kind] % tp:
        raise ConversionError(f"{name}: dim {kind} of size {tensor.shape[kind]} is not divisible by TP={tp}")
    return torch.chunk(tensor, tp, dim=kind)[rank]


def gather_param(name: str, shards: Sequence[Tensor]) -> Tensor:
    """Inverse of :func:`shard_param`: the full tensor from every TP rank's slice (rank order)."""
    kind = tp_split_kind(name)
    if len(shards) == 1 or kind is None:
        return shards[0]
    if kind == "gated":
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=kind)


def shard_tp(full: Mapping[str, Tensor], tp: int) -> list[dict[str, Tensor]]:
    """Split a full megatron state dict into ``tp`` per-rank state dicts."""
    return [{n: shard_param(n, t, tp, r) for n, t in full.items() if _is_state_tensor(n, t)} for r in range(tp)]


def gather_tp(shards: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Inverse of :func:`shard_tp`."""
    names = [n for n, t in shards[0].items() if _is_state_tensor(n, t)]
    for r, shard in enumerate(shards[1:], start=1):
        missing = set(names) - set(shard)
        if missing:
            raise ConversionError(f"TP rank {r} lacks {_listed(missing)}")
    return {n: gather_param(n, [s[n] for s in shards]) for n in names}


# ----------------------------------------------------------------------------- pipeline parallel
def layer_offset(num_layers: int, pp: int, pp_rank: int) -> int:
    """Global index of pipeline stage ``pp_rank``'s first layer (even split)."""
    if num_layers % pp:
        raise ConversionError(f"num_layers={num_layers} is not divisible by pipeline size {pp}")
    return pp_rank * (num_layers // pp)


def split_pp(full: Mapping[str, Tensor], shape: ModelShape, pp: int) -> list[dict[str, Tensor]]:
    """Split a megatron state dict (global layer indices) into ``pp`` stage dicts (local indices)."""
    per = shape.num_layers // pp
    layer_offset(shape.num_layers, pp, 0)
    stages: list[dict[str, Tensor]] = [{} for _ in range(pp)]
    for name, tensor in full.items():
        if not _is_state_tensor(name, tensor):
            continue
        match = _LAYER.match(name)
        if match:
            i = int(match.group(1))
            stages[i // per][f"decoder.layers.{i % per}.{match.group(2)}"] = tensor
        elif name == _EMB:
            stages[0][name] = tensor
            if shape.tie_embeddings and pp > 1:
                stages[-1][_OUT] = tensor  # the last stage keeps its own copy of a tied embedding
        else:
            stages[-1][name] = tensor
    return stages


def merge_pp(stages: Sequence[Mapping[str, Tensor]], shape: ModelShape) -> dict[str, Tensor]:
    """Inverse of :func:`split_pp`."""
    pp = len(stages)
    out: dict[str, Tensor] = {}
    for p, stage in enumerate(stages):
        offset = layer_offset(shape.num_layers, pp, p)
        for name, tensor in stage.items():
            if not _is_state_tensor(name, tensor):
                continue
            match = _LAYER.match(name)
            if match:
                out[f"decoder.layers.{int(match.group(1)) + offset}.{match.group(2)}"] = tensor
            elif name == _OUT and shape.tie_embeddings:
                continue
            else:
                out[name] = tensor
    return out


def rank_state_dict(
    hf: Mapping[str, Tensor],
    shape: ModelShape,
    *,
    tp: int = 1,
    pp: int = 1,
    tp_rank: int = 0,
    pp_rank: int = 0,
    naming: Naming = "local",
) -> dict[str, Tensor]:
    """What one (tp_rank, pp_rank) GPTModel loads, straight from an HF state dict."""
    stage = split_pp(hf_to_megatron(hf, shape, tp=tp, naming=naming), shape, pp)[pp_rank]
    return {n: shard_param(n, t, tp, tp_rank) for n, t in stage.items()}


def iter_hf_names(shape: ModelShape) -> Iterator[str]:
    """Every HF tensor name of the model, in checkpoint order (for completeness checks)."""
    yield "model.embed_tokens.weight"
    for i in range(shape.num_layers):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight"
        for n in "qkv":
            yield f"{p}self_attn.{n}_proj.weight"
            if shape.qkv_bias:
                yield f"{p}self_attn.{n}_proj.bias"
        yield p + "self_attn.o_proj.weight"
        yield p + "post_attention_layernorm.weight"
        yield from (p + f"mlp.{n}_proj.weight" for n in ("gate", "up", "down"))
    yield "model.norm.weight"
    if not shape.tie_embeddings:
        yield "lm_head.weight"
