"""What the preflight runs in Ray tasks in the GPU bundles: the CUDA probe and the NCCL smoke test.

:func:`cuda_probe` checks torch sees exactly the bundle's GPU and computes right on it;
:func:`nccl_rank` all_reduces ``rank + 1`` over every GPU of the job, only when every probe passed.
Failures are returned, not raised, so every bundle's answer reaches the report. gloo/NCCL are
pinned to the interface holding the node's Ray address, so collectives use Ray's network.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from typing import Any

__all__ = ["all_reduce", "cuda_probe", "nccl_rank"]


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


def _cuda_problem(gpu_ids: list[str]) -> str | None:
    """What is wrong with CUDA in this process for a bundle holding ``gpu_ids`` (None: nothing)."""
    import torch

    if not torch.cuda.is_available():
        build = (
            "torch is a CPU-only build" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
        )
        return f"torch.cuda.is_available() is False ({build}; no usable driver or device)"
    seen = torch.cuda.device_count()
    if seen != len(gpu_ids):
        return f"torch sees {seen} CUDA device(s), the bundle holds {len(gpu_ids)} (Ray GPU ids {','.join(gpu_ids)})"
    cvd = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    if cvd != gpu_ids:
        return f"CUDA_VISIBLE_DEVICES={','.join(cvd) or 'unset'} but Ray gave the bundle GPU(s) {','.join(gpu_ids)}"
    x = torch.arange(1, 5, dtype=torch.float32, device="cuda")
    got = float((x * x).sum().item())  # 1 + 4 + 9 + 16
    torch.cuda.synchronize()
    if got != 30.0:
        return f"a tensor op on the GPU returned {got:g}, expected 30"
    return None


def cuda_probe(*, bundle: int) -> dict[str, Any]:
    """Check CUDA in this GPU bundle (see the module doc); returns host, ids and ``error`` when it failed."""
    import ray

    t0 = time.monotonic()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    out: dict[str, Any] = {
        "bundle": bundle,
        "host": socket.gethostname().split(".")[0],
        "gpu_ids": gpu_ids,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        problem = _cuda_problem(gpu_ids)
    except Exception as exc:  # noqa: BLE001 - a broken driver raises from deep inside torch
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        out["error"] = problem
    else:
        import torch

        out["device_name"] = torch.cuda.get_device_name(0)
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out
