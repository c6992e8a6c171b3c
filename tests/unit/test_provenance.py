"""lock.json: contents, versions without imports, git state, redaction, preflight merge, duplicate
refusal and rerun reconstruction. Real compiles (the launchers' own ``dryrun``), real git repos,
real processes; nothing is submitted (the SLURM round trip is in tests/e2e/test_job_management.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.jobs import record_start, run_status
from launchers.local.launcher import LocalLauncher
from launchers.slurm.launcher import SlurmLauncher
from slime import provenance
from slime.core.errors import InfraError
from slime.provenance import (
    DuplicateRun,
    git_info,
    read_lock,
    redact,
    refuse_duplicate,
    secret_like,
    secret_values,
    update_lock_from_preflight,
    write_lock,
)
from slime.spec import SpecError, load_spec

ENV_SECRET = "env-canary-7f3a9d2e41"
FILE_SECRET = "file-canary-c0ffee5511"

SPEC = """apiVersion: slime/v2
kind: RLJob
name: prov
cluster:
  launcher: {launcher}
  nodes: 1
  gpus_per_node: 0
  cpus_per_node: 1
  env: {{OMP_NUM_THREADS: "1", HF_TOKEN: hf_plain_env_value_123}}
  secrets:
    API_KEY: {{env: PROV_TEST_SECRET}}
    DB_PASSWORD: {{file: {secret_file}}}
