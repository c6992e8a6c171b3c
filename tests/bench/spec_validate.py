"""Benchmark: cold `slime-submit validate` wall time and a 1,000-task sweep, against baselines run now.

Run by hand (numbers depend on the machine and its load; nothing here asserts):

    python tests/bench/spec_validate.py [--runs 15] [--tasks 1000] [--profile]

Prints, for the same run of this script:
  * cold CLI: median wall time of `slime-submit validate specs/grpo-multinode.yaml`
    in a fresh interpreter, next to `python -c pass` (interpreter start-up, the floor)
    and `python -c "import slime.spec"`; goal <= 0.3 s.
  * sweep: time to load, expand and validate a spec whose grid has 1,000 points
    (every task typed, resolved and checked by every rule), in process, median of
    a few runs, next to loading the same spec without the sweep; goal <= 1 s.
``--profile`` prints a cProfile of one sweep load (what to optimise in slime/spec/load.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "grpo-multinode.yaml"
GOAL_CLI_S, GOAL_SWEEP_S = 0.3, 1.0


def _median_wall(cmd: list[str], runs: int) -> float:
    times = []
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    for _ in range(runs):
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - t)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return statistics.median(times)


def _cli_command() -> list[str]:
    exe = Path(sys.executable).with_name("slime-submit")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "slime.cli.main"]


def sweep_text(n_tasks: int) -> str:
    """The multinode spec plus a grid of ``n_tasks`` points over three axes (seeds x temperatures x clips)."""
    temps, clips = [0.6, 0.8, 1.0, 1.2, 1.4], [0.1, 0.2, 0.3, 0.4]
    seeds = max(1, n_tasks // (len(temps) * len(clips)))
    return SPEC.read_text() + (
        "\nsweep:\n  grid:\n"
        f"    train.seed: [{', '.join(str(i) for i in range(seeds))}]\n"
        f"    rollout.temperature: {temps}\n"
        f"    algorithm.eps_clip: {clips}\n"
    )


def _time_load(text: str, repeats: int) -> tuple[float, int]:
    from slime.spec import load_spec_text

    times, n = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        loaded = load_spec_text(text, file=str(SPEC), base_dir=SPEC.parent)
        times.append(time.perf_counter() - t)
        n = len(loaded.tasks)
    return statistics.median(times), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15, help="subprocess runs per command (median)")
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5, help="in-process sweep loads (median)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPU(s); load average {os.getloadavg()[0]:.2f}")
    base = _median_wall([sys.executable, "-c", "pass"], args.runs)
    imp = _median_wall([sys.executable, "-c", "import slime.spec"], args.runs)
    cli = _median_wall(_cli_command() + ["validate", str(SPEC.relative_to(ROOT))], args.runs)
    print(f"cold CLI (median of {args.runs}):")
    print(f"  python -c pass                     {base * 1000:7.1f} ms  (interpreter floor)")
    print(f"  python -c 'import slime.spec'      {imp * 1000:7.1f} ms  (+{(imp - base) * 1000:.1f} ms)")
    print(
        f"  slime-submit validate {SPEC.name} {cli * 1000:7.1f} ms  (+{(cli - base) * 1000:.1f} ms over the "
        f"floor, {cli / base:.1f}x)  goal <= {GOAL_CLI_S * 1000:.0f} ms: {'ok' if cli <= GOAL_CLI_S else 'MISSED'}"
    )

    single, _ = _time_load(SPEC.read_text(), args.repeats)  # also warms imports and caches
    sweep, n = _time_load(sweep_text(args.tasks), args.repeats)
    print(f"sweep (in process, median of {args.repeats}):")
    print(f"  one spec, no sweep                 {single * 1000:7.1f} ms")
    print(
        f"  {n}-task sweep expand + validate  {sweep * 1000:7.1f} ms  ({sweep / max(n, 1) * 1e6:.0f} us/task, "
        f"{sweep / single:.0f}x one spec)  goal <= {GOAL_SWEEP_S * 1000:.0f} ms: "
        f"{'ok' if sweep <= GOAL_SWEEP_S else 'MISSED'}"
    )

    if args.profile:
        import cProfile
        import pstats

        from slime.spec import load_spec_text

        text = sweep_text(args.tasks)
        prof = cProfile.Profile()
        prof.runcall(load_spec_text, text, file=str(SPEC), base_dir=SPEC.parent)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
