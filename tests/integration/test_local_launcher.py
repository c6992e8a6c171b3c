"""The local launcher end to end with a real local Ray: bootstrap → preflight → driver → teardown.

The driver is ``tests.fixtures.tinydriver`` (the RL runtime is tested elsewhere): it connects to the
job's private Ray cluster and records what it saw. Teardown must leave no process of this job's
Ray behind (found by the marker variable every one of them carries).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.launcher import LocalLauncher
from launchers.node.preflight_checks import SOLO_SKIP
from launchers.node.rayproc import pids_using
from slime.core.ports import port_range
from slime.spec import load_spec
from tests.fixtures.tinydriver import DRIVER, driver_env

pytestmark = pytest.mark.timeout(240)

SPEC = """apiVersion: slime/v2
kind: RLJob
name: local-boot
cluster:
  launcher: local
  nodes: 1
  gpus_per_node: 0
  cpus_per_node: 2
  bootstrap_timeout_s: 90
model: {builtin: tiny}
rollout: {num_rollouts: 1, batch_size: 2, n_samples_per_prompt: 2, max_prompt_len: 16, max_response_len: 8}
data: {prompts: p.jsonl}
logging: {dir: runs}
"""


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def _node_record(run_dir: Path) -> dict:
    (rec,) = (run_dir / "tasks" / "0" / "rendezvous").glob("node-*-0.json")
    return json.loads(rec.read_text())


def _assert_no_leftovers(run_dir: Path) -> None:
    temp_dir = _node_record(run_dir)["temp_dir"]
    end = time.monotonic() + 5
    while pids_using(temp_dir) and time.monotonic() < end:
        time.sleep(0.1)
    assert pids_using(temp_dir) == [], f"Ray processes of this job left behind: {pids_using(temp_dir)}"


def test_local_run_bootstraps_ray_passes_the_preflight_and_runs_the_driver(spec_file, tmp_path):
    env = {**os.environ, **driver_env()}
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", str(spec_file), "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)  # --json: stdout is the JSON document and nothing else
    run_dir = Path(out["run_dir"])
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert pre["ok"] and pre["ray_nodes"] == 1 and len(pre["slots"]) == 1
    assert {c["name"] for c in pre["checks"]} >= {
        "ray_nodes",
        "bundles",
        "placement",
        "gpu_count",
        "ray_resources",
        "collective",
    }
    # one node without GPUs: the collective is skipped (no subprocess importing torch to all_reduce with itself)
    assert pre["collective"] == {"backend": "gloo", "world": 1, "skipped": SOLO_SKIP}
    assert "collective: skipped: one node without GPUs" in (run_dir / "tasks/0/preflight.txt").read_text()
    assert "preflight PASSED" in (run_dir / "tasks/0/preflight.txt").read_text()
    probe = json.loads((run_dir / "tasks/0/driver-probe.json").read_text())
    assert len(probe["nodes"]) == 1 and probe["nodes"][0]["resources"]["slime_node_0"] == 1.0
    assert probe["nodes"][0]["resources"]["CPU"] == 2.0
    low, high = port_range()
    port = int(probe["ray_address"].rsplit(":", 1)[1])
    assert low <= port < high and probe["gcs_address"] == probe["ray_address"]
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert jobs["local"]["tasks"]["0"]["exit_code"] == 0 and jobs["local"]["tasks"]["0"]["pid"] > 0
    assert not Path(_node_record(run_dir)["temp_dir"]).exists()  # removed after a clean run
    _assert_no_leftovers(run_dir)
    assert (
        "driver exited with code 0"
        in (run_dir / "tasks/0/logs").joinpath(f"{os.uname().nodename.split('.')[0]}.out").read_text()
    )


def test_term_stops_the_driver_then_this_jobs_ray_and_nothing_else(spec_file, tmp_path):
    loaded = load_spec(spec_file)
    launcher = LocalLauncher()
    request = launcher.dryrun(loaded, SubmitOptions(run_name="term-run", extra={"driver": DRIVER})).request
    paths = create_run_dir(request)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    env = {**os.environ, **driver_env(SLIME_TINYDRIVER_SLEEP="300")}
    boot = subprocess.Popen(list(request.command), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        probe_file = paths.task(0).driver_probe
        end = time.monotonic() + 150
        while not probe_file.exists() and time.monotonic() < end and boot.poll() is None:
            time.sleep(0.2)
        assert probe_file.exists(), boot.stdout.read() if boot.poll() is not None else "driver never started"
        t = time.monotonic()
        boot.send_signal(signal.SIGTERM)
        rc = boot.wait(timeout=60)
        elapsed = time.monotonic() - t
        output = boot.stdout.read()
        assert rc == 128 + signal.SIGTERM, output
        assert elapsed < 30, f"teardown took {elapsed:.1f} s"
        probe = json.loads(probe_file.read_text())
        assert "SIGTERM" in probe["signals"]  # the driver got the signal first
        assert "stopped this job's Ray" in output
        _assert_no_leftovers(paths.root)
        assert not Path(_node_record(paths.root)["temp_dir"]).exists()  # a stop is no failure: nothing kept
        assert bystander.poll() is None
    finally:
        if boot.poll() is None:
            boot.kill()
        bystander.kill()
        bystander.wait()
