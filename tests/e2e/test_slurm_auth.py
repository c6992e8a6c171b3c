"""A 2-node SLURM job lets no other cluster user in (ci/slurm-cluster.sh: nodes sn1, sn2).

While ``specs/smoke-slurm.yaml`` trains (trainer ranks and built-in engines on both nodes), a process
in the login node's network namespace, with none of the job's environment, stands in for another
user of the cluster (``tests.fixtures.outsider``): its ``ray.init`` and raw GCS call are refused and
the engine answers 401; the job still completes. With ``SLIME_JOB_AUTH=off`` (the old behaviour) the
same attempts get in. The secret appears on no command line (``ps`` in the root PID namespace sees
every node's processes) and in none of the run dir's files (job.sbatch, lock.json, metrics.jsonl, logs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.outsider import clean_env
from tests.fixtures.slurm_cluster import wait_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]


def _submit(tmp_path: Path, auth: bool) -> tuple[Path, str]:
    env = {**os.environ, "SLIME_JOB_AUTH": "on" if auth else "off"}  # sbatch passes it to the job
    cmd = [sys.executable, "-m", "slime.cli.main", str(REPO / "specs" / "smoke-slurm.yaml")]
    cmd += ["--set", f"logging.dir={json.dumps(str(tmp_path / 'runs'))}", "--set", "rollout.num_rollouts=8", "--json"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    return Path(out["run_dir"]), out["job_ids"][0]


def _wait(what: str, probe, timeout: float = 240.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = probe()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _engine(run_dir: Path) -> str | None:
    for log in (run_dir / "logs").glob("*.out"):
        for line in log.read_text(errors="replace").splitlines():
            if "engine(s) up: " in line:
                return line.split("engine(s) up: ", 1)[1].split(",")[0].strip()
    return None


def _gcs(run_dir: Path) -> str | None:
    head = next(iter(run_dir.glob("tasks/0/rendezvous/head-*.json")), None)
    info = json.loads(head.read_text()) if head else None
    return f"{info['ip']}:{info['port']}" if info else None


def _outsider(tmp_path: Path, gcs: str, engine: str) -> dict:
    env = {**clean_env(str(tmp_path / "outsider-home")), "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tests.fixtures.outsider", "--gcs", gcs, "--engine", engine]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _holding(root: Path, needle: str, skip: Path) -> list[str]:
    return [
        str(p) for p in root.rglob("*") if p.is_file() and skip not in p.parents and needle.encode() in p.read_bytes()
    ]


@pytest.mark.parametrize("auth", [True, False], ids=["auth", "old-behaviour"])
def test_another_cluster_user_cannot_use_the_jobs_ray_or_engines(slurm_cluster, tmp_path, auth):
    t = time.monotonic()
    run_dir, job = _submit(tmp_path, auth)
    gcs = _wait("the head's address", lambda: _gcs(run_dir))
    engine = _wait("the engines", lambda: _engine(run_dir))
    secret_file = next(iter(run_dir.glob("tasks/0/auth/secret-*")), None)
    seen = _outsider(tmp_path, gcs, engine)
    args = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    print(f"SLURM auth={auth}: outsider from the login namespace saw {json.dumps(seen)}")
    if not auth:
        # Without auth the outsider gets in, and its /generate can even break the job (a colocated engine
        # refuses to release its memory while the outsider's requests run): the job may end either way.
        records = wait_job(job, states=("COMPLETED", "FAILED"), timeout=400)
        assert secret_file is None
        assert seen["gcs"] == "answered" and seen["ray_init"].startswith("connected"), seen
        assert seen["engine"]["/get_model_info"] == 200, seen
        print(f"SLURM auth=False: the job ended {records[0]['JobState']}")
        return
    records = wait_job(job, timeout=400)
    log = "\n".join(p.read_text() for p in (run_dir / "logs").glob("*.out"))
    assert [r["JobState"] for r in records] == ["COMPLETED"], log[-4000:]
    assert "engine(s) up" in log and "sn2" in json.dumps(json.loads((run_dir / "tasks/0/state.json").read_text()))
    assert seen["gcs"] == "UNAUTHENTICATED" and seen["ray_init"].startswith("refused (authentication)"), seen
    assert seen["engine"] == {"/get_model_info": 401, "/generate": 401}, seen
    secret = secret_file.read_text()
    assert secret not in args
    assert (run_dir / "job.sbatch").is_file() and (run_dir / "lock.json").is_file()
    assert _holding(run_dir, secret, skip=run_dir / "tasks/0/auth") == []
    print(f"SLURM auth run: submit to COMPLETED in {time.monotonic() - t:.1f} s")
