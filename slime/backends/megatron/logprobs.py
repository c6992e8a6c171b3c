"""Log-probs and entropy from vocab-parallel logits (each TP rank holds ``V_padded / tp`` columns).

TP = 1 defers to ``slime.rl.losses``; TP > 1 all-reduces a max and two sums instead of gathering
the vocabulary, with identity / conjugate backward ops chosen so each rank gets the full gradient
of the replicated loss. Padded vocabulary columns are masked to -inf. Math in float32; logits are
divided by the sampling temperature first (policy only, never critic values). Needs
torch.distributed only when ``group`` spans several ranks; megatron-core is not imported.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from slime.rl.losses import entropy_from_logits, logprobs_from_logits, scale_logits

__all__ = ["vocab_parallel_logprobs"]


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        y = x.clone()
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


class _CopyToRanks(torch.autograd.Function):
    """A replicated value entering per-rank terms: identity forward, gradients summed over ranks."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad, None


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    group=None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log p(targets), entropy or None)`` from this rank's logit shard ``[..., V_padded / tp]``.

    ``targets`` hold global token ids ``[...]``; ``vocab_size`` is the real
    (unpadded) vocabulary. Every rank of ``group`` must call this with its shard.
    """
    tp = 1 if group is None else dist.get_world_size(group)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} must be targets {tuple(targets.shape)} plus a vocab dim")
    if tp == 1:
        z = logits[..., :vocab_size]
        logp = logprobs_from_logits(z, targets, temperature)
        return logp, entropy_from_logits(z, temperature) if with_entropy else None

    rank = dist.get_rank(group)
    width = logits.shape[-1]
    start = rank * width
    z = scale_logits(logits, temperature)
    columns = torch.arange(start, start + width, device=z.device)
    valid = columns < vocab_size
    z = z.masked_fill(~valid, float("-inf"))
    with torch.no_grad():
        zmax = z.max(dim=-1).values
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
    shifted = z - zmax.unsqueeze(-1)
    sumexp = _AllReduceSum.apply(shifted.exp().sum(dim=-1), group)
    lse = sumexp.log() + zmax  # log-sum-exp over the whole vocabulary

    local = targets.long() - start
    mine = (local >= 0) & (local < width)
    picked = torch.gather(z, -1, local.clamp(0, width - 1).unsqueeze(-1)).squeeze(-1)
    picked = torch.where(mine, picked, torch.zeros((), dtype=z.dtype, device=z.device))
    logp = _AllReduceSum.apply(picked, group) - lse

    entropy = None
    if with_entropy:
        # lse is replicated but feeds each rank's own p * z terms: their gradients must add up.
        p = (z - _CopyToRanks.apply(lse, group).unsqueeze(-1)).exp()
        pz = torch.where(valid, p * z.masked_fill(~valid, 0.0), torch.zeros((), dtype=z.dtype, device=z.device))
        entropy = lse - _AllReduceSum.apply(pz.sum(dim=-1), group)
    return logp, entropy
