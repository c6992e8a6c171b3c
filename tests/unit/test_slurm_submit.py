"""SlurmLauncher.submit against shimmed ``sbatch``/``scontrol`` executables on PATH.

The boundary faked here is the SLURM client: the real CI cluster's MaxArraySize is fixed when it
starts (and must not be restarted by tests), so splitting a sweep across arrays is exercised with
an ``scontrol`` that reports a small MaxArraySize and an ``sbatch`` that records its arguments
and environment. The real submission path is covered by tests/e2e/test_slurm_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchers.base import SubmitOptions
from launchers.slurm.launcher import SlurmLauncher
from slime.core.errors import InfraError
from slime.spec import load_spec_text
from tests.fixtures.fake_slurm import FakeSlurm

SCONTROL = r"""#!/bin/bash
case "$2" in
  config) echo "MaxArraySize            = 3" ;;
  partition) echo "PartitionName=batch Default=YES Nodes=sn[1-2] State=UP" ;;
  job) echo "JobId=$4 JobState=RUNNING" ;;
  node) for n in sn1 sn2; do
          echo "NodeName=$n CPUTot=4 Gres=gpu:2 RealMemory=8000 State=IDLE Partitions=batch"
        done ;;
esac
"""

SBATCH = r"""#!/bin/bash
n=$(ls "$SHIM_REC" | wc -l)
printf '%s\n' "$@" > "$SHIM_REC/call-$n"
echo "offset=$SLIME_TASK_OFFSET" >> "$SHIM_REC/call-$n"
[ -n "${FAIL_AT:-}" ] && [ "$n" = "$FAIL_AT" ] && { echo "sbatch: error: QOSMaxSubmitJobPerUserLimit" >&2; exit 1; }
echo "$((100 + n))"
"""


def _spec(tmp_path: Path, n_seeds: int, **slurm) -> str:
    doc = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "split",
        "cluster": {"launcher": "slurm", "nodes": 1, "gpus_per_node": 2, "slurm": slurm},
        "model": {"builtin": "tiny"},
        "rollout": {
            "colocate": True,
            "num_rollouts": 1,
            "max_prompt_len": 16,
            "max_response_len": 8,
            "batch_size": 4,
            "n_samples_per_prompt": 2,
        },
        "data": {"prompts": "/p.jsonl"},
        "logging": {"dir": str(tmp_path / "runs")},
        "sweep": {"grid": {"train.seed": list(range(n_seeds))}, "max_parallel": 2},
    }
    return json.dumps(doc)


@pytest.fixture
def shims(tmp_path, monkeypatch):
    fake = FakeSlurm(tmp_path)
    fake.add("scontrol", SCONTROL)
    fake.add("sbatch", SBATCH)
    fake.activate(monkeypatch)
    return fake.rec


def _calls(rec: Path) -> list[list[str]]:
    return [(rec / f"call-{i}").read_text().split("\n")[:-1] for i in range(len(list(rec.iterdir())))]


def test_a_sweep_larger_than_max_array_size_is_split_into_chained_arrays_with_offsets(tmp_path, shims):
    launcher = SlurmLauncher()
    dry = launcher.dryrun(load_spec_text(_spec(tmp_path, 7)), SubmitOptions(run_name="r"))
    sub = launcher.submit(dry)
    assert sub.job_ids == ("100", "101", "102")
    script = str(sub.run_dir / "job.sbatch")
    assert _calls(shims) == [
        ["--parsable", "--array=0-2%2", script, "offset=0"],
        ["--parsable", "--array=0-2%2", "--dependency=afterany:100", script, "offset=3"],
        ["--parsable", "--array=0%2", "--dependency=afterany:101", script, "offset=6"],
    ]
    jobs = json.loads((sub.run_dir / "jobs.json").read_text())
    assert [(a["job_id"], a["first_task"], a["last_task"]) for a in jobs["arrays"]] == [
        ("100", 0, 2),
        ("101", 3, 5),
        ("102", 6, 6),
    ]
    assert (sub.run_dir / "logs").is_dir() and (sub.run_dir / "tasks/6/logs").is_dir()  # SLURM won't create them


@pytest.mark.parametrize("chained", [None, "afterok:99"])
def test_depends_on_is_kept_wherever_a_command_line_dependency_replaces_the_scripts(tmp_path, shims, chained):
    """sbatch's --dependency replaces the script's #SBATCH one: split arrays and chain steps repeat depends_on."""
    launcher = SlurmLauncher()
    text = _spec(tmp_path, 7, depends_on=[{"job": "4242"}])
    extra = {"dependency": chained} if chained else {}
    sub = launcher.submit(launcher.dryrun(load_spec_text(text), SubmitOptions(run_name="r", extra=extra)))
    assert "#SBATCH --dependency=afterok:4242" in (sub.run_dir / "job.sbatch").read_text()
    own = ",".join(d for d in (chained, "afterok:4242") if d)
    assert [[a for a in call if a.startswith("--dependency")] for call in _calls(shims)] == [
        [f"--dependency={own}"],
        [f"--dependency={own},afterany:100"],
        [f"--dependency={own},afterany:101"],
    ]
    assert json.loads((sub.run_dir / "jobs.json").read_text())["dependency"] == own


def test_a_sweep_that_fits_uses_the_scripts_own_array_line(tmp_path, shims):
    launcher = SlurmLauncher()
    dry = launcher.dryrun(load_spec_text(_spec(tmp_path, 3)), SubmitOptions(run_name="r"))
    sub = launcher.submit(dry)
    ((*args, offset),) = _calls(shims)
    assert args == ["--parsable", str(sub.run_dir / "job.sbatch")] and offset == "offset=0"
    assert "#SBATCH --array=0-2%2" in (sub.run_dir / "job.sbatch").read_text()


def test_a_refused_submission_is_an_infra_error_and_what_was_submitted_is_recorded(tmp_path, shims, monkeypatch):
    monkeypatch.setenv("FAIL_AT", "1")
    launcher = SlurmLauncher()
    dry = launcher.dryrun(load_spec_text(_spec(tmp_path, 7)), SubmitOptions(run_name="r"))
    with pytest.raises(InfraError, match="sbatch refused the job.*QOSMaxSubmitJobPerUserLimit"):
        launcher.submit(dry)
    jobs = json.loads((tmp_path / "runs/r/jobs.json").read_text())
    assert jobs["job_ids"] == ["100"]


@pytest.mark.parametrize("tasks", [1, 7])
def test_a_submission_sbatch_refuses_outright_leaves_no_run_dir(tmp_path, shims, monkeypatch, tasks):
    """sbatch refuses the first (or only) job: nothing was queued, so no run dir may be left to show up
    in status/list as an unknown run."""
    monkeypatch.setenv("FAIL_AT", "0")
    launcher = SlurmLauncher()
    dry = launcher.dryrun(load_spec_text(_spec(tmp_path, tasks)), SubmitOptions(run_name="r"))
    with pytest.raises(InfraError, match="sbatch refused the job.*QOSMaxSubmitJobPerUserLimit"):
        launcher.submit(dry)
    assert not (tmp_path / "runs" / "r").exists()


def test_no_sbatch_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    launcher = SlurmLauncher()
    dry = launcher.dryrun(load_spec_text(_spec(tmp_path, 2)), SubmitOptions(run_name="r"))
    with pytest.raises(InfraError, match="sbatch is not on PATH.*cluster.launcher: local"):
        launcher.submit(dry)
    assert not (tmp_path / "runs").exists()
