"""What per-job authentication costs: the same local RL job with ``SLIME_JOB_AUTH`` on and off.

    python tests/bench/auth.py [--rounds 3] [--rollouts 12]

Each round submits a small built-in-engine GRPO job (local launcher: bootstrap, preflight, driver)
twice, auth on then off, alternating the order each round so that a change in the machine's load
hits both. Per run: bootstrap start to preflight passed (``preflight.json``: ``bootstrap_seconds``),
the preflight alone (``seconds``; with auth it includes the ``auth`` check), the median RL step
(``time/step_s`` of ``metrics.jsonl``, rollout 0 left out as warm-up) and its rollout and weight-sync
parts. Printed: the medians per setting over all rounds, and on/off ratios.
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
SPEC = """apiVersion: slime/v2
kind: RLJob
name: auth-bench
cluster: {{launcher: local, nodes: 1, gpus_per_node: 0, cpus_per_node: 2, bootstrap_timeout_s: 120}}
model: {{builtin: tiny}}
train: {{backend: torch, global_batch_size: 32, micro_batch_size: 32, seed: 1}}
rollout: {{backend: builtin, batch_size: 8, n_samples_per_prompt: 4, num_rollouts: {rollouts}, max_prompt_len: 8,
  max_response_len: 4}}
data: {{prompts: {repo}/specs/data/arith/train.jsonl, input_key: prompt, label_key: label}}
reward: {{type: exact}}
algorithm: {{estimator: grpo}}
logging: {{dir: runs}}
"""
KEYS = ("bootstrap_to_preflight_s", "preflight_s", "step_s", "rollout_s", "sync_s")


def run_once(work: Path, auth: bool, rollouts: int) -> dict[str, float]:
    spec = work / "spec.yaml"
    spec.write_text(SPEC.format(rollouts=rollouts, repo=REPO))
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLIME_JOB_AUTH": "on" if auth else "off", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "slime.cli.main", str(spec), "--json"]
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"auth={auth}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    task = Path(json.loads(proc.stdout)["run_dir"]) / "tasks" / "0"
    pre = json.loads((task / "preflight.json").read_text())
    rows = [json.loads(line) for line in (task / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("rollout_id", -1) > 0 and "time/step_s" in r]
    return {
        "bootstrap_to_preflight_s": pre["bootstrap_seconds"],
        "preflight_s": pre["seconds"],
        "step_s": statistics.median(r["time/step_s"] for r in steps),
        "rollout_s": statistics.median(r["time/rollout_s"] for r in steps),
        "sync_s": statistics.median(r["time/sync_s"] for r in steps),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rollouts", type=int, default=12)
    args = ap.parse_args()
    results: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="slime-auth-bench-") as tmp:
        for i in range(args.rounds):
            for auth in (True, False) if i % 2 == 0 else (False, True):
                work = Path(tmp) / f"r{i}-{'on' if auth else 'off'}"
                work.mkdir()
                results[auth].append(run_once(work, auth, args.rollouts))
                print(f"round {i} auth={'on' if auth else 'off'}: {results[auth][-1]}", flush=True)
    print(f"load average after: {os.getloadavg()}")
    print(f"{'median over ' + str(args.rounds) + ' round(s)':<28}{'auth on':>10}{'auth off':>10}{'on/off':>8}")
    for key in KEYS:
        on = statistics.median(r[key] for r in results[True])
        off = statistics.median(r[key] for r in results[False])
        print(f"{key:<28}{on:>10.3f}{off:>10.3f}{on / off if off else float('nan'):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
