"""Ray resource requests and CPU thread counts for the actors of one job.

Every actor that works on a slot (trainer ranks, critic ranks, engines) is
scheduled into that slot's placement-group bundle (``slime.placement``: one
``{CPU: 1[, GPU: 1]}`` bundle per slot, pinned to its node) and asks for an
equal share of it: a slot holding the actor rank and an engine (colocated, or
the CPU layout's one slot per node) gives each ``0.49`` of the CPU and GPU.
Ray then narrows ``CUDA_VISIBLE_DEVICES`` of each actor to the bundle's GPU.

Threads: on CPU the trainer and the engines run one after the other (the loop is
synchronous), so each may use the node's CPUs, divided among the actors of its
own kind on that node (two trainer ranks on one node get half each).
"""

from __future__ import annotations

import os
from typing import Any

from slime.spec.layout import Layout, Slot

__all__ = ["normal_priority", "placement_options", "torch_threads"]


def _share(n_roles: int) -> float:
    # Slightly under 1/n so float rounding never makes the shares exceed the bundle.
    return max(0.01, int(100 / max(1, n_roles)) / 100 - 0.01)


def placement_options(layout: Layout, placement: Any, slot: Slot) -> dict[str, Any]:
    """``num_cpus`` / ``num_gpus`` / ``scheduling_strategy`` for one actor on ``slot``."""
    share = _share(len(layout.roles_of(slot)))
    opts: dict[str, Any] = {"num_cpus": share, "num_gpus": 0 if slot.gpu is None else share}
    if placement is not None:
        opts["scheduling_strategy"] = placement.strategy(slot)
    return opts


def torch_threads(layout: Layout, slot: Slot, kind: str, cpus_per_node: int | None) -> int:
    """Intra-op threads for an actor of ``kind`` ("train" or "engine") on ``slot``."""
    cpus = cpus_per_node or os.cpu_count() or 1
    if kind == "engine":
        same = sum(1 for e in layout.engines if e[0].node == slot.node)
    else:
        same = sum(1 for s in layout.actor if s.node == slot.node)
    return max(1, min(cpus, os.cpu_count() or cpus) // max(1, same))


def normal_priority() -> None:
    """Undo Ray's worker niceness (15 by default) for a compute actor, when allowed.

    At nice 15 a trainer or engine gets almost no CPU as soon as anything else runs on the node
    (measured here: 10x slower train steps on a busy 2-core machine). Raising priority back to 0
    needs CAP_SYS_NICE (root); without it the actor keeps Ray's niceness.
    """
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (PermissionError, OSError):
        pass
