"""Sync vs async (``train.async``) steps per second of the runtime on the embedded default, in the same run.

Run by hand (not part of the test suite)::

    python tests/bench/async_step.py                 # 2 rounds x (sync, async), 40 rollouts each
    python tests/bench/async_step.py --rounds 3 --rollouts 60 --set rollout.batch_size=32

Each run is ``python -m slime.train`` on a fresh run dir of ``specs/quickstart.yaml`` (private local Ray,
built-in engine over HTTP, torch trainer), without the SFT warm-up and evals, so every step does the same
work (the untrained tiny model answers with ``max_response_len`` tokens). Sync and async runs alternate, so
a change in the machine's load hits both. Sync: trainer and engine share the node's cores and take turns
(each uses all of them). Async: the cores are split between them (``slime.placement.torch_threads``) and
rollout k+1 is generated while the trainer trains on k.

Printed per mode: the median step time over all rounds (the first steps of each run skipped: one-off
warm-up), steps per second and the async/sync ratio (the goal on 2 cores is >= 1.25), and where the time
goes: the loop's wait for the rollout (``time/rollout_s``), the engines' generation time (``time/generate_s``),
``time/train_s``, ``time/sync_s``, and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before torch loads: what the runtime gives its CPU workers too (slime.runtime.job), so the bare loop and the
# runtime wait the same way; OpenMP's default spinning is much slower when other work shares the cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PHASES = ("time/step_s", "time/rollout_s", "time/generate_s", "time/train_s", "time/sync_s")


def run_once(overrides: list[str], logdir: Path, name: str) -> tuple[list[dict], float]:
    from launchers.base import SubmitOptions, create_run_dir
    from launchers.local.launcher import LocalLauncher
    from slime.spec import load_spec

    loaded = load_spec(REPO / "specs" / "quickstart.yaml", overrides=overrides + [f"logging.dir={logdir}"])
    run = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.train", str(run)], cwd=REPO, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"slime.train ({name}) failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run / "tasks/0/metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["rollout_id"] >= 0], wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra spec override")
    args = ap.parse_args()
    base = [
        f"rollout.num_rollouts={args.rollouts}",
        "algorithm.sft_warmup_steps=0",
        "data.eval=[]",
        "logging.progress=false",
        "train.checkpoint.interval=100000",
        *args.set,
    ]
    skip = min(3, args.rollouts // 4)
    steps: dict[str, list[dict]] = {"sync": [], "async": []}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for mode in ("sync", "async"):
                rows, wall = run_once(base + [f"train.async={mode == 'async'}"], Path(tmp), f"{mode}-{i}")
                steps[mode].extend(rows[skip:])
                step = statistics.median(r["time/step_s"] for r in rows[skip:])
                print(f"round {i} {mode:<5}: median step {step * 1000:.1f} ms, wall {wall:.1f} s", flush=True)
    med = {m: {k: statistics.median(r[k] for r in rows) * 1000 for k in PHASES} for m, rows in steps.items()}
    print(
        f"\nquickstart, {args.rollouts} rollouts x {args.rounds} rounds per mode (median ms/step, first {skip} skipped)"
    )
    print(f"{'':<8}" + "".join(f"{k.split('/')[1]:>14}" for k in PHASES) + f"{'steps/s':>10}")
    for mode in ("sync", "async"):
        row = med[mode]
        print(f"{mode:<8}" + "".join(f"{row[k]:>14.1f}" for k in PHASES) + f"{1000 / row['time/step_s']:>10.2f}")
    ratio = med["sync"]["time/step_s"] / med["async"]["time/step_s"]
    print(f"async / sync steps per second: {ratio:.2f} (goal >= 1.25 on 2 cores)")
    print(f"cores {os.cpu_count()}; load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
