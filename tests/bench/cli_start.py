"""Benchmark: what a TAB and the quick commands cost, against a bare interpreter start run now.

Run by hand (numbers depend on the machine and its load; nothing here asserts):

    python tests/bench/cli_start.py [--runs 15]

Prints median wall times, each in a fresh interpreter, and their ratio to ``python -c pass`` (the
floor every ``slime-submit`` process pays), interleaved so load drifts hit all alike:

* a completion request (``--set train.par<TAB>`` as the shell script asks it: ``_ARGCOMPLETE=1``);
* ``slime-submit --version``;
* ``slime-submit validate specs/quickstart.yaml`` (the spec layer: goal <= 0.3 s, as tests/bench/
  spec_validate.py measures);
* ``slime-submit list`` of an empty runs dir (rich's tables).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    cli = [sys.executable, "-m", "slime.cli.main"]
    empty = tempfile.mkdtemp()
    line = "slime-submit validate specs/quickstart.yaml --set train.par"
    complete_env = {
        **env,
        "_ARGCOMPLETE": "1",
        "COMP_LINE": line,
        "COMP_POINT": str(len(line)),
        "_ARGCOMPLETE_STDOUT_FILENAME": os.devnull,
    }
    cases = {
        "python -c pass": ([sys.executable, "-c", "pass"], env),
        "completion (--set train.par<TAB>)": (cli, complete_env),
        "slime-submit --version": ([*cli, "--version"], env),
        "slime-submit validate quickstart": ([*cli, "validate", "specs/quickstart.yaml"], env),
        "slime-submit list (no runs)": ([*cli, "list", "--dir", empty], env),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (cmd, e) in cases.items():
            times[name].append(_wall(cmd, e))
    base = statistics.median(times["python -c pass"])
    print(f"median of {args.runs} interleaved runs each; load average {os.getloadavg()[0]:.1f}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:36s} {med * 1000:7.0f} ms   {med / base:5.2f}x python -c pass")


if __name__ == "__main__":
    main()
