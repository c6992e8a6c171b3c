"""``rollout.external``: a job whose engines it did not start, through ``slime-submit`` (local launcher).

A built-in engine server is started here, outside any job, with a token of its own; the quickstart
(shortened, on the built-in tiny model's checkpoint) points ``rollout.external`` at it and passes the
token by reference (``cluster.secrets`` + ``rollout.external_token_secret``). Real parts only: the
CLI, Ray, the preflight, the engine over HTTP, torch training. Checked: the preflight's table shows the
engine (reachable, its model, accepts updates), the layout gives it no slot, the job's weight syncs
reach it, and the job leaves it running; an unreachable second address fails the preflight, exit 3,
naming it. That test runs first: after the training run the engine serves the job's last export, which
the preflight rightly refuses as another model than ``model.path``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import QUICKSTART, REPO, train_env

pytestmark = pytest.mark.timeout(300)
TOKEN = "external-engine-token-for-this-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine(tiny_model, tmp_path_factory):
    """``(address, model dir)`` of a built-in engine server that no job started (stopped at the end)."""
    model, tmp = tiny_model(), tmp_path_factory.mktemp("external")
    token = tmp / "token"
    token.write_text(TOKEN)
    port = _free_port()
    cmd = [sys.executable, "-m", "slime.backends.rollout.builtin.server", "--model-path", str(model)]
    cmd += ["--port", str(port), "--seed", "0", "--num-threads", "1", "--weight-version", "0"]
    env = {**train_env(), "SLIME_JOB_SECRET_FILE": str(token)}  # the server's own token (slime.core.auth)
    log = open(tmp / "engine.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while _get(f"http://127.0.0.1:{port}/health") is None:
        assert proc.poll() is None and time.monotonic() < deadline, (tmp / "engine.log").read_text()
        time.sleep(0.5)
    yield f"127.0.0.1:{port}", model, token
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def _get(url: str, token: str = "") -> dict | None:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return json.loads(text) if text.startswith("{") else {}


def _submit(tmp: Path, addrs: list[str], model: Path, token: Path) -> tuple[subprocess.CompletedProcess, Path]:
    sets = {
        "logging.dir": str(tmp / "runs"),
        "logging.progress": False,
        "model.builtin": None,
        "model.path": str(model),
        "rollout.external": addrs,
        "cluster.secrets": {"EXT_ENGINE_TOKEN": {"file": str(token)}},
        "rollout.external_token_secret": "EXT_ENGINE_TOKEN",
        "rollout.num_rollouts": 2,
        "rollout.batch_size": 4,
        "train.global_batch_size": 32,
        "train.micro_batch_size": 32,
        "algorithm.sft_warmup_steps": 2,
        "data.eval": [],
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", str(QUICKSTART), *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=540,
        env={**train_env(), "WANDB_MODE": "disabled"},
    )
    runs = sorted((tmp / "runs").glob("*/tasks/0"))
    return proc, runs[-1] if runs else tmp


def test_unreachable_external_address_fails_the_preflight_naming_it(tmp_path, engine):
    addr, model, token = engine
    dead = f"127.0.0.1:{_free_port()}"
    proc, task = _submit(tmp_path, [addr, dead], model, token)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{dead} is unreachable" in proc.stdout + proc.stderr
    report = json.loads((task / "preflight.json").read_text())
    assert [r["ok"] for r in report["external"]] == [True, False]
    assert not (task / "metrics.jsonl").exists()
    assert os.path.exists(task / "preflight.txt")


def test_job_trains_on_engines_it_did_not_start(tmp_path, engine):
    addr, model, token = engine
    proc, task = _submit(tmp_path, [addr], model, token)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (task / "preflight.txt").read_text()
    assert "external engines" in table and addr in table and "accepts updates" in table, table
    report = json.loads((task / "preflight.json").read_text())
    assert report["external"] == [
        {"address": addr, "reachable": True, "model": str(model), "weights": "accepts updates", "ok": True}
    ]
    assert all(not any(r.startswith("engine") for r in s["roles"]) for s in report["slots"])  # no slot for it
    rows = [json.loads(x) for x in (task / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == [-1, 0, 1]
    # the job's syncs reached the engine (its version is the job's last), and the job left it running
    served = _get(f"http://{addr}/get_weight_version", TOKEN)
    assert served == {"weight_version": str(rows[-1]["weight_version"])}, served
    assert int(served["weight_version"]) >= 2
