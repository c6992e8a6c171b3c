"""HF <-> megatron-core state dicts (Qwen2, Llama, Qwen3, Qwen3-MoE, Qwen2-MoE, DeepSeek-V3), with TP, PP and EP.

Maps every HF tensor name to its megatron-core ``GPTModel`` name (local layer specs, or TE names
with ``naming="te"`` for dense models) and shards by TP (column/row parallel), EP (contiguous
expert ranges renumbered from 0, :func:`shard_ep`) and PP (contiguous layer ranges). Reads fused
and per-expert HF MoE weights; writes per expert. Guaranteed: HF -> megatron -> HF is bit-identical
(reshapes, concatenations and slices only) for any layout :func:`~.config.check_parallel` accepts;
unknown or missing names raise :class:`ConversionError` listing them. Needs torch, not
megatron-core. The name-by-name layout table is in docs/design-notes.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Literal

import torch

from slime.backends.megatron.config import ModelShape, padded_vocab_size

__all__ = [
    "ConversionError",
    "Naming",
    "expert_index",
    "gather_ep",
    "gather_param",
    "gather_tp",
    "global_expert_name",
    "hf_to_megatron",
    "is_expert_param",
    "iter_hf_names",
    "layer_offset",
    "local_expert_name",
    "local_experts",
    "megatron_param_to_hf",
    "megatron_to_hf",
    "merge_pp",
    "rank_state_dict",
    "shard_ep",
    "shard_param",
    "shard_tp",
    "split_pp",
    "tp_split_kind",
    "unfuse_hf_experts",
]

Naming = Literal["local", "te"]
Tensor = torch.Tensor

_EMB = "embedding.word_embeddings.weight"
_OUT = "output_layer.weight"
_FINAL = "decoder.final_layernorm.weight"
_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_HF_EXPERT = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$")
_HF_FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_NORMS: dict[str, tuple[str, str]] = {
    "local": ("input_layernorm.weight", "pre_mlp_layernorm.weight"),
    "te": ("self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"),
}
# Layer-local megatron suffix -> how TP splits it: 0/1 = dim, "gated" = fc1, None = replicated.
_TP_SPLIT: dict[str, int | str | None] = {
    "self_attention.linear_qkv.weight": 0,
    "self_attention.linear_qkv.bias": 0,
    "self_attention.linear_proj.weight": 1,
    "self_attention.q_layernorm.weight": None,
    "self_attention.k_layernorm.weight": None,
    "self_attention.kv_layernorm.weight": None,
    "self_attention.linear_q_proj.weight": 0,
    "self_attention.linear_q_down_proj.weight": None,  # replicated (attention.py: MLA down-projections)
    "self_attention.linear_q_up_proj.weight": 0,
    "self_attention.linear_kv_down_proj.weight": None,
    "self_attention.linear_kv_up_proj.weight": 0,
    "mlp.linear_fc1.weight": "gated",
    "mlp.linear_fc2.weight": 1,
    "mlp.router.weight": None,
    "mlp.router.expert_bias": None,
    "mlp.shared_experts.linear_fc1.weight": "gated",
    "mlp.shared_experts.linear_fc2.weight": 1,
    "mlp.shared_experts.gate_weight": None,
    "input_layernorm.weight": None,
    "pre_mlp_layernorm.weight": None,
    "self_attention.linear_qkv.layer_norm_weight": None,
    "mlp.linear_fc1.layer_norm_weight": None,
}
# Megatron MLA / q-k-norm / MoE suffix <-> HF suffix (plain copies).
_MLA = {
    "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",
    "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_a_layernorm.weight",
    "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
    "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
    "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
    "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
}
_QK_NORM = {
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_ROUTER = {"mlp.router.weight": "mlp.gate.weight", "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias"}


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


def unfuse_hf_experts(hf: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """transformers 5's in-memory fused experts (``mlp.experts.gate_up_proj`` [E, 2I, H], ``down_proj``
    [E, H, I]) as the per-expert tensors of a checkpoint; other tensors unchanged."""
    out: dict[str, Tensor] = {}
    for name, tensor in hf.items():
        match = _HF_FUSED.match(name)
        if not match:
            out[name] = tensor
            continue
        p = f"model.layers.{match.group(1)}.mlp.experts."
        for e in range(tensor.shape[0]):
            if match.group(2) == "down_proj":
                out[f"{p}{e}.down_proj.weight"] = tensor[e]
            else:
                gate, up = torch.chunk(tensor[e], 2, dim=0)
                out[f"{p}{e}.gate_proj.weight"], out[f"{p}{e}.up_proj.weight"] = gate, up
    return out


# ----------------------------------------------------------------------------- HF names of one layer
def _mla_names(shape: ModelShape) -> dict[str, str]:
    """The MLA tensors this model has: the q LoRA pair + norm, or a plain q projection without a q LoRA rank."""
    q_lora = shape.mla.q_lora_rank is not None
    plain_q = "self_attention.linear_q_proj.weight"
    q_lora_names = ("linear_q_down_proj", "q_layernorm", "linear_q_up_proj")
    return {
        mc: hf
        for mc, hf in _MLA.items()
        if (mc == plain_q and not q_lora) or (mc != plain_q and (q_lora or not any(n in mc for n in q_lora_names)))
    }


def _hf_mlp(prefix: str, names: Iterable[str] = ("gate", "up", "down")) -> list[str]:
    return [f"{prefix}{n}_proj.weight" for n in names]


def _layer_hf_names(shape: ModelShape, i: int) -> Iterator[str]:
    """HF tensor names of stage-local layer ``i`` (model.layers.<offset + i>.*), checkpoint order."""
    p = f"model.layers.{shape.layer_offset + i}."
    yield p + "input_layernorm.weight"
    if shape.mla is not None:
        yield from (p + hf for hf in _mla_names(shape).values())
    else:
        for n in "qkv":
            yield f"{p}self_attn.{n}_proj.weight"
            if shape.qkv_bias:
                yield f"{p}self_attn.{n}_proj.bias"
        if shape.qk_layernorm:
            yield from (p + hf for hf in _QK_NORM.values())
    yield p + "self_attn.o_proj.weight"
    yield p + "post_attention_layernorm.weight"
    if not shape.is_moe_layer(i):
        yield from _hf_mlp(p + "mlp.")
        return
    e = shape.moe
    yield p + "mlp.gate.weight"
    if e.expert_bias:
        yield p + "mlp.gate.e_score_correction_bias"
    for x in range(e.num_experts):
        yield from _hf_mlp(f"{p}mlp.experts.{x}.")
    if e.shared_ffn_hidden_size:
        yield from _hf_mlp(f"{p}mlp.{e.shared_prefix}.")
    if e.shared_gate:
        yield p + "mlp.shared_expert_gate.weight"


def iter_hf_names(shape: ModelShape) -> Iterator[str]:
    """Every HF tensor name of the model, in checkpoint order (for completeness checks)."""
    yield "model.embed_tokens.weight"
    for i in range(shape.num_layers):
        yield from _layer_hf_names(shape, i)
    yield "model.norm.weight"
    if not shape.tie_embeddings:
        yield "lm_head.weight"


# ----------------------------------------------------------------------------- HF -> megatron
def _layer_to_megatron(take, shape: ModelShape, i: int, naming: Naming) -> dict[str, Tensor]:
    p, out = f"model.layers.{shape.layer_offset + i}.", {}
    in_norm, mlp_norm = _NORMS[naming]
    att = p + "self_attn."
    out[in_norm] = take(p + "input_layernorm.weight")
    if shape.mla is not None:
        out.update({mc: take(p + hf) for mc, hf in _mla_names(shape).items()})
    else:
        out["self_attention.linear_qkv.weight"] = _fuse_qkv(
            take(att + "q_proj.weight"), take(att + "k_proj.weight"), take(att + "v_proj.weight"), shape
        )
        if shape.qkv_bias:
            out["self_attention.linear_qkv.bias"] = _fuse_qkv(
                take(att + "q_proj.bias"), take(att + "k_proj.bias"), take(att + "v_proj.bias"), shape
            )
        if shape.qk_layernorm:
            out.update({mc: take(p + hf) for mc, hf in _QK_NORM.items()})
    out["self_attention.linear_proj.weight"] = take(att + "o_proj.weight")
    out[mlp_norm] = take(p + "post_attention_layernorm.weight")
    if not shape.is_moe_layer(i):
        gate, up, down = (take(n) for n in _hf_mlp(p + "mlp."))
        out["mlp.linear_fc1.weight"], out["mlp.linear_fc2.weight"] = torch.cat([gate, up], dim=0), down
        return out
    e = shape.moe
    out["mlp.router.weight"] = take(p + "mlp.gate.weight")
    if e.expert_bias:
        out["mlp.router.expert_bias"] = take(p + "mlp.gate.e_score_correction_bias")
    for x in range(e.num_experts):
        gate, up, down = (take(n) for n in _hf_mlp(f"{p}mlp.experts.{x}."))
        out[f"mlp.experts.local_experts.{x}.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[f"mlp.experts.local_experts.{x}.linear_fc2.weight"] = down
    if e.shared_ffn_hidden_size:
        gate, up, down = (take(n) for n in _hf_mlp(f"{p}mlp.{e.shared_prefix}."))
        out["mlp.shared_experts.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out["mlp.shared_experts.linear_fc2.weight"] = down
    if e.shared_gate:
        out["mlp.shared_experts.gate_weight"] = take(p + "mlp.shared_expert_gate.weight")
    return out


def hf_to_megatron(
    hf: Mapping[str, Tensor], shape: ModelShape, *, tp: int = 1, naming: Naming = "local"
) -> dict[str, Tensor]:
    """The full (unsharded: every expert, global index) megatron state dict of an HF state dict.

    Layer ``i`` of ``shape`` reads ``model.layers.<shape.layer_offset + i>``; the vocab is padded for ``tp``."""
    if naming not in _NORMS:
        raise ConversionError(f"naming must be 'local' or 'te', got {naming!r}")
    hf = unfuse_hf_experts(hf)
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
    for i in range(shape.num_layers):
        for suffix, tensor in _layer_to_megatron(take, shape, i, naming).items():
            out[f"decoder.layers.{i}.{suffix}"] = tensor
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
def _mlp_to_hf(prefix: str, which: str, tensor: Tensor) -> list[tuple[str, Tensor]]:
    if which == "linear_fc1":
        gate, up = torch.chunk(tensor, 2, dim=0)
        return [(prefix + "gate_proj.weight", gate), (prefix + "up_proj.weight", up)]
    return [(prefix + "down_proj.weight", tensor)]


def megatron_param_to_hf(
    name: str, tensor: Tensor, shape: ModelShape, *, layer_offset: int = 0, expert_offset: int = 0
) -> list[tuple[str, Tensor]]:
    """One full (TP-gathered) megatron tensor → its HF tensor(s); stage-local layer N becomes N + offset and
    local expert e becomes e + ``expert_offset`` (an expert-parallel rank's first expert).

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
    p, suffix = f"model.layers.{int(match.group(1)) + layer_offset}.", match.group(2)
    if suffix in (_NORMS["local"][0], _NORMS["te"][0]):
        return [(p + "input_layernorm.weight", tensor)]
    if suffix in (_NORMS["local"][1], _NORMS["te"][1]):
        return [(p + "post_attention_layernorm.weight", tensor)]
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = _split_qkv(tensor, shape)
        return [(f"{p}self_attn.{n}_proj.{kind}", t) for n, t in (("q", q), ("k", k), ("v", v))]
    table = _MLA if shape.mla is not None else _QK_NORM
    simple = {**table, **_ROUTER, "self_attention.linear_proj.weight": "self_attn.o_proj.weight"}
    simple["mlp.shared_experts.gate_weight"] = "mlp.shared_expert_gate.weight"
    if suffix in simple:
        return [(p + simple[suffix], tensor)]
    expert = _EXPERT.match(suffix)
    if expert:
        return _mlp_to_hf(f"{p}mlp.experts.{int(expert.group(1)) + expert_offset}.", expert.group(2), tensor)
    if suffix in ("mlp.linear_fc1.weight", "mlp.linear_fc2.weight"):
        return _mlp_to_hf(p + "mlp.", suffix.split(".")[1], tensor)
    if suffix in ("mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight") and shape.moe:
        return _mlp_to_hf(f"{p}mlp.{shape.moe.shared_prefix}.", suffix.split(".")[2], tensor)
    raise ConversionError(f"unknown megatron tensor {name!r}")


def _is_state_tensor(name: str, value: object) -> bool:
    # megatron modules add `_extra_state` entries (None or bytes) for TE/fp8 bookkeeping.
    return not name.endswith("._extra_state") and isinstance(value, Tensor)


def megatron_to_hf(mc: Mapping[str, Tensor], shape: ModelShape, *, layer_offset: int = 0) -> dict[str, Tensor]:
    """Full (TP- and EP-gathered) megatron state dict → HF state dict (either norm naming)."""
    out: dict[str, Tensor] = {}
    for name, tensor in mc.items():
        if _is_state_tensor(name, tensor):
            out.update(megatron_param_to_hf(name, tensor, shape, layer_offset=layer_offset))
    return out


# ----------------------------------------------------------------------------- tensor parallel
def is_expert_param(name: str) -> bool:
    """Whether a megatron tensor belongs to a routed expert (split over EP and the expert-TP group)."""
    match = _LAYER.match(name)
    return bool(match and _EXPERT.match(match.group(2)))


def expert_index(name: str) -> int:
    """The (local) expert index of a routed-expert tensor name."""
    return int(_EXPERT.match(_LAYER.match(name).group(2)).group(1))


def tp_split_kind(name: str) -> int | str | None:
    """How TP splits a megatron tensor: its dim (0/1), "gated" (fc1), or None (replicated).

    Routed experts use this same rule over the expert-tensor-parallel group."""
    if name in (_EMB, _OUT):
        return 0
    if name == _FINAL:
        return None
    match = _LAYER.match(name)
    if match and match.group(2) in _TP_SPLIT:
        return _TP_SPLIT[match.group(2)]
    if match and (expert := _EXPERT.match(match.group(2))):
        return "gated" if expert.group(2) == "linear_fc1" else 1
    raise ConversionError(f"no tensor-parallel rule for {name!r}")


def shard_param(name: str, tensor: Tensor, tp: int, rank: int) -> Tensor:
    """Rank ``rank``'s slice of a full megatron tensor under tensor parallel size ``tp`` (for a routed
    expert: the expert-tensor-parallel size and rank)."""
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


def shard_tp(full: Mapping[str, Tensor], tp: int, *, etp: int | None = None) -> list[dict[str, Tensor]]:
    """Split a megatron state dict into ``tp`` per-rank state dicts; routed experts over ``etp`` (default tp)
    expert-tensor ranks, rank r taking expert-TP slice ``r % etp`` (``etp`` must divide ``tp`` or be 1)."""
    etp = tp if etp is None else etp
    out = []
    for r in range(tp):
        out.append(
            {
                n: shard_param(n, t, etp, r % etp) if is_expert_param(n) else shard_param(n, t, tp, r)
                for n, t in full.items()
                if _is_state_tensor(n, t)
            }
        )
    return out


def gather_tp(shards: Sequence[Mapping[str, Tensor]], *, etp: int | None = None) -> dict[str, Tensor]:
    """Inverse of :func:`shard_tp`."""
    etp = len(shards) if etp is None else etp
    names = [n for n, t in shards[0].items() if _is_state_tensor(n, t)]
    for r, shard in enumerate(shards[1:], start=1):
        missing = set(names) - set(shard)
        if missing:
            raise ConversionError(f"TP rank {r} lacks {_listed(missing)}")
    return {n: gather_param(n, [s[n] for s in (shards[:etp] if is_expert_param(n) else shards)]) for n in names}


# ----------------------------------------------------------------------------- expert parallel
def shard_ep(full: Mapping[str, Tensor], shape: ModelShape, ep: int, rank: int) -> dict[str, Tensor]:
    """Expert-parallel rank ``rank``'s state dict: its experts ``[rank n, (rank+1) n)`` renumbered from 0,
    every other tensor unchanged (n = experts / ep)."""
    if shape.moe is None or ep == 1:
        return dict(full)
    if shape.moe.num_experts % ep:
        raise ConversionError(f"{shape.moe.num_experts} experts are not divisible by expert parallel {ep}")
    n = shape.moe.num_experts // ep
    out: dict[str, Tensor] = {}
    for name, tensor in full.items():
        if not is_expert_param(name):
            out[name] = tensor
            continue
        e = expert_index(name)
        if rank * n <= e < (rank + 1) * n:
            out[name.replace(f".local_experts.{e}.", f".local_experts.{e - rank * n}.")] = tensor
    return out


def gather_ep(shards: Sequence[Mapping[str, Tensor]], shape: ModelShape) -> dict[str, Tensor]:
    """Inverse of :func:`shard_ep` (shards in expert-parallel rank order)."""
    if len(shards) == 1 or shape.moe is None:
        return dict(shards[0])
    n = shape.moe.num_experts // len(shards)
    out: dict[str, Tensor] = {}
    for rank, shard in enumerate(shards):
        for name, tensor in shard.items():
            if is_expert_param(name):
                e = expert_index(name)
                out[name.replace(f".local_experts.{e}.", f".local_experts.{e + rank * n}.")] = tensor
            elif rank == 0:
                out[name] = tensor
    return out


def local_experts(shape: ModelShape, ep: int, rank: int) -> tuple[ModelShape, tuple[int, int]]:
    """The shape as expert-parallel rank ``rank`` sees it (its n = experts / ep experts only) and its
    experts as ``(first global index, n)``; with it a rank converts only the experts it holds."""
    if shape.moe is None or ep == 1:
        return shape, (0, shape.moe.num_experts if shape.moe else 0)
    n = shape.moe.num_experts // ep
    return replace(shape, moe=replace(shape.moe, num_experts=n)), (rank * n, n)


def _renumber_hf_expert(name: str, delta: int) -> str:
    match = _HF_EXPERT.match(name)
    if not match:
        return name
    return f"model.layers.{match.group(1)}.mlp.experts.{int(match.group(2)) + delta}.{match.group(3)}_proj.weight"


def global_expert_name(name: str, experts: tuple[int, int]) -> str:
    """An HF name with a rank-local expert index (from :func:`local_experts`' shape) → the checkpoint's name."""
    return _renumber_hf_expert(name, experts[0])


def local_expert_name(name: str, experts: tuple[int, int]) -> str:
    """Inverse of :func:`global_expert_name`."""
    return _renumber_hf_expert(name, -experts[0])


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
    ep: int = 1,
    etp: int | None = None,
    tp_rank: int = 0,
    pp_rank: int = 0,
    ep_rank: int = 0,
    etp_rank: int | None = None,
    naming: Naming = "local",
) -> dict[str, Tensor]:
    """What one (tp, pp, ep, expert-tp) rank's GPTModel loads, straight from an HF state dict."""
    etp = tp if etp is None else etp
    etp_rank = tp_rank % etp if etp_rank is None else etp_rank
    stage = split_pp(hf_to_megatron(hf, shape, tp=tp, naming=naming), shape, pp)[pp_rank]
    local = shard_ep(stage, shape, ep, ep_rank)
    return {
        n: shard_param(n, t, etp, etp_rank) if is_expert_param(n) else shard_param(n, t, tp, tp_rank)
        for n, t in local.items()
    }
