"""A local RL job lets no one else in, and its secret shows up nowhere but its own 0600 file.

While a real job runs (local launcher: bootstrap, preflight, driver, built-in engine), a second
process on the same machine without the job's environment (``tests.fixtures.outsider``: another
user's shell) tries the job's Ray (raw gRPC to the GCS and a real ``ray.init``) and its engine's
HTTP API. With auth (the default) every attempt is refused and the job still completes; with
``SLIME_JOB_AUTH=off`` (the old behaviour) the same attempts get in. The secret never appears on
any command line (``ps``), in the run dir's files (lock.json, metrics.jsonl, logs...) or Ray's logs.
A requeued instance (SLURM_RESTART_COUNT + 1) gets a new secret, and the old one no longer opens Ray.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.outsider import clean_env

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SPEC = f"""apiVersion: slime/v2
kind: RLJob
name: auth-job
cluster: {{launcher: local, nodes: 1, gpus_per_node: 0, cpus_per_node: 2, bootstrap_timeout_s: 120}}
model: {{builtin: tiny}}
train: {{backend: torch, global_batch_size: 32, micro_batch_size: 32, seed: 1}}
rollout: {{backend: builtin, batch_size: 8, n_samples_per_prompt: 4, num_rollouts: 40, max_prompt_len: 8,
  max_response_len: 4}}
data: {{prompts: {REPO}/specs/data/arith/train.jsonl, input_key: prompt, label_key: label}}
reward: {{type: exact}}
algorithm: {{estimator: grpo}}
logging: {{dir: runs}}
"""


def _wait_for(what: str, probe, proc: subprocess.Popen, timeout: float = 180.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = probe()
        if found:
            return found
        assert proc.poll() is None, f"the job exited ({proc.returncode}) before {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _engine_url(log: Path) -> str | None:
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if "engine(s) up: " in line:
            return line.split("engine(s) up: ", 1)[1].split(",")[0].strip()
    return None


def _gcs(runs: Path) -> str | None:
    heads = list(runs.glob("*/tasks/0/rendezvous/head-*.json"))
    if not heads:
        return None
    head = json.loads(heads[0].read_text())
    return f"{head['ip']}:{head['port']}"


def _outsider(tmp_path: Path, gcs: str, engine: str, token: str | None = None) -> dict:
    env = clean_env(str(tmp_path / "outsider-home"))
    if token:
        env["OUTSIDER_TOKEN"] = token
    out = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.outsider", "--gcs", gcs, "--engine", engine],
        cwd=REPO,
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _command_lines() -> str:
    return subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout


def _files_holding(root: Path, needle: str, skip: Path | None = None) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and (skip is None or skip not in path.parents):
            try:
                if needle.encode() in path.read_bytes():
                    hits.append(str(path))
            except OSError:
                pass
    return hits


def _run_job(tmp_path: Path, auth: bool) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLIME_JOB_AUTH": "on" if auth else "off"}
    env.pop("SLIME_JOB_SECRET_FILE", None)
    log = tmp_path / "job.err"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "slime.cli.main", str(tmp_path / "spec.yaml"), "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    return proc, log


def test_an_outsider_is_refused_and_the_secret_shows_up_nowhere(tmp_path):
    proc, log = _run_job(tmp_path, auth=True)
    try:
        runs = tmp_path / "runs"
        secret_file = _wait_for("the secret", lambda: next(iter(runs.glob("*/tasks/0/auth/secret-*")), None), proc)
        secret = secret_file.read_text()
        gcs = _wait_for("the head's address", lambda: _gcs(runs), proc)
        engine = _wait_for("the engine", lambda: _engine_url(log), proc)
        seen = _outsider(tmp_path, gcs, engine)
        print("outsider saw:", json.dumps(seen))  # the before/after of docs/security.md
        assert proc.poll() is None, "the job ended before the outsider's attempts: make it longer"
        assert seen["gcs"] == "UNAUTHENTICATED", seen
        assert seen["engine"] == {"/get_model_info": 401, "/generate": 401}, seen
        assert seen["ray_init"].startswith("refused (authentication)"), seen
        assert secret not in _command_lines()  # every process's argv, the job's included
        temp_dir = json.loads(next(runs.glob("*/tasks/0/rendezvous/node-*-0.json")).read_text())["temp_dir"]
        assert _files_holding(Path(temp_dir), secret) == []  # Ray's own logs, while they exist
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    run_dir = Path(json.loads(out)["run_dir"])
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert (run_dir / "lock.json").is_file() and list(run_dir.glob("tasks/0/metrics.jsonl"))
    assert _files_holding(run_dir, secret, skip=run_dir / "tasks/0/auth") == []
    assert secret not in log.read_text() + out
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert any(c["name"] == "auth" and c["ok"] and "refuses" in c["message"] for c in pre["checks"])


def test_with_auth_off_the_outsider_gets_in(tmp_path):
    """The old behaviour, for comparison: the same attempts succeed."""
    proc, log = _run_job(tmp_path, auth=False)
    try:
        runs = tmp_path / "runs"
        gcs = _wait_for("the head's address", lambda: _gcs(runs), proc)
        engine = _wait_for("the engine", lambda: _engine_url(log), proc)
        seen = _outsider(tmp_path, gcs, engine)
        print("outsider saw:", json.dumps(seen))  # the before/after of docs/security.md
        assert seen["gcs"] == "answered" and seen["engine"]["/get_model_info"] == 200, seen
        assert seen["ray_init"].startswith("connected"), seen
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert not list((tmp_path / "runs").glob("*/tasks/0/auth/secret-*"))


def _bootstrap(run_dir: Path, restart: int) -> subprocess.Popen:
    """One instance of a 1-node SLURM job (SLURM's variables, no SLURM): what a requeue starts again."""
    host = socket.gethostname().split(".")[0]
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SLURM_JOB_ID": "4242",
        "SLURM_NODEID": "0",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NTASKS": "1",
        "SLURM_JOB_NODELIST": host,
        "SLURM_RESTART_COUNT": str(restart),
        "SLIME_DRIVER": "tests.fixtures.tinydriver",
        "SLIME_TINYDRIVER_SLEEP": "8",
    }
    env.pop("SLIME_JOB_SECRET_FILE", None)
    cmd = [sys.executable, "-m", "launchers.node.bootstrap", str(run_dir), "--task", "0"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _gcs_with(tmp_path: Path, gcs: str, token: str | None) -> str:
    env = clean_env(str(tmp_path / "outsider-home"))
    env.update({"PYTHONPATH": str(REPO), **({"OUTSIDER_TOKEN": token} if token else {})})
    cmd = [sys.executable, "-m", "tests.fixtures.outsider", "--gcs", gcs, "--no-init"]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["gcs"]


def test_a_requeued_job_gets_a_new_secret_and_the_old_one_is_refused(tmp_path):
    import msgspec

    from slime.core.paths import TaskPaths
    from slime.spec import load_spec_text

    doc = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "requeue",
        "cluster": {"launcher": "slurm", "nodes": 1, "gpus_per_node": 0, "network_interface": "lo"},
        "model": {"builtin": "tiny"},
        "rollout": {"num_rollouts": 1, "max_prompt_len": 8, "max_response_len": 4, "batch_size": 2},
        "data": {"prompts": "/p.jsonl"},
    }
    spec = load_spec_text(json.dumps(doc), base_dir=Path("/")).spec
    tp = TaskPaths(tmp_path, 0)
    tp.dir.mkdir(parents=True)
    tp.resolved.write_text(json.dumps({"task": 0, "spec": msgspec.to_builtins(spec)}))
    seen = {}
    for restart in (0, 1):
        proc = _bootstrap(tmp_path, restart)
        try:
            path, head = tp.auth / f"secret-4242.{restart}", tp.rendezvous / f"head-4242.{restart}.json"
            _wait_for("the secret and the head", lambda p=path, h=head: p.is_file() and h.is_file(), proc)
            secret, info = path.read_text(), json.loads(head.read_text())
            gcs = f"{info['ip']}:{info['port']}"
            _wait_for("the GCS", lambda g=gcs, s=secret: _gcs_with(tmp_path, g, s) == "answered", proc, 60)
            seen[restart] = {"secret": secret, "none": _gcs_with(tmp_path, gcs, None)}
            if restart:
                seen[1]["old"] = _gcs_with(tmp_path, gcs, seen[0]["secret"])
            assert proc.wait(timeout=120) == 0
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    print("requeue:", {r: {k: v for k, v in s.items() if k != "secret"} for r, s in seen.items()})
    assert seen[0]["secret"] != seen[1]["secret"]
    assert sorted(p.name for p in tp.auth.iterdir()) == ["secret-4242.1"]  # the old instance's is gone
    assert seen[0]["none"] == seen[1]["none"] == "UNAUTHENTICATED"
    assert seen[1]["old"] == "UNAUTHENTICATED"  # instance 0's secret does not open instance 1


