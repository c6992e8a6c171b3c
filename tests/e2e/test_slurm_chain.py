"""``slime-submit chain`` on the real 2-node SLURM cluster (ci/slurm-cluster.sh): dependencies, the
reference to an earlier step's output, ``status`` of a chain, ``cancel`` of what is still pending.

Real slurmctld/slurmd and per-job Ray; one node per step to keep it short. The only fakes: the
GPUs (GRES on char devices) and the driver (``tests.fixtures.tinydriver`` stands in for the RL
runtime; ``SLIME_TINYDRIVER_EXIT=1`` makes a step fail). Each test reasons only about its own jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from launchers.slurm.cluster import job_records
from tests.fixtures.slurm_cluster import wait_job
from tests.fixtures.tinydriver import driver_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "specs" / "smoke-slurm.yaml"


def steps(tmp_path: Path) -> list[str]:
    """Two one-node steps of the smoke spec; the second's description uses the first's run dir."""
    text = SMOKE.read_text()
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(text.replace("name: smoke-slurm", "name: first"))
    second.write_text(
        text.replace("name: smoke-slurm", "name: second").replace(
            "description: 2-node", "description: after ${runs.first.run_dir}. 2-node"
        )
    )
    return [str(first), str(second)]


def cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    try:
        return proc, json.loads(proc.stdout)
    except ValueError:
        return proc, {}


def chain(tmp_path: Path, *extra: str, env: dict[str, str]) -> list[dict]:
    settings = (
        ("logging.dir", str(tmp_path / "runs")),
        ("data.prompts", str(SMOKE.parent / "data/arith/train.jsonl")),
        ("cluster.nodes", "1"),
        ("train.nodes", "1"),
    )
    sets = [a for k, v in settings for a in ("--set", f"{k}={v}")]
    proc, out = cli("chain", *steps(tmp_path), *sets, *extra, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out["steps"]


def t(rec: dict, key: str) -> datetime:
    return datetime.fromisoformat(rec[key])


def test_the_second_step_starts_only_after_the_first_succeeded_and_gets_its_run_dir(slurm_cluster, tmp_path):
    first, second = chain(tmp_path, env=driver_env())
    (job1,), (job2,) = first["job_ids"], second["job_ids"]
    (pending,) = job_records(job2)  # at submit: held by SLURM until the first ends
    assert pending["Dependency"].startswith(f"afterok:{job1}")
    (rec1,) = wait_job(job1, timeout=200)
    (rec2,) = wait_job(job2, timeout=200)
    assert t(rec2, "StartTime") >= t(rec1, "EndTime")
    run2 = Path(second["run_dir"])
    resolved = json.loads((run2 / "tasks/0/resolved.json").read_text())["spec"]
    assert resolved["description"].startswith(f"after {first['run_dir']}. ")
    (found,) = json.loads((run2 / "tasks/0/chain_inputs.json").read_text())  # checked on the node
    assert found["path"] == first["run_dir"] and found["exists"] and found["host"] in ("sn1", "sn2")
    overrides = json.loads((run2 / "lock.json").read_text())["spec"]["overrides"]  # what the reference became, recorded
    assert json.loads(overrides[-1].removeprefix("description=")) == resolved["description"]
    _, status = cli("status", str(run2))
    assert status["state"] == "succeeded"
    assert [(s["name"], s["state"], s["this"]) for s in status["chain"]["steps"]] == [
        ("first", "succeeded", False),
        ("second", None, True),
    ]


def test_a_failed_first_step_leaves_the_second_never_started(slurm_cluster, tmp_path):
    first, second = chain(tmp_path, env=driver_env(SLIME_TINYDRIVER_EXIT="1"))
    (job1,), (job2,) = first["job_ids"], second["job_ids"]
    wait_job(job1, states=("FAILED",), timeout=200)
    (rec2,) = wait_job(job2, states=("CANCELLED",), timeout=60)
    assert rec2["Reason"] == "DependencyNeverSatisfied" and rec2.get("NodeList") in ("", "(null)", None)
    run2 = Path(second["run_dir"])
    assert not (run2 / f"logs/slurm-{job2}.out").exists()  # its batch script never ran
    assert not (run2 / "tasks/0/driver-probe.json").exists() and not (run2 / "tasks/0/chain_inputs.json").exists()
    _, status = cli("status", str(run2))
    (task,) = status["tasks"]
    assert task["state"] == "cancelled" and task["reason"].startswith("never started:")
    assert status["chain"]["steps"][0]["state"] == "failed"
    _, listing = cli("list", "--dir", str(tmp_path / "runs"))
    assert sorted((r["name"], r["state"], r["chain"]["step"]) for r in listing["runs"]) == [
        ("first", "failed", 1),
        ("second", "cancelled", 2),
    ]


def test_cancelling_a_step_cancels_the_pending_step_after_it(slurm_cluster, tmp_path):
    """``--on any``: SLURM alone would start the second step once the first ended; cancel stops it."""
    first, second = chain(tmp_path, "--on", "any", env=driver_env(SLIME_TINYDRIVER_SLEEP="60"))
    (job1,), (job2,) = first["job_ids"], second["job_ids"]
    assert job_records(job2)[0]["Dependency"].startswith(f"afterany:{job1}")
    wait_job(job1, states=("RUNNING",), timeout=120)
    proc, out = cli("cancel", first["run_dir"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out["cancelled"] == [job1] and out["chain_cancelled"] == [
        {"name": "second", "run_dir": second["run_dir"], "cancelled": [job2]}
    ]
    (rec2,) = wait_job(job2, states=("CANCELLED",), timeout=60)
    assert rec2.get("NodeList") in ("", "(null)", None)  # never given nodes
    assert not (Path(second["run_dir"]) / f"logs/slurm-{job2}.out").exists()
