"""A stall on the real 2-node SLURM cluster: the watchdog ends the job (exit 124), the restart policy
requeues it once (``cluster.slurm.max_stalls`` = 1 by default), the second stall fails it, the stacks
of both nodes' processes are dumped, and ``why`` on the run dir names the cause, the frame and the restart.

Real slurmctld/slurmd, real Ray on sn1 + sn2, the real runtime on ``specs/smoke-slurm.yaml`` with a custom
reward that never returns (``tests.fixtures.faults:sleepy_reward``; the nodes get this checkout on
``PYTHONPATH`` through ``cluster.env``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
STALL_S = 20


def stalling_spec(tmp_path: Path) -> Path:
    text = (REPO / "specs" / "smoke-slurm.yaml").read_text()
    swaps = [
        ("name: smoke-slurm", "name: stall-slurm"),
        ("  bootstrap_timeout_s: 120\n", f"  bootstrap_timeout_s: 120\n  stall_timeout_s: {STALL_S}\n"),
        ('    OMP_NUM_THREADS: "1"\n', f'    OMP_NUM_THREADS: "1"\n    PYTHONPATH: "{REPO}"\n'),
        ("  type: exact\n", "  type: custom\n  custom: tests.fixtures.faults:sleepy_reward\n"),
        ("data/arith/train.jsonl", str(REPO / "specs" / "data" / "arith" / "train.jsonl")),
        ("dir: ../runs", f"dir: {tmp_path / 'runs'}"),
    ]
    for old, new in swaps:
        assert old in text, f"specs/smoke-slurm.yaml changed: {old!r} not found"
        text = text.replace(old, new)
    path = tmp_path / "stall.yaml"
    path.write_text(text)
    return path


def test_a_stall_on_slurm_is_requeued_once_then_fails_and_why_names_it(slurm_cluster, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", str(stalling_spec(tmp_path)), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    run, job = Path(out["run_dir"]), out["job_ids"][0]
    (rec,) = wait_job(job, states=("FAILED",), timeout=480)
    assert rec["ExitCode"].startswith("124:"), rec
    task = run / "tasks/0"
    (restart,) = [json.loads(x) for x in (task / "restarts.jsonl").read_text().splitlines()]
    assert (restart["cause"], restart["budget"]) == ("stall", "stalls")
    records = json.loads((task / "diagnosis.json").read_text())
    assert [r["cause"] for r in records] == ["stall", "stall"]
    assert all(r["frame"].startswith("sleepy_reward (") and r["who"].startswith("rollout manager") for r in records)
    # every node's processes are dumped: sn2's by a Ray task there
    nodes = {p.read_text().split("\n", 1)[0].rsplit(" on ", 1)[-1] for p in (run / records[0]["stacks"]).glob("*.txt")}
    assert {"sn1", "sn2"} <= nodes, nodes
    ex = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "why", str(run)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"},
    ).stdout
    assert "sleepy_reward" in ex and "Restarts" in ex and "stall" in ex
