"""Weights out of a megatron trainer rank, in HF names and full shapes: for the engines' weight sync
(``iter_hf``) and for the HF export (``write_hf``).

Collective: every rank of the model-parallel groups must iterate the same pairs, since each TP / expert-TP
shard and each expert-parallel rank's experts are all-gathered. A rank yields its own pipeline stage only;
``write_hf`` has each stage's first (TP, DP, CP) rank write that stage's shards and stage 0 write the
index, so the output directory must be on storage every trainer node shares.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slime.backends.megatron import config as mcfg
from slime.backends.megatron import convert, hf_io

__all__ = ["iter_hf", "write_hf"]


def _gather(name: str, shard: torch.Tensor, size: int, group: Any) -> torch.Tensor:
    """The full tensor from a (expert-)tensor-parallel group's shards (no-op when replicated or size 1)."""
    if size == 1 or convert.tp_split_kind(name) is None:
        return shard
    parts = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(parts, shard.contiguous(), group=group)
    return convert.gather_param(name, parts)


def iter_hf(
    pairs: Iterable[tuple[str, Any]], shape: mcfg.ModelShape, *, tp: int, etp: int, ep: int, pp: int, pp_rank: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """Megatron ``(name, local shard)`` pairs of pipeline stage ``pp_rank`` → HF ``(name, full tensor)``."""
    from megatron.core import parallel_state as ps

    offset = convert.layer_offset(shape.num_layers, pp, pp_rank)
    n_local = shape.moe.num_experts // ep if shape.moe else 0
    for name, param in pairs:
        if not isinstance(param, torch.Tensor) or name.endswith("_extra_state"):
            continue
        if name == "output_layer.weight" and shape.tie_embeddings:
            continue
        if not convert.is_expert_param(name):
            full = _gather(name, param.detach(), tp, ps.get_tensor_model_parallel_group())
            yield from convert.megatron_param_to_hf(name, full, shape, layer_offset=offset)
            continue
        full = _gather(name, param.detach(), etp, ps.get_expert_tensor_parallel_group())
        per_rank = [full]
        if ep > 1:  # expert-parallel rank r holds experts [r n, (r+1) n): local index i is i + r n there
            per_rank = [torch.empty_like(full) for _ in range(ep)]
            dist.all_gather(per_rank, full.contiguous(), group=ps.get_expert_model_parallel_group())
        for r, tensor in enumerate(per_rank):
            yield from convert.megatron_param_to_hf(name, tensor, shape, layer_offset=offset, expert_offset=r * n_local)


def write_hf(
    out: Path, pairs: Iterable[tuple[str, torch.Tensor]], coords: mcfg.RankCoords, *, pp: int, model_dir: Path
) -> Path:
    """Write an HF checkpoint to ``out`` from every rank's :func:`iter_hf` pairs (collective, see the module doc);
    the tokenizer and config files come from ``model_dir``."""
    writer = coords.tp == 0 and coords.dp == 0 and coords.cp == 0
    if writer:
        mapping = hf_io.write_shards(out, pairs, prefix=f"model-stage{coords.pp:03d}")
        (out / f".stage{coords.pp:03d}.json").write_text(json.dumps(mapping))
    else:
        for _ in pairs:  # take part in the TP all-gathers
            pass
    dist.barrier()
    if writer and coords.pp == 0:
        mapping = {}
        for p in range(pp):
            part = out / f".stage{p:03d}.json"
            mapping.update(json.loads(part.read_text()))
            part.unlink()
        hf_io.write_index(out, mapping)
        hf_io.copy_side_files(model_dir, out)
    dist.barrier()
    return out
