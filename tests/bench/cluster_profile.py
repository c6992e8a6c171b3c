"""Benchmark: what selecting a cluster profile adds to a cold `slime-submit validate`, as a ratio.

Run by hand (numbers depend on the machine and its load; nothing here asserts):

    python tests/bench/cluster_profile.py [--runs 9]

Prints the median wall time of a cold `validate specs/smoke-slurm.yaml` in a fresh interpreter,
without a profile (the baseline) and with `--cluster ci` (ci/clusters.yaml: the file is read,
checked and merged), interleaved in the same run, and their ratio.
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
SPEC = ROOT / "specs" / "smoke-slurm.yaml"


def _once(extra: list[str]) -> float:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SLIME_CLUSTERS": str(ROOT / "ci" / "clusters.yaml")}
    cmd = [sys.executable, "-m", "slime.cli.main", "validate", str(SPEC), *extra]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    runs = ap.parse_args().runs
    base, prof = [], []
    for _ in range(runs):  # interleaved: load changes hit both alike
        base.append(_once([]))
        prof.append(_once(["--cluster", "ci"]))
    b, p = statistics.median(base), statistics.median(prof)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cold validate, median of {runs}")
    for col in ("", "wall", "ratio"):
        table.add_column(col)
    table.add_row("no profile (baseline)", f"{b * 1000:.1f} ms", "1.00")
    table.add_row("--cluster ci", f"{p * 1000:.1f} ms", f"{p / b:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