def test_the_preflight_fails_naming_the_port_when_ray_ignores_the_secret(tmp_path):
    """A Ray that runs open although the job has a secret (here: a ``ray`` wrapper that turns token auth
    off) fails the preflight with exit 3, naming the GCS address that answered."""
    wrapper = tmp_path / "open-ray"
    wrapper.write_text(f'#!/bin/sh\nRAY_AUTH_MODE=disabled exec {Path(sys.executable).parent / "ray"} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "spec.yaml").write_text(SPEC)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLIME_RAY": str(wrapper), "SLIME_JOB_AUTH": "on"}
    cmd = [sys.executable, "-m", "slime.cli.main", str(tmp_path / "spec.yaml"), "--preflight-only", "--json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    (pre_file,) = (tmp_path / "runs").glob("*/tasks/0/preflight.json")
    pre = json.loads(pre_file.read_text())
    (check,) = [c for c in pre["checks"] if c["name"] == "auth"]
    head = json.loads(next(pre_file.parent.glob("rendezvous/head-*.json")).read_text())
    assert not check["ok"] and f"{head['ip']}:{head['port']} answered" in check["message"], check
    assert "preflight failed: auth" in proc.stderr
    from launchers.node.rayproc import temp_root

    for d in temp_root().glob(f"{pre['job_id']}-*"):  # a failed job keeps its Ray dir: not for this one
        shutil.rmtree(d, ignore_errors=True)
