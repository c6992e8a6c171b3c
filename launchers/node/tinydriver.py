"""A stand-in driver for tests and cluster checks: ``python -m launchers.node.tinydriver RUN_DIR --task N``.

Selected with ``--driver launchers.node.tinydriver`` or ``SLIME_DRIVER=launchers.node.tinydriver``. It
connects to the job's Ray cluster (``RAY_ADDRESS``, set by the bootstrap), runs one tiny task
on every node, and writes what it saw to ``tasks/<N>/driver-probe.json``: the nodes (host, IP,
node id), the cluster id and GCS address, the task's sweep overrides, signals received.

Knobs (environment): ``SLIME_TINYDRIVER_SLEEP`` seconds to stay up (signals interrupt it);
``SLIME_TINYDRIVER_WAIT_TASKS=K`` stay up until tasks 0..K-1 all wrote their probe (bounded by
``SLIME_TINYDRIVER_WAIT_S``, default 120) — proves K clusters were up at the same time;
``SLIME_TINYDRIVER_EXIT`` exit code to return. USR1 is recorded; TERM writes the probe and exits 143.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from slime.core.paths import RunPaths, atomic_write

__all__ = ["main"]


def _where() -> dict:
    import ray

    return {
        "host": socket.gethostname().split(".")[0],
        "ip": ray.util.get_node_ip_address(),
        "node_id": ray.get_runtime_context().get_node_id(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launchers.node.tinydriver")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--task", type=int, default=0)
    args = p.parse_args(argv)
    paths = RunPaths(args.run_dir)
    tp = paths.task(args.task)
    signals: list[str] = []
    wake = threading.Event()
    term = threading.Event()

    def on_signal(signum, _frame):
        signals.append(signal.Signals(signum).name)
        wake.set()
        if signum == signal.SIGTERM:
            term.set()

    import ray

    t0 = time.monotonic()
    ray.init(address=os.environ.get("RAY_ADDRESS") or "auto", logging_level="WARNING", log_to_driver=False)
    signal.signal(signal.SIGUSR1, on_signal)  # after ray.init, which installs its own SIGTERM handler
    signal.signal(signal.SIGTERM, on_signal)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    remote = ray.remote(num_cpus=0)(_where)
    seen = ray.get(
        [
            remote.options(resources={k: 0.0001}).remote()
            for n in nodes
            for k in n["Resources"]
            if k.startswith("slime_node_")
        ],
        timeout=60,
    )
    node = ray._private.worker.global_worker.node
    doc = json.loads(tp.resolved.read_text())
    probe = {
        "task": args.task,
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "overrides": doc.get("overrides", {}),
        "ray_address": os.environ.get("RAY_ADDRESS"),
        "gcs_address": node.gcs_address,
        "cluster_id": node.cluster_id.hex(),
        "nodes": [
            {
                "host": n.get("NodeManagerHostname"),
                "ip": n.get("NodeManagerAddress"),
                "node_id": n.get("NodeID"),
                "resources": n.get("Resources"),
            }
            for n in nodes
        ],
        "tasks_ran_on": seen,
        "connect_seconds": round(time.monotonic() - t0, 3),
        "signals": signals,
        "pid": os.getpid(),
        "time": time.time(),
    }
    atomic_write(tp.driver_probe, json.dumps(probe, indent=1) + "\n")

    waited = None
    want = int(os.environ.get("SLIME_TINYDRIVER_WAIT_TASKS", "0") or 0)
    if want:
        deadline = time.monotonic() + float(os.environ.get("SLIME_TINYDRIVER_WAIT_S", "120"))
        while time.monotonic() < deadline and not term.is_set():
            if all(paths.task(i).driver_probe.exists() for i in range(want)):
                waited = True
                break
            wake.wait(0.2)
        waited = bool(waited)
    sleep = float(os.environ.get("SLIME_TINYDRIVER_SLEEP", "0") or 0)
    end = time.monotonic() + sleep
    while time.monotonic() < end and not term.is_set():
        wake.clear()
        wake.wait(max(0.0, end - time.monotonic()))
    probe.update(signals=signals, waited_for_others=waited, finished=time.time())
    atomic_write(tp.driver_probe, json.dumps(probe, indent=1) + "\n")
    ray.shutdown()
    if term.is_set():
        return 143
    return int(os.environ.get("SLIME_TINYDRIVER_EXIT", "0") or 0)


if __name__ == "__main__":
    sys.exit(main())
