"""The launcher objects (``launchers.base.Launcher``): a pure dry run carrying typed specs, the dry run
that ``render`` prints, one object per launcher for the job commands, a job id → its run.

Real specs, real run dirs; nothing is submitted (submit paths: test_slurm_submit.py,
tests/integration/test_local_launcher.py, tests/e2e/test_job_management.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from launchers import LAUNCHERS, get_launcher
from launchers.base import DryRun, Launcher, SubmitOptions
from launchers.local.launcher import LocalLauncher
from launchers.slurm.launcher import SlurmLauncher
from slime.cli.main import main
from slime.core.paths import RunPaths
from slime.core.registry import UnknownPlugin
from slime.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
GPU_SPEC = str(ROOT / "specs" / "grpo-multinode.yaml")


@pytest.fixture
def sweep_spec(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "specs" / "data", tmp_path / "data")
    text = (ROOT / "specs" / "quickstart.yaml").read_text()
    path = tmp_path / "sweep.yaml"
    path.write_text(
        text.replace("dir: ../runs", f"dir: {tmp_path / 'runs'}") + "\nsweep:\n  grid: {train.seed: [1, 2]}\n"
    )
    return path


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_a_dry_run_is_pure_and_carries_the_typed_specs_it_was_compiled_from(sweep_spec, name):
    loaded = load_spec(sweep_spec, overrides=[f"cluster.launcher={name}"])
    launcher = get_launcher(name)
    options = SubmitOptions(run_name="r1")
    dry = launcher.dryrun(loaded, options)
    request = dry.request
    assert isinstance(dry, DryRun) and dry.options is options
    assert request.spec is loaded.spec and request.n_tasks == 2 and request.source == sweep_spec
    assert request.run_dir == sweep_spec.parent / "runs" / "r1"
    assert [f.path for f in request.files][:4] == [
        "spec.yaml",
        "resolved.json",
        "tasks/0/resolved.json",
        "tasks/1/resolved.json",
    ]
    assert json.loads(request.file("tasks/1/resolved.json"))["spec"]["train"]["seed"] == 2
    # pure: nothing written, nothing kept on the launcher for submit to read back
    assert not (sweep_spec.parent / "runs").exists()
    assert vars(launcher) == {}
    assert launcher.dryrun(loaded, options) == dry


def test_render_prints_the_dry_run_with_the_engine_previews_and_json_serialises_it(capsys):
    assert main(["render", GPU_SPEC, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"launcher", "run_dir", "files", "command", "engines", "cluster_profile"}
    assert doc["cluster_profile"] is None  # no cluster profile selected
    assert list(doc["engines"]) == [
        "megatron-core arguments of the trainer ranks",
        "SGLang engine commands; node addresses are filled in at run time",
    ]
    assert doc["command"][:2] == ["sbatch", "--parsable"] and "job.sbatch" in doc["files"]
    assert main(["render", GPU_SPEC]) == 0
    text = capsys.readouterr().out
    command = text.index("# ---- command ----")
    megatron = text.index("# ---- megatron-core arguments of the trainer ranks ----")
    assert command < megatron < text.index("# ---- SGLang engine commands")
    assert "launchers.node.bootstrap" in text  # the batch script starts the node side by its new module path


def test_one_launcher_object_per_launcher_in_the_registry():
    assert sorted(LAUNCHERS.names()) == ["local", "slurm"]
    assert isinstance(get_launcher("local"), LocalLauncher) and isinstance(get_launcher("slurm"), SlurmLauncher)
    assert all(isinstance(get_launcher(n), Launcher) for n in LAUNCHERS.names())
    with pytest.raises(UnknownPlugin, match="local, slurm"):
        get_launcher("pbs")


def _run(parent: Path, name: str, jobs: dict) -> RunPaths:
    paths = RunPaths.create(parent, name, [("resolved.json", json.dumps({"name": "x"}), 0o644)])
    paths.write_jobs(jobs)
    return paths


def test_a_job_id_finds_its_run_and_array_task_through_its_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # jobs.json alone must answer
    sweep = _run(
        tmp_path,
        "sweep",
        {
            "launcher": "slurm",
            "job_ids": ["55"],
            "tasks": 3,
            "arrays": [{"job_id": "55", "first_task": 0, "last_task": 2}],
        },
    )
    single = _run(tmp_path, "single", {"launcher": "slurm", "job_ids": ["60"], "tasks": 1})
    local = _run(tmp_path, "local", {"launcher": "local", "job_ids": [], "tasks": 1})
    slurm, runs = SlurmLauncher(), [sweep, single, local]
    assert slurm.find_run("55_1", runs) == (sweep, 1)
    assert slurm.find_run("55", runs) == (sweep, None)
    assert slurm.find_run("60", runs) == (single, None)
    assert slurm.find_run("61", runs) is None
    assert LocalLauncher().find_run("55", [local]) is None  # local runs have no scheduler job ids
