"""``specs/smoke-slurm.yaml`` end to end on the real 2-node SLURM cluster (ci/slurm-cluster.sh): sbatch →
per-job Ray on sn1 + sn2 → preflight → ``slime.train``, with trainer ranks and engines on both nodes.

Real slurmctld/slurmd, Ray, gloo across the two network namespaces, the built-in engines over HTTP. The
only fake: the GPUs (GRES on char devices; CUDA is unavailable, so each rank runs on CPU while Ray still
hands it its own CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(400)]
REPO = Path(__file__).resolve().parents[2]


def test_smoke_slurm_trains_to_completion_with_ranks_on_both_nodes(slurm_cluster, tmp_path):
    t = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "slime.cli.main",
            str(REPO / "specs" / "smoke-slurm.yaml"),
            "--set",
            f"logging.dir={json.dumps(str(tmp_path / 'runs'))}",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    records = wait_job(job, timeout=300)
    elapsed = time.monotonic() - t
    task = run_dir / "tasks" / "0"
    log = "\n".join(p.read_text() for p in (run_dir / "logs").glob("*.out"))
    assert [r["JobState"] for r in records] == ["COMPLETED"], log[-4000:]
    state = json.loads((task / "state.json").read_text())
    assert state["state"] == "succeeded" and state["exit_code"] == 0
    ranks = state["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert [r["host"] for r in ranks] == ["sn1", "sn1", "sn2", "sn2"]  # trainer ranks on both nodes
    assert len({(r["host"], r["cuda_visible_devices"]) for r in ranks}) == 4  # one (fake) GPU each
    assert {r["device"] for r in ranks} == {"cpu"}  # cluster.fake_gpus: on CPU by the spec's opt-in
    assert "fake GPUs: running on CPU" in (task / "preflight.txt").read_text()
    assert {e.split("//")[1].split(":")[0] for e in state["engines"]} == {
        slurm_cluster.node_ips["sn1"],
        slurm_cluster.node_ips["sn2"],
    }
    rows = [json.loads(line) for line in (task / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [-1, 0, 1]
    final = json.loads((task / "summary.json").read_text())
    assert final["step"] == 2 and final["weight_version"] == 2
    assert final["check/step0_logprob_diff"] <= 1e-3 and 0.0 <= final["check/step0_kl"] < 1e-6
    assert (task / "checkpoints" / "1" / "actor-rank3.pt").is_file()
    print(f"smoke-slurm: submit to COMPLETED in {elapsed:.1f} s")