model: {{builtin: tiny}}
rollout: {{num_rollouts: 1, batch_size: 2, n_samples_per_prompt: 2, max_prompt_len: 16, max_response_len: 8}}
data: {{prompts: p.jsonl}}
logging: {{dir: runs}}
"""


@pytest.fixture
def spec_file(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("PROV_TEST_SECRET", ENV_SECRET)
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    secret = tmp_path / "db-password.txt"
    secret.write_text(FILE_SECRET + "\n")
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(launcher="slurm", secret_file=secret))
    return path


def compiled(spec_file: Path, launcher_cls=SlurmLauncher, run_name: str = "prov-1", **extra):
    loaded = load_spec(str(spec_file))
    launcher = launcher_cls()
    options = SubmitOptions(run_name=run_name, extra=extra)
    return loaded, launcher, options, launcher.dryrun(loaded, options).request


def test_lock_records_spec_hash_versions_script_and_options(spec_file, monkeypatch):
    monkeypatch.setenv("SLIME_DRIVER", "tests.fixtures.tinydriver")
    monkeypatch.setattr(sys, "argv", ["slime-submit", str(spec_file), "--set", f"x.API_KEY={ENV_SECRET}"])
    loaded, _, options, request = compiled(spec_file)
    paths = create_run_dir(request)
    write_lock(paths, request, options)
    lock = read_lock(paths.root)
    assert lock["spec_sha256"] == hashlib.sha256(paths.resolved.read_bytes()).hexdigest()
    assert lock["launcher"] == "slurm" and lock["name"] == "prov" and lock["run_dir"] == str(paths.root)
    assert lock["spec"]["path"] == str(spec_file.resolve()) and lock["spec"]["tasks"] == 1
    assert lock["spec"]["files"]["job.sbatch"] == hashlib.sha256(paths.script.read_bytes()).hexdigest()
    assert lock["spec"]["resolved"]["rollout"] == json.loads(paths.resolved.read_text())["rollout"]
    assert lock["packages"]["torch"] == importlib.metadata.version("torch")
    assert lock["packages"]["ray"] == importlib.metadata.version("ray")
    assert set(lock["packages"]) == {"torch", "ray", "transformers", "megatron-core", "sglang"}
    assert lock["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert lock["slime_submit"]["version"]
    assert lock["git"] is None  # tmp_path is not a git work tree
    assert lock["options"]["driver_env"] == "tests.fixtures.tinydriver" and lock["options"]["preflight_only"] is False
    assert (
        lock["script"]["text"].startswith("#!/bin/bash")
        and "slime_secret_env API_KEY PROV_TEST_SECRET" in lock["script"]["text"]
    )
    assert lock["hosts"] is None and lock["rerun_of"] is None
    assert isinstance(lock["patches"], list)
    assert lock["spec"]["api_version"] == lock["spec"]["written_version"] == "slime/v2"
    assert lock["container"] is None


def test_a_v1_file_is_locked_as_upgraded_with_the_version_it_was_written_in(spec_file):
    """A slime/v1 file: the lock says v2 (what ran) and v1 (what the file says); the container moved too."""
    text = spec_file.read_text().replace("apiVersion: slime/v2", "apiVersion: slime/v1")
    text = text.replace("  cpus_per_node: 1\n", "  cpus_per_node: 1\n  container: {image: 'img:1', workdir: /w}\n")
    spec_file.write_text(text)
    _, _, options, request = compiled(spec_file)
    lock = provenance.build_lock(request, options)
    assert (lock["spec"]["api_version"], lock["spec"]["written_version"]) == ("slime/v2", "slime/v1")
    assert lock["spec"]["resolved"]["cluster"]["slurm"]["container"]["image"] == "img:1"
    assert lock["container"]["image"] == "img:1" and lock["container"]["workdir"] == "/w"


def test_no_secret_value_reaches_the_lock(spec_file, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["slime-submit", str(spec_file), "--set", f"cluster.env.MY_TOKEN={ENV_SECRET}"])
    monkeypatch.setenv("SOME_PASSWORD", "pw-from-the-environment-99")
    _, _, options, request = compiled(spec_file)
    paths = create_run_dir(request)
    write_lock(paths, request, options)
    text = paths.lock.read_text()
    for value in (ENV_SECRET, FILE_SECRET, "hf_plain_env_value_123", "pw-from-the-environment-99"):
        assert value not in text
    lock = json.loads(text)
    assert lock["spec"]["resolved"]["cluster"]["env"] == {"OMP_NUM_THREADS": "1", "HF_TOKEN": "<redacted>"}
    assert "export HF_TOKEN=<redacted>" in lock["script"]["text"]
    assert "export OMP_NUM_THREADS=1" in lock["script"]["text"] or "OMP_NUM_THREADS='1'" in lock["script"]["text"]
    assert "cluster.env.MY_TOKEN=<redacted>" in lock["submitted_by"]["argv"]
    # the run dir's own copy of the script holds references only (the launcher's guarantee)
    assert ENV_SECRET not in paths.script.read_text() and FILE_SECRET not in paths.script.read_text()


@pytest.mark.parametrize(
    "name,secret",
    [
        ("WANDB_API_KEY", True),
        ("HF_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("apikey", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("MY_PASSWD", True),
        ("PWD", False),
        ("KEYBOARD", False),
        ("OMP_NUM_THREADS", False),
        ("PATH", False),
        ("TOKENIZERS_PARALLELISM", False),
    ],
)
def test_secret_like_names(name, secret):
    assert secret_like(name) is secret


def test_redact_values_and_assignments_but_not_short_values():
    values = secret_values(
        {"cluster": {"secrets": {"A": {"env": "V"}}}}, {"V": "s3cr3t-value", "X_TOKEN": "tok", "HOME": "/root"}
    )
    assert values == ["s3cr3t-value"]  # "tok" is too short to scrub safely; HOME is not secret-like
    text = "echo s3cr3t-value; export WANDB_API_KEY='abc def'; FOO=bar; HF_TOKEN=xyz123 run"
    out = redact(text, values)
    assert out == "echo <redacted>; export WANDB_API_KEY=<redacted>; FOO=bar; HF_TOKEN=<redacted> run"


def test_versions_are_read_without_importing_the_packages(spec_file, tmp_path):
    code = (
        f"import sys, json\nfrom slime.provenance import package_versions, git_info\n"
        f"v = package_versions(); git_info(__import__('pathlib').Path({str(spec_file)!r}))\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'transformers', 'megatron', "
        "'sglang'})\nprint(json.dumps({'v': v, 'heavy': heavy}))"
    )
    out = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    )
    assert out["heavy"] == [] and out["v"]["torch"] == importlib.metadata.version("torch")


def test_git_sha_and_uncommitted_diff_hash(tmp_path):
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    spec = repo / "specs" / "job.yaml"
    spec.write_text("name: a\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "init"], check=True)
    sha = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    clean = git_info(spec)
    assert clean["sha"] == sha and clean["dirty"] is False and clean["diff_sha256"] is None
    assert Path(clean["repo"]).resolve() == repo.resolve() and clean["untracked_files"] == 0
    spec.write_text("name: b\n")
    (repo / "notes.txt").write_text("untracked\n")
    diff = subprocess.run(git + ["diff", "HEAD", "--no-color", "--no-ext-diff"], capture_output=True).stdout
    dirty = git_info(spec)
    assert dirty["dirty"] is True and dirty["diff_sha256"] == hashlib.sha256(diff).hexdigest()
    assert dirty["untracked_files"] == 1 and dirty["sha"] == sha
    assert git_info(tmp_path / "elsewhere.yaml") is None  # not in a repo


def test_preflight_hosts_are_merged_into_the_lock_once(spec_file):
    _, _, options, request = compiled(spec_file)
    paths = create_run_dir(request)
    write_lock(paths, request, options)
    assert update_lock_from_preflight(paths.root)["hosts"] is None  # no report yet
    report = {
        "ok": True,
        "job_id": "12",
        "created": 1.5,
        "nodes": [
            {
                "rank": 0,
                "host": "sn1",
                "ip": "10.0.0.1",
                "gpus": ["0", "1"],
                "cuda_visible_devices": "0,1",
                "slurm_gpus": "0,1",
                "nvidia_smi": None,
                "torch_cuda": 0,
                "roles": {"0": ["actor"]},
            }
        ],
    }
    paths.task(0).preflight_json.write_text(json.dumps(report))
    hosts = update_lock_from_preflight(paths.root)["hosts"]
    assert hosts["0"]["nodes"][0]["host"] == "sn1" and hosts["0"]["nodes"][0]["gpus"] == ["0", "1"]
    assert hosts["0"]["job_id"] == "12" and "roles" not in hosts["0"]["nodes"][0]
    before = paths.lock.stat().st_mtime_ns
    update_lock_from_preflight(paths.root)
    assert paths.lock.stat().st_mtime_ns == before  # unchanged report: no rewrite
    assert read_lock(paths.root)["hosts"] == hosts


def test_read_lock_errors_name_the_fix(tmp_path):
    with pytest.raises(InfraError, match="no lock.json"):
        read_lock(tmp_path)
    (tmp_path / "lock.json").write_text("{not json")
    with pytest.raises(InfraError, match="cannot read"):
        read_lock(tmp_path)


def test_duplicate_of_a_running_local_run_is_refused_unless_forced(spec_file, tmp_path):
    spec_file.write_text(spec_file.read_text().replace("launcher: slurm", "launcher: local"))
    _, _, options, request = compiled(spec_file, LocalLauncher)
    paths = create_run_dir(request)
    paths.write_jobs({"launcher": "local", "job_ids": [], "tasks": 1, "preflight_only": False})
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(paths.root)])
    try:
        record_start(paths, 0, proc.pid)
        _, _, opts2, again = compiled(spec_file, LocalLauncher, run_name="prov-2")
        with pytest.raises(DuplicateRun) as err:
            refuse_duplicate(again, opts2, run_status)
        assert isinstance(err.value, SpecError) and err.value.run_dir == paths.root and err.value.state == "running"
        assert "--force" in err.value.problems[0].hint
        refuse_duplicate(again, SubmitOptions(force=True), run_status)  # --force: allowed
        refuse_duplicate(again, SubmitOptions(preflight_only=True), run_status)  # a doctor run is never refused
        loaded = load_spec(str(spec_file), overrides=["rollout.num_rollouts=2"])
        other = LocalLauncher().dryrun(loaded, SubmitOptions(run_name="prov-3")).request
        refuse_duplicate(other, opts2, run_status)  # a different resolved spec is another job
    finally:
        proc.kill()
        proc.wait()
    refuse_duplicate(again, opts2, run_status)  # finished: allowed


def test_rerun_rebuilds_exactly_the_recorded_specs_with_a_fresh_checkpoint_dir(spec_file, tmp_path):
    sweep = spec_file.read_text() + "sweep:\n  grid: {train.seed: [1, 2]}\n"
    spec_file.write_text(sweep)
    _, _, options, request = compiled(spec_file, python="/opt/py/bin/python3")
    paths = create_run_dir(request)
    write_lock(paths, request, options)
    lock = read_lock(paths.root)
    loaded = provenance.loaded_from_run(paths, lock)
    assert [t.overrides for t in loaded.tasks] == [{"train.seed": 1}, {"train.seed": 2}]
    assert all(t.spec.train.checkpoint.dir is None for t in loaded.tasks)  # not the old run's checkpoints
    extra, env = provenance.rerun_extra(paths, lock)
    assert extra["python"] == "/opt/py/bin/python3" and extra["rerun_of"]["run_dir"] == str(paths.root)
    again = SlurmLauncher().dryrun(loaded, SubmitOptions(run_name="prov-again", extra=extra)).request
    assert again.file("resolved.json") == request.file("resolved.json")
    for i in (0, 1):
        rel = f"tasks/{i}/resolved.json"
        assert again.file(rel) == request.file(rel).replace(str(paths.root), str(again.run_dir))
    assert again.file("job.sbatch") == request.file("job.sbatch").replace(str(paths.root), str(again.run_dir))
    paths.resolved.write_text(paths.resolved.read_text().replace('"prov"', '"edited"'))
    with pytest.raises(InfraError, match="no longer matches"):
        provenance.loaded_from_run(paths, lock)


def test_overrides_are_recorded_and_give_each_submit_its_own_run_dir(spec_file, monkeypatch):
    """One file submitted with different --set values within one second (a `for lr in ...` loop):
    each submit gets its own run dir, and the lock (and a rerun's lock) says which overrides ran."""
    monkeypatch.setattr("slime.core.paths.time.time", lambda: 1_800_000_000.0)  # the same second for every submit
    requests = []
    for seed in (7, 8):
        loaded = load_spec(str(spec_file), overrides=[f"train.seed={seed}", f"cluster.env.MY_TOKEN={ENV_SECRET}"])
        options = SubmitOptions()
        requests.append((SlurmLauncher().dryrun(loaded, options).request, options))
    (first, options), (second, _) = requests
    assert first.run_dir != second.run_dir and first.run_dir.parent == second.run_dir.parent
    assert "# overrides: --set train.seed=7 --set cluster.env.MY_TOKEN=" in first.render()
    paths = create_run_dir(first)
    write_lock(paths, first, options)
    lock = read_lock(paths.root)
    assert lock["spec"]["overrides"] == ["train.seed=7", "cluster.env.MY_TOKEN=<redacted>"]
    assert ENV_SECRET not in paths.lock.read_text()
    assert provenance.loaded_from_run(paths, lock).overrides == tuple(lock["spec"]["overrides"])
    # the same resolved spec twice in one second (--force): a clear error, not a traceback
    with pytest.raises(InfraError, match="already exists: the same resolved spec was submitted twice"):
        create_run_dir(first)


def test_a_duplicate_run_is_not_reported_as_a_problem_in_the_spec_text(tmp_path):
    (p,) = DuplicateRun(tmp_path / "run a", ["12"], "running").problems
    assert p.format().startswith("error: this exact spec") and "<document>" not in p.format()
    assert f"slime-submit status '{tmp_path / 'run a'}'" in p.hint  # quoted for pasting
