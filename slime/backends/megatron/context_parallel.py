"""Context parallel (CP) for the megatron backend: the sequence split, the K/V all-gather, CP attention.

Split: megatron-core's load-balanced layout (rank ``r`` holds chunks ``r`` and ``2*cp-1-r``), so
every rank gets equal causal work. :func:`cp_attention` all-gathers K/V over the CP group and runs
SDPA per local query chunk; this is **not ring attention**: K/V memory does not shrink with ``cp``
(TE's ``p2p`` CP, with ``attention-backend: te``, is). :func:`gather_seq` reassembles per-token
log-probs so every rank computes the same loss; its backward keeps the rank's own positions.
Guaranteed (CPU-tested with gloo): log-probs, losses and gradients equal cp = 1 to fp32 rounding.
Not supported: packed (THD) sequences, masks other than causal. Details: docs/design-notes.md.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

__all__ = ["all_gather_seq", "chunk_ids", "cp_attention", "gather_seq", "split_seq"]


def chunk_ids(cp_rank: int, cp: int) -> tuple[int, int]:
    """The two global chunk indices CP rank ``cp_rank`` holds."""
    return cp_rank, 2 * cp - 1 - cp_rank


def split_seq(t: torch.Tensor, cp: int, cp_rank: int, dim: int = 1) -> torch.Tensor:
    """This rank's part of ``t`` along ``dim`` (length divisible by ``2 * cp``): chunks r and 2cp-1-r."""
    if cp == 1:
        return t
    n = t.shape[dim]
    if n % (2 * cp):
        raise ValueError(f"sequence length {n} is not divisible by 2 x context-parallel size = {2 * cp}")
    chunks = t.chunk(2 * cp, dim=dim)
    a, b = chunk_ids(cp_rank, cp)
    return torch.cat((chunks[a], chunks[b]), dim=dim)


def _reorder(parts: list[torch.Tensor], cp: int, dim: int) -> torch.Tensor:
    """Per-rank pieces (each: its two chunks) → the full sequence in global order."""
    ordered: list[torch.Tensor | None] = [None] * (2 * cp)
    for r, piece in enumerate(parts):
        first, second = piece.chunk(2, dim=dim)
        a, b = chunk_ids(r, cp)
        ordered[a], ordered[b] = first, second
    return torch.cat(ordered, dim=dim)  # type: ignore[arg-type]


def _gather(t: torch.Tensor, group, dim: int) -> torch.Tensor:
    cp = dist.get_world_size(group)
    parts = [torch.empty_like(t) for _ in range(cp)]
    dist.all_gather(parts, t.contiguous(), group=group)
    return _reorder(parts, cp, dim)


class _GatherReplicated(torch.autograd.Function):
    """Gather to the full sequence; the consumer is replicated on every rank, so backward keeps own slice."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, group, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim = group, dim
        return _gather(t, group, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cp, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return split_seq(grad, cp, rank, ctx.dim).contiguous(), None, None


class _AllGatherSeq(_GatherReplicated):
    """All-gather to the full sequence; backward sums every rank's gradient and keeps own slice."""

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cp, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        grad = grad.contiguous()
        if dist.get_backend(ctx.group) == "nccl":
            # Put the full gradient in rank order (rank r's two chunks contiguous), then reduce-scatter.
            mine = torch.cat([split_seq(grad, cp, r, ctx.dim) for r in range(cp)], dim=ctx.dim)
            pieces = list(mine.chunk(cp, dim=ctx.dim))
            out = torch.empty_like(pieces[rank])
            dist.reduce_scatter(out, [p.contiguous() for p in pieces], group=ctx.group)
            return out, None, None
        dist.all_reduce(grad, group=ctx.group)  # gloo has no reduce-scatter
        return split_seq(grad, cp, rank, ctx.dim).contiguous(), None, None


def gather_seq(t: torch.Tensor, group, dim: int = 1) -> torch.Tensor:
    """Per-rank sequence pieces → the full sequence, for a loss every CP rank computes identically."""
    if group is None or dist.get_world_size(group) == 1:
        return t
    return _GatherReplicated.apply(t, group, dim)


def all_gather_seq(t: torch.Tensor, group, dim: int) -> torch.Tensor:
    """Per-rank sequence pieces → the full sequence, for per-rank consumers (K/V): reduce-scatter backward."""
    return _AllGatherSeq.apply(t, group, dim)


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group,
    *,
    scale: float,
    dropout_p: float = 0.0,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Causal attention of local queries ``[b, h, s_local, d]`` over the whole sequence's K/V.

    ``k``/``v`` are this rank's ``[b, g, s_local, d]``; returns ``[b, h, s_local, d]``.
    """
    from torch.nn.attention.bias import causal_lower_right

    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    s_local = q.shape[2]
    if s_local % 2:
        raise ValueError(f"local sequence length {s_local} must be even (two chunks per context-parallel rank)")
    c = s_local // 2
    k_full, v_full = all_gather_seq(k, group, 2), all_gather_seq(v, group, 2)
    outs = []
    for part, j in zip(q.split(c, dim=2), chunk_ids(rank, cp)):
        end = (j + 1) * c  # keys of chunks 0..j; the mask's lower-right diagonal is this chunk's own
        outs.append(
            F.scaled_dot_product_attention(
                part,
                k_full[:, :, :end],
                v_full[:, :, :end],
                attn_mask=causal_lower_right(c, end),
                dropout_p=dropout_p,
                scale=scale,
                enable_gqa=enable_gqa,
            )
        )
    return torch.cat(outs, dim=2)
