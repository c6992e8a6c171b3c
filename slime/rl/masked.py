"""Masked reductions over padded ``[B, T]`` tensors.

``mask`` (bool, int or float) is read as a boolean, not a weight: non-zero entries count. Masked-out
entries are excluded by selection, so padding may hold inf or NaN without reaching results or
gradients; mismatched shapes raise ``ValueError`` naming both. For data parallelism,
:func:`aggregate` takes a global ``num_tokens`` and :func:`whiten` precomputed ``mean``/``var``, so
a distributed backend all-reduces :func:`masked_moments` first and still uses these functions.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = [
    "AGGREGATIONS",
    "Aggregation",
    "aggregate",
    "check_same_shape",
    "masked_mean",
    "masked_moments",
    "whiten",
    "zero_masked",
]

Aggregation = Literal["token_mean", "seq_mean_token_mean"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean")


def check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{n}={s}" for n, s in shapes.items())
        raise ValueError(f"tensors must have the same [B, T] shape, got {listed}")


def zero_masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked-out entries set to 0 by selection, not multiplication.

    Padding may hold anything (inf, NaN, huge logits): ``x * 0`` would turn those
    into NaN, and so would their gradients; ``torch.where`` does not.
    """
    check_same_shape(x=x, mask=mask)
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is set (0 when none are)."""
    x = zero_masked(x, mask)
    return x.sum() / mask.bool().to(x.dtype).sum().clamp_min(1)


def masked_moments(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum, sum of squares, count) over masked entries: all-reduce these across ranks."""
    x = zero_masked(x, mask)
    return x.sum(), x.square().sum(), mask.bool().to(x.dtype).sum()


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps: float = 1e-8,
    mean: torch.Tensor | None = None,
    var: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over masked entries; masked-out entries become 0.

    ``var`` is the population variance (divide by the count, not count - 1), so a
    batch with one trained token whitens to 0 rather than NaN.
    """
    if (mean is None) != (var is None):
        raise ValueError("whiten: pass both mean and var (global statistics) or neither")
    if mean is None or var is None:
        s, sq, n = masked_moments(x, mask)
        n = n.clamp_min(1)
        mean = s / n
        var = (sq / n - mean.square()).clamp_min(0)
    else:
        check_same_shape(x=x, mask=mask)
    return zero_masked((x - mean) * torch.rsqrt(var + eps), mask)


def aggregate(
    x: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token_mean",
    *,
    num_tokens: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token ``[B, T]`` loss to a scalar.

    - ``token_mean``: sum over masked tokens / number of masked tokens (or
      ``num_tokens``, the global count, when micro-batches or ranks are summed later).
    - ``seq_mean_token_mean``: per sequence, the mean over its masked tokens;
      then the mean over sequences that have at least one masked token.
    """
    x = zero_masked(x, mask)
    m = mask.bool().to(x.dtype)
    if agg == "token_mean":
        denom = m.sum().clamp_min(1) if num_tokens is None else num_tokens
        return x.sum() / denom
    if agg == "seq_mean_token_mean":
        if num_tokens is not None:
            raise ValueError("num_tokens applies to agg='token_mean' only")
        counts = m.sum(dim=-1)
        per_seq = x.sum(dim=-1) / counts.clamp_min(1)
        has_tokens = (counts > 0).to(x.dtype)
        return (per_seq * has_tokens).sum() / has_tokens.sum().clamp_min(1)
    raise ValueError(f"unknown loss aggregation {agg!r}; valid: {', '.join(AGGREGATIONS)}")
