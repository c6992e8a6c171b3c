"""``slime-submit chain`` with the local launcher: steps run one after another, and stop after a failure.

Real local bootstrap, Ray and preflight; the driver is ``tests.fixtures.tinydriver`` (the RL runtime is
tested elsewhere), which writes no ``final_model``: the second step, which uses the first's, fails
on the node's input check before Ray starts, so the third is never started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tinydriver import driver_env

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("learning")]

SPEC = """apiVersion: slime/v2
kind: RLJob
name: {name}
description: {description}
cluster: {{launcher: local, nodes: 1, gpus_per_node: 0, cpus_per_node: 2, bootstrap_timeout_s: 90}}
model: {model}
rollout: {{num_rollouts: 1, batch_size: 2, n_samples_per_prompt: 2, max_prompt_len: 16, max_response_len: 8}}
data: {{prompts: p.jsonl}}
logging: {{dir: runs}}
"""


def test_a_local_chain_runs_in_order_and_stops_after_the_step_that_failed(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    files = []
    for name, model, description in (
        ("one", "{builtin: tiny}", "first"),
        ("two", "{path: '${runs.one.final_model}'}", "uses one's final model"),
        ("three", "{builtin: tiny}", "after ${runs.two.run_dir}"),
    ):
        (tmp_path / f"{name}.yaml").write_text(SPEC.format(name=name, model=model, description=description))
        files.append(f"{name}.yaml")
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "chain", *files, "--json"],
        cwd=tmp_path,
        env={**os.environ, **driver_env()},
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr  # the second step's exit code: its input is missing
    one, two, three = json.loads(proc.stdout)["steps"]
    assert one["returncode"] == 0 and json.loads((Path(one["run_dir"]) / "tasks/0/driver-probe.json").read_text())
    assert two["returncode"] == 2 and not (Path(two["run_dir"]) / "tasks/0/driver-probe.json").exists()
    (found,) = json.loads((Path(two["run_dir"]) / "tasks/0/chain_inputs.json").read_text())
    assert found["path"] == str(Path(one["run_dir"]) / "tasks/0/final_model") and found["exists"] is False
    log = "".join(p.read_text() for p in (Path(two["run_dir"]) / "tasks/0/logs").glob("*"))
    assert "chain input missing: model.path: ${runs.one.final_model}" in log
    assert three["run_dir"] is None and three["note"] == "not started: step 'two' ended with exit code 2"
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")) == [
        "one",
        "two",
    ]
    status = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "status", one["run_dir"]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    assert "chain of 3 steps" in status.stdout and "not started: step 'two'" in status.stdout
