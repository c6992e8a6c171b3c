"""Benchmark: does ``OMP_WAIT_POLICY=PASSIVE`` help CPU torch processes that share the cores?

Run by hand (numbers depend on the load; nothing here asserts):

    python tests/bench/omp_wait_policy.py [--procs 4] [--threads 2] [--rounds 3]

A job's CPU torch processes (trainer ranks, engines, the driver) are more than the cores they get
(Ray actors of a 2-node job on a 2-core machine here; colocated roles on a real node). Each round
starts ``--procs`` processes at once, each doing the same fixed work with ``--threads`` intra-op
threads — a tiny MLP's forward+backward+step on small batches, the shape of the torch backend's
CPU steps, with short sleeps between steps as a training loop has (waiting for rollouts/RPCs) —
first with the environment as is (libgomp's default: spin a while, then sleep), then with
``OMP_WAIT_POLICY=PASSIVE``. It prints the wall time of each, the medians and the ratio
passive/default (< 1: PASSIVE is faster), plus the CPU time the processes used.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

WORK = r"""
import os, resource, sys, time
import torch
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[1]))
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 256)
for step in range(int(sys.argv[2])):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 9:
        time.sleep(0.005)  # a loop's pauses (waiting for the next batch): where spinning threads waste CPU
u = resource.getrusage(resource.RUSAGE_SELF)
print(u.ru_utime + u.ru_stime)
"""


def one_round(procs: int, threads: int, steps: int, passive: bool) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    t = time.monotonic()
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", WORK, str(threads), str(steps)], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(procs)
    ]
    cpu = 0.0
    for p in ps:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"worker failed ({p.returncode})")
        cpu += float(out.strip().splitlines()[-1])
    return time.monotonic() - t, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(
        f"{args.procs} processes x {args.threads} threads, {args.steps} steps each, on {os.cpu_count()} CPU(s); "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for passive in (False, True):  # interleaved, so that load changes hit both alike
            wall, cpu = one_round(args.procs, args.threads, args.steps, passive)
            res[passive].append((wall, cpu))
            print(f"round {r}: {'PASSIVE' if passive else 'default'}: wall {wall:.2f} s, cpu {cpu:.2f} s")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in res.items()}
    print(f"median default: wall {med[False][0]:.2f} s, cpu {med[False][1]:.2f} s")
    print(f"median PASSIVE: wall {med[True][0]:.2f} s, cpu {med[True][1]:.2f} s")
    print(f"ratio PASSIVE/default: wall {med[True][0] / med[False][0]:.2f}, cpu {med[True][1] / med[False][1]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
