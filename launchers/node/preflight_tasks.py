"""What the preflight runs in Ray tasks on real GPU nodes: the NCCL smoke test.

* :func:`nccl_rank` — one per GPU bundle, only when every node has CUDA: an NCCL all_reduce over
  every GPU of the job (the cross-node gloo test is ``launchers.node.collective``). Failures are
  returned, not raised, so every rank's answer reaches the report.

Each rank contributes ``rank + 1``; the expected sum is ``world * (world + 1) / 2``. gloo/NCCL are
pinned to the interface that holds the node's Ray address (``GLOO_SOCKET_IFNAME``,
``NCCL_SOCKET_IFNAME``), so the collective uses the network Ray uses.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any

__all__ = ["all_reduce", "nccl_rank"]


def _pin_interface() -> None:
    import ray

    from launchers.node.context import interface_of

    iface = interface_of(ray.util.get_node_ip_address())
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
        os.environ["NCCL_SOCKET_IFNAME"] = iface


def all_reduce(backend: str, *, rank: int, world: int, addr: str, port: int, timeout_s: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    _pin_interface()
    t0 = time.monotonic()
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        value = torch.tensor([float(rank + 1)], device="cuda" if backend == "nccl" else "cpu")
        dist.all_reduce(value)
        return {
            "rank": rank,
            "value": float(value.item()),
            "seconds": round(time.monotonic() - t0, 3),
            "host": socket.gethostname().split(".")[0],
        }
    finally:
        dist.destroy_process_group()


def nccl_rank(*, rank: int, world: int, addr: str, port: int, timeout_s: float) -> dict[str, Any]:
    try:
        return all_reduce("nccl", rank=rank, world=world, addr=addr, port=port, timeout_s=timeout_s)
    except Exception as exc:  # noqa: BLE001
        return {"rank": rank, "host": socket.gethostname().split(".")[0], "error": f"{type(exc).__name__}: {exc}"}
