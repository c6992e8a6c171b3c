"""The stall watchdog's cost on a healthy run: RL step time with it on and off, in the same bench run.

Run by hand (not part of the test suite)::

    python tests/bench/watchdog.py                 # 3 rounds x 30 rollouts of specs/quickstart.yaml
    python tests/bench/watchdog.py --rounds 2 --rollouts 20

Each round runs ``python -m slime.train`` twice on fresh run dirs of the quickstart (no SFT warm-up, no
evals, no checkpoints): once with ``cluster.stall_timeout_s: 0`` (no watchdog: the baseline) and once
with the default per-phase timeouts; the order alternates between rounds so a change in the machine's
load hits both. Printed (a rich table): the median ``time/step_s`` of each side over all rounds (the
first steps of each run skipped: one-off warm-up), and the ratio on/off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def run_once(overrides: list[str], logdir: Path, name: str) -> list[float]:
    """``time/step_s`` of each rollout of one ``slime.train`` run."""
    from launchers.base import SubmitOptions, create_run_dir
    from launchers.local.launcher import LocalLauncher
    from slime.spec import load_spec

    loaded = load_spec(REPO / "specs" / "quickstart.yaml", overrides=[*overrides, f"logging.dir={logdir}"])
    run = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    done = subprocess.run(
        [sys.executable, "-m", "slime.train", str(run)], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"slime.train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run / "tasks/0/metrics.jsonl").read_text().splitlines()]
    return [r["time/step_s"] for r in rows if r["rollout_id"] >= 0]


def main() -> int:
    from rich.console import Console
    from rich.progress import track
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="off/on pairs, order alternating")
    args = ap.parse_args()
    base = [
        f"rollout.num_rollouts={args.rollouts}",
        "algorithm.sft_warmup_steps=0",
        "data.eval=[]",
        "logging.progress=false",
        "train.checkpoint.interval=100000",
    ]
    sides = {"off": ["cluster.stall_timeout_s=0"], "on": []}
    skip = min(3, args.rollouts // 4)
    steps: dict[str, list[float]] = {"off": [], "on": []}
    load0 = os.getloadavg()[0]
    plan = [(i, s) for i in range(args.rounds) for s in (("off", "on") if i % 2 == 0 else ("on", "off"))]
    with tempfile.TemporaryDirectory() as tmp:
        for i, side in track(plan, description="runs"):
            steps[side] += run_once(base + sides[side], Path(tmp), f"wd-{side}-{i}")[skip:]
    table = Table(title=f"RL step time, watchdog off vs on ({args.rounds} rounds x {args.rollouts} rollouts)")
    for col in ("watchdog", "median step (s)", "steps", "ratio on/off"):
        table.add_column(col)
    off, on = statistics.median(steps["off"]), statistics.median(steps["on"])
    table.add_row("off (stall_timeout_s: 0)", f"{off:.3f}", str(len(steps["off"])), "")
    table.add_row("on (default timeouts)", f"{on:.3f}", str(len(steps["on"])), f"{on / off:.3f}")
    Console().print(table)
    print(f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
