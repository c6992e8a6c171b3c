"""Sandbox start/exec latency and throughput against a bare subprocess baseline.

Run by hand:  python tests/bench/sandbox.py [--n 200] [--concurrency 1,8,32]

Prints, for the local bubblewrap sandbox (or the unisolated fallback if bwrap is
unusable here, which is said in the output) with what it enforces on this host
(seccomp, memory cgroup, /work tmpfs: each one is part of the measured cost):
- latency of start + exec('true') per sandbox (median, p90) and of exec('true')
  on a started sandbox, against ``asyncio`` spawning ``true`` directly;
- throughput of N sandboxes doing start + exec('true') + close at several
  concurrency levels, against the same number of bare ``true`` processes;
- CPU time per start + exec + close (this process and the children it reaped),
  a figure that, unlike wall time, hardly moves with the machine's load.
Goal: start + exec('true') median <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from slime.agent.sandbox.local import LocalSandbox


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1000:7.2f} ms"


async def bare_true() -> None:
    proc = await asyncio.create_subprocess_exec("true")
    await proc.wait()


def cpu_s() -> float:
    """CPU seconds of this process and of every child it reaped (bwrap, and through it the sandbox)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def sandbox_true(**kw) -> tuple[float, float]:
    sb = LocalSandbox(**kw)
    t0 = time.perf_counter()
    await sb.start()
    res = await sb.exec("true", timeout=30)
    t1 = time.perf_counter()
    await sb.close()
    if not res.ok:
        raise SystemExit(f"exec('true') failed in the sandbox: {res}")
    return t1 - t0, time.perf_counter() - t1


async def main(n: int, levels: list[int], unisolated: bool) -> None:
    kw = {"allow_unisolated": unisolated}
    probe = LocalSandbox(**kw)
    await probe.start()
    mode = "bwrap" if probe.isolated else "UNISOLATED fallback"
    enforcement = getattr(probe, "enforcement", {})  # absent before the hardening
    # Warm sandbox: exec only.
    for _ in range(5):
        await probe.exec("true", timeout=30)
    exec_only = []
    for _ in range(n):
        t0 = time.perf_counter()
        await probe.exec("true", timeout=30)
        exec_only.append(time.perf_counter() - t0)
    await probe.close()

    for _ in range(5):
        await bare_true()
    bare = []
    for _ in range(n):
        t0 = time.perf_counter()
        await bare_true()
        bare.append(time.perf_counter() - t0)

    start_exec, close, cpu = [], [], []
    for _ in range(n):
        c0 = cpu_s()
        a, b = await sandbox_true(**kw)
        cpu.append(cpu_s() - c0)
        start_exec.append(a)
        close.append(b)

    print(f"# sandbox benchmark ({mode}), n={n}, cpus={os.cpu_count()}")
    for key, value in enforcement.items():
        print(f"#   {key}: {value if len(value) < 90 else value[:87] + '...'}")
    print("latency                       median       p90    ratio(median vs bare)")
    base = statistics.median(bare)
    for name, xs in (
        ("bare subprocess 'true'", bare),
        ("exec('true'), warm sandbox", exec_only),
        ("start + exec('true')", start_exec),
        ("close", close),
    ):
        med = statistics.median(xs)
        print(f"{name:28s} {ms(med)} {ms(pct(xs, 0.9))}   {med / base:6.1f}x")
    # CPU time barely depends on what else the machine runs; wall time does (run queue, RCU grace periods).
    print(f"{'CPU per start+exec+close':28s} {ms(statistics.median(cpu))} {ms(pct(cpu, 0.9))}")
    goal = statistics.median(start_exec) <= 0.050
    print(f"goal start+exec median <= 50 ms: {'met' if goal else 'NOT met'}")

    print("\nthroughput (start + exec('true') + close per sandbox)")
    print("concurrency   sandboxes/s   bare procs/s   ratio")
    for c in levels:
        sem = asyncio.Semaphore(c)

        async def one_sandbox() -> None:
            async with sem:  # noqa: B023
                await sandbox_true(**kw)

        async def one_bare() -> None:
            async with sem:  # noqa: B023
                await bare_true()

        t0 = time.perf_counter()
        await asyncio.gather(*(one_sandbox() for _ in range(n)))
        sb_rate = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        await asyncio.gather(*(one_bare() for _ in range(n)))
        bare_rate = n / (time.perf_counter() - t0)
        print(f"{c:11d}   {sb_rate:11.1f}   {bare_rate:12.1f}   {sb_rate / bare_rate:5.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument(
        "--allow-unisolated",
        action="store_true",
        help="measure the fallback where bubblewrap is unusable",
    )
    args = parser.parse_args()
    asyncio.run(main(args.n, [int(x) for x in args.concurrency.split(",")], args.allow_unisolated))
