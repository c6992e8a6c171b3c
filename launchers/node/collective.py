"""The preflight's cross-node collective, run by each node's bootstrap as a short-lived subprocess.

Started at once so its torch import overlaps Ray's start-up; waits for the head's go-ahead, joins a
gloo all_reduce of ``rank + 1`` across the nodes and writes ``collective-<instance>-<rank>.json``
(value, time, the node's GPU facts), then exits, returning its memory. A subprocess, not a thread
(torch would stay loaded) nor a Ray task (it would start after every node joined). gloo is pinned
to the Ray address's interface. Exit codes: 0 written (a failed all_reduce too), 1 gave up.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from slime.core.paths import RunPaths, atomic_write

__all__ = ["gpu_facts", "main"]


def gpu_facts() -> dict[str, Any]:
    """``nvidia-smi -L`` count (None without the tool) and torch.cuda's count (0 without CUDA)."""
    out: dict[str, Any] = {"nvidia_smi": None, "torch_cuda": None}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            out["nvidia_smi"] = sum(1 for line in proc.stdout.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.TimeoutExpired):
            out["nvidia_smi"] = 0
    import torch

    out["torch_cuda"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return out


def _wait_for(path: Path, done: Path, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if done.exists():
            return False
        time.sleep(0.05)
    return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launchers.node.collective")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--task", type=int, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--instance", required=True)
    p.add_argument("--wait", type=float, required=True, help="seconds to wait for the head's go-ahead")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the other nodes' ranks")
    args = p.parse_args(argv)
    from slime.core.rendezvous import Rendezvous

    rdv = Rendezvous(RunPaths(args.run_dir).task(args.task).rendezvous, args.instance)
    host = socket.gethostname().split(".")[0]
    result: dict[str, Any] = {"rank": args.rank, "host": host}
    t0 = time.monotonic()
    try:
        import torch
        import torch.distributed as dist

        result.update(gpu_facts())
        result["import_seconds"] = round(time.monotonic() - t0, 3)
    except Exception as exc:  # noqa: BLE001 - reported to the head
        result["error"] = f"importing torch failed: {type(exc).__name__}: {exc}"
        atomic_write(rdv.collective_file(args.rank), json.dumps(result) + "\n")
        return 0
    if not _wait_for(rdv.go_file, rdv.done_file, time.monotonic() + args.wait):
        return 1
    head = rdv.head() or {}
    addr, port = head.get("ip"), head.get("gloo_port")
    try:
        own = (rdv.node(args.rank) or {}).get("ip")
        from launchers.node.context import interface_of

        iface = interface_of(own) if own else None
        if iface:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
        t = time.monotonic()
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addr}:{port}",
            rank=args.rank,
            world_size=args.world,
            timeout=datetime.timedelta(seconds=args.timeout),
        )
        try:
            value = torch.tensor([float(args.rank + 1)])
            dist.all_reduce(value)
            result.update(value=float(value.item()), seconds=round(time.monotonic() - t, 3))
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001
        result["error"] = f"{type(exc).__name__}: {exc}".strip()
    atomic_write(rdv.collective_file(args.rank), json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
