"""AdamW with the spec's learning-rate schedule (linear warm-up, then constant / linear / cosine decay).

The schedule is a pure function of the optimizer-step count (``lr_at``), so a
resumed run that restores the step count continues on exactly the same curve.
``torch.optim.AdamW`` is used as is: its state dict round-trips through
``torch.save`` bit for bit, which exact resume needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["build_adamw", "lr_at", "set_lr"]


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Learning rate for optimizer step ``step`` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant" or total_steps <= warmup_steps:
        return lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr_schedule {schedule!r}; valid: constant, linear, cosine")


def build_adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> torch.optim.AdamW:
    return torch.optim.AdamW(list(params), lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
