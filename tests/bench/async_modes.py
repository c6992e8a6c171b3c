"""Sync vs one-step async vs fully-async (``train.async``) on the quickstart shape, in the same run.

Run by hand (not part of the test suite)::

    python tests/bench/async_modes.py                       # 50 rollouts per mode, warm-up and evals on
    python tests/bench/async_modes.py --rollouts 150 --set 'train.async.max_staleness=2'

Each mode is ``python -m slime.train`` on a fresh run dir of ``specs/quickstart.yaml`` (the SFT warm-up, the
held-out eval every 25 rollouts and at the end) with ``--rollouts`` rollouts: equal rollouts, so the
accuracies compare at equal samples trained. The async modes use TIS (``algorithm.tis.enabled``). Printed per
mode: the median step time and steps/s (the first steps skipped), the held-out accuracy at each eval, and for
fully-async the staleness of the trained groups (``rollout/staleness_groups/<k>`` summed) and the groups
dropped as too stale (``rollout/stale_dropped``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.async_step import run_once

TIS = 'algorithm.tis={"enabled": true}'
MODES = {
    "sync": ["train.async=false"],
    "one_step": ["train.async=true", TIS],
    "fully": ['train.async={"mode": "fully", "max_staleness": 1}', TIS],
}


def summary(mode: str, rows: list[dict], wall: float, skip: int) -> str:
    steps = [r["time/step_s"] for r in rows[skip:]]
    med = statistics.median(steps)
    evals = [f"{r['eval/accuracy']:.3f}" for r in rows if "eval/accuracy" in r]
    line = f"{mode:<9} median step {med * 1000:7.1f} ms  {1 / med:6.2f} steps/s  wall {wall:6.1f} s  eval {evals}"
    if mode == "fully":
        hist: dict[int, int] = {}
        for r in rows:
            for k, v in r.items():
                if k.startswith("rollout/staleness_groups/"):
                    hist[int(k.rsplit("/", 1)[1])] = hist.get(int(k.rsplit("/", 1)[1]), 0) + v
        dropped = sum(r.get("rollout/stale_dropped", 0) for r in rows)
        line += f"\n{'':<9} trained groups by staleness {dict(sorted(hist.items()))}, dropped as stale {dropped}"
    return line


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=50)
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra spec override")
    args = ap.parse_args()
    base = [f"rollout.num_rollouts={args.rollouts}", "logging.progress=false", "train.checkpoint.interval=100000"]
    skip = min(3, args.rollouts // 4)
    load_start = os.getloadavg()[0]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, overrides in MODES.items():
            extra = [s for s in args.set if mode == "fully" or not s.startswith("train.async")]
            rows, wall = run_once(base + overrides + extra, Path(tmp), mode)
            lines.append(summary(mode, rows, wall, skip))
            print(lines[-1], flush=True)
    print(f"\nquickstart, {args.rollouts} rollouts per mode; cores {os.cpu_count()}; "
          f"load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
