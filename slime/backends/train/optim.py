"""AdamW with the spec's learning-rate schedule (linear warm-up, then constant / linear / cosine decay).

The schedule is a pure function of the optimizer-step count (``lr_at``), so a resumed run continues
on the same curve. On CPU the update is :class:`AdamW` below (torch's single-tensor AdamW arithmetic
and state-dict layout, without ``torch.optim.Optimizer``, whose constructor imports
``torch._dynamo``); on CUDA, ``torch.optim.AdamW`` (foreach kernels). Either state dict round-trips
through ``torch.save`` bit for bit, as exact resume needs, and each loads the other's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

__all__ = ["AdamW", "build_adamw", "lr_at", "set_lr"]


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


class AdamW:
    """``torch.optim.AdamW(foreach=False)`` for one parameter group: the same update, operation for operation
    (so the same bits), and the same ``state_dict`` layout (state keyed by parameter index, a ``step`` tensor,
    ``exp_avg``, ``exp_avg_sq``; the group's hyper-parameters). Not provided: amsgrad, maximize, complex
    parameters, several groups, hooks, closures."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        self.param_groups = [
            {
                "params": list(params),
                "lr": lr,
                "betas": tuple(betas),
                "eps": eps,
                "weight_decay": weight_decay,
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": None,
                "decoupled_weight_decay": True,
            }
        ]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        g = self.param_groups[0]
        lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
        for p in g["params"]:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:  # as torch's _init_group: a float32 step counter, zero moments
                st = self.state[p] = {
                    "step": torch.tensor(0.0, dtype=torch.float32),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                }
            st["step"] += 1
            if wd != 0:
                p.mul_(1 - lr * wd)
            st["exp_avg"].lerp_(p.grad, 1 - beta1)
            st["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
            step = st["step"].item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            denom = (st["exp_avg_sq"].sqrt() / bias_correction2**0.5).add_(eps)
            p.addcdiv_(st["exp_avg"], denom, value=-(lr / bias_correction1))

    def state_dict(self) -> dict:
        params = self.param_groups[0]["params"]
        index = {id(p): i for i, p in enumerate(params)}
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {
            "state": {index[id(p)]: dict(st) for p, st in self.state.items()},
            "param_groups": [{**group, "params": list(range(len(params)))}],
        }

    def load_state_dict(self, state: dict) -> None:
        (saved,) = state["param_groups"]
        params = self.param_groups[0]["params"]
        if len(saved["params"]) != len(params):
            raise ValueError(f"optimizer state has {len(saved['params'])} parameters, the model {len(params)}")
        self.param_groups[0].update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, st in state["state"].items():
            p = params[saved["params"].index(int(i))]
            self.state[p] = {
                "step": st["step"].detach().to(torch.float32, copy=True).cpu(),
                "exp_avg": st["exp_avg"].detach().to(p.device, p.dtype, copy=True),
                "exp_avg_sq": st["exp_avg_sq"].detach().to(p.device, p.dtype, copy=True),
            }


def build_adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float
) -> AdamW | torch.optim.AdamW:
    params = list(params)
    if all(p.device.type == "cpu" for p in params):
        return AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)


def set_lr(optimizer: AdamW | torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
