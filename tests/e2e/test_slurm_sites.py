"""Sites as they are, on the real 2-node SLURM cluster (ci/slurm-cluster.sh): cluster profiles, the
typed ``--gres`` request style, ``clusters check``, Apptainer with site setup on every node, and a
spec's ``depends_on``.

Real slurmctld/slurmd and Ray on sn1/sn2; ``ci/clusters.yaml`` is the CI cluster's profile. The fakes:
the GPUs (GRES on char devices, ``cluster.fake_gpus``), and in the Apptainer test ``apptainer`` itself,
which cannot be installed here: a recording stand-in on PATH (the process boundary) writes its argv
per node and execs the command after the image with a ``python3`` that is this venv's (what the image
would hold), and ``module`` is a recording stand-in too (no Lmod here); in the ``depends_on`` test
the driver (``tests.fixtures.tinydriver`` stands in for the RL runtime).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from launchers.slurm.cluster import job_records
from tests.fixtures.slurm_cluster import run_sbatch, wait_job
from tests.fixtures.tinydriver import driver_env

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "specs" / "smoke-slurm.yaml"
CI_PROFILES = REPO / "ci" / "clusters.yaml"


def cli(*args: str, clusters: Path = CI_PROFILES, env: dict | None = None, timeout: float = 300):
    t = time.monotonic()
    full = {**os.environ, "SLIME_CLUSTERS": str(clusters), "XDG_CONFIG_HOME": "/nonexistent", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full,
    )
    print(f"slime-submit {' '.join(args[:3])}... -> {proc.returncode} in {time.monotonic() - t:.1f} s")
    return proc


def _json(proc) -> dict:
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def test_clusters_check_passes_for_the_ci_profile_and_names_the_field_on_a_mismatch(slurm_cluster, tmp_path):
    ok = cli("clusters", "check", "ci", "--json")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert all(c["ok"] for c in _json(ok)["checks"]) and len(_json(ok)["checks"]) >= 5

    text = CI_PROFILES.read_text()
    for name, edited, field in (
        ("partition", text.replace("partition: batch", "partition: nope"), "clusters.ci.cluster.slurm.partition"),
        (
            "gpus",
            text.replace("batch: {gpus_per_node: 2", "batch: {gpus_per_node: 4"),
            "clusters.ci.partitions.batch.gpus_per_node",
        ),
        ("type", text.replace("gpu_type: fake", "gpu_type: a100"), "clusters.ci.cluster.slurm.gpu_type"),
    ):
        bad = tmp_path / f"{name}.yaml"
        bad.write_text(edited)
        proc = cli("clusters", "check", "ci", clusters=bad)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"mismatch: {field} ({bad}:" in proc.stdout
        checks = _json(cli("clusters", "check", "ci", "--json", clusters=bad))["checks"]
        assert {c["field"] for c in checks if not c["ok"]} == {field}  # the GPU type: one row per partition


@pytest.mark.slow
def test_a_gres_style_profile_submits_and_passes_the_preflight(slurm_cluster, tmp_path):
    proc = cli(
        "submit", str(SMOKE), "--cluster", "ci", "--preflight-only", "--json", "--set", f"logging.dir={tmp_path}"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = _json(proc)
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    assert "#SBATCH --gres=gpu:fake:2" in (run_dir / "job.sbatch").read_text()  # the profile's typed GRES
    (rec,) = job_records(job)
    assert "gpu:fake:2" in rec.get("TresPerNode", "") and rec["JobState"] == "COMPLETED"
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert pre["ok"] and [n["host"] for n in pre["nodes"]] == ["sn1", "sn2"]
    assert all(n["slurm_gpus"] == "0,1" for n in pre["nodes"])  # what SLURM allocated, checked per node
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["cluster_profile"]["name"] == "ci"
    assert lock["cluster_profile"]["fields"]["cluster.slurm.gpu_request"]["from"].startswith("profile ci (")


def _status(run_dir: Path) -> dict:
    return _json(cli("status", str(run_dir), "--json"))


@pytest.mark.slow
def test_a_job_with_depends_on_waits_for_that_job_and_never_starts_after_its_failure(slurm_cluster, tmp_path):
    """Each run waits for a plain SLURM job, held until released: ``status`` shows it pending on that
    job; it starts after the job succeeded, and SLURM ends it unstarted when its job failed (when: ok)."""
    hold = ["--hold", "-N1", "-o", "/dev/null", "--wrap"]
    ok_job, bad_job = run_sbatch([*hold, "sleep 1"]), run_sbatch([*hold, "exit 3"])
    runs = {}
    for name, job in (("after-ok", ok_job), ("after-bad", bad_job)):
        sets = (f"logging.dir={tmp_path / name}", "cluster.nodes=1", "train.nodes=1")
        dep = f'cluster.slurm.depends_on=[{{"job": "{job}", "when": "ok"}}]'
        proc = cli(
            *("submit", str(SMOKE), "--cluster", "ci", "--json", "--set", dep),
            *(a for kv in sets for a in ("--set", kv)),
            env=driver_env(),
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        runs[name] = Path(_json(proc)["run_dir"]), _json(proc)["job_ids"][0]
    for name, job in (("after-ok", ok_job), ("after-bad", bad_job)):
        (task,) = _status(runs[name][0])["tasks"]
        assert (task["state"], task["reason"]) == ("pending", "Dependency: waiting for the job it depends on")
        assert job_records(runs[name][1])[0]["Dependency"].startswith(f"afterok:{job}")
    subprocess.run(["scontrol", "release", f"{ok_job},{bad_job}"], check=True, capture_output=True)

    (after,) = wait_job(runs["after-ok"][1], timeout=200)
    (before,) = job_records(ok_job)
    assert datetime.fromisoformat(after["StartTime"]) >= datetime.fromisoformat(before["EndTime"])
    assert _status(runs["after-ok"][0])["state"] == "succeeded"
    (never,) = wait_job(runs["after-bad"][1], states=("CANCELLED",), timeout=60)
    assert never["Reason"] == "DependencyNeverSatisfied"  # SLURM ended it: its dependency failed
    assert _status(runs["after-bad"][0])["state"] == "cancelled"
    assert not (runs["after-bad"][0] / "tasks/0/preflight.json").exists()  # it never started


def test_depends_on_a_job_that_cannot_be_waited_for_is_refused_at_submit_naming_the_entry(slurm_cluster, tmp_path):
    failed = run_sbatch(["-N1", "-o", "/dev/null", "--wrap", "exit 3"])
    wait_job(failed, states=("FAILED",), timeout=60)
    for job, words in ((failed, f"job {failed} ended FAILED"), ("999999", "SLURM knows no job 999999")):
        proc = cli(
            *("submit", str(SMOKE), "--cluster", "ci", "--set", f"logging.dir={tmp_path}"),
            *("--set", f'cluster.slurm.depends_on=[{{"job": "{job}"}}]'),
        )
        assert proc.returncode != 0
        assert f"cluster.slurm.depends_on[0].job: {words}" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert not list(tmp_path.iterdir())  # nothing submitted, no run dir


APPTAINER = """#!/bin/bash
# recording stand-in for apptainer (see the module doc): argv per node, then run what follows the image
rec={rec}/$(hostname).$$
printf "%s\\0" "$@" > "$rec.argv"
printf "%s" "${{SLIME_SITE_SETUP:-}}" > "$rec.setup"
shift
while [[ $1 == --* ]]; do case $1 in --nv) shift ;; --pwd) cd "$2"; shift 2 ;; *) shift 2 ;; esac; done
shift
PATH={image_bin}:$PATH exec "$@"
"""


def _stand_ins(tmp_path: Path) -> tuple[Path, Path]:
    """(record dir, bin dir) of the ``apptainer`` and ``module`` stand-ins (see the module doc)."""
    rec, fake_bin, image_bin = tmp_path / "rec", tmp_path / "bin", tmp_path / "image-bin"
    for d in (rec, fake_bin, image_bin):
        d.mkdir()
    (fake_bin / "apptainer").write_text(APPTAINER.format(rec=rec, image_bin=image_bin))
    (fake_bin / "module").write_text(f'#!/bin/bash\necho "$@" >> {rec}/module.$(hostname)\n')
    (image_bin / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the image's Python
    for f in (fake_bin / "apptainer", fake_bin / "module", image_bin / "python3"):
        f.chmod(0o755)
    return rec, fake_bin


@pytest.mark.slow
def test_apptainer_and_site_setup_run_on_every_node_with_the_same_argv(slurm_cluster, tmp_path):
    """Apptainer through a recording stand-in at the process boundary (not installable here): the exact
    argv on each node, the setup having run on that node first, and the image's file hash in lock.json."""
    rec, fake_bin = _stand_ins(tmp_path)
    image = tmp_path / "slime.sif"
    image.write_bytes(b"not really an image")
    logdir = tmp_path / "runs"
    profiles = tmp_path / "clusters.yaml"
    profiles.write_text(
        f"""clusters:
  ci-apptainer:
    cluster:
      launcher: slurm
      fake_gpus: true
      slurm:
        partition: batch
        gpu_request: gres
        container:
          runtime: apptainer
          image: {image}
          mounts: ["{REPO}:{REPO}"]
          workdir: {REPO}
        setup:
          modules: [fake/1.0]
          lines: ['export SLIME_SITE_SETUP="ran on $(hostname)"']
"""
    )
    proc = cli(
        *("submit", str(SMOKE), "--cluster", "ci-apptainer", "--preflight-only", "--json"),
        *("--set", f"logging.dir={logdir}"),
        clusters=profiles,
        env={"PATH": f"{fake_bin}:{os.environ['PATH']}"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(_json(proc)["run_dir"])
    bootstraps = {}
    for argv_file in rec.glob("*.argv"):
        argv = [a.decode() for a in argv_file.read_bytes().split(b"\0")[:-1]]
        if "launchers.node.bootstrap" in argv:
            host = argv_file.name.split(".")[0]
            assert host not in bootstraps, "one bootstrap per node"
            bootstraps[host] = argv
            assert argv_file.with_suffix(".setup").read_text() == f"ran on {host}"  # the setup ran on this node
    expected = [
        *("exec", "--nv", "--bind", f"{REPO}:{REPO}", "--bind", f"{logdir}:{logdir}", "--pwd", str(REPO)),
        *(str(image), "python3", "-m", "launchers.node.bootstrap", str(run_dir), "--task", "0", "--preflight-only"),
    ]
    assert bootstraps == {"sn1": expected, "sn2": expected}
    assert (rec / "module.sn1").read_text().splitlines()[0] == "load fake/1.0"
    assert (rec / "module.sn2").read_text().splitlines() == ["load fake/1.0"]
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert pre["ok"] and pre["ray_nodes"] == 2
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["container"]["file_sha256"] == hashlib.sha256(b"not really an image").hexdigest()
    assert lock["container"]["runtime"] == "apptainer"


@pytest.mark.slow
@pytest.mark.extended
def test_gpus_per_task_style_is_allocated_and_passes_the_preflight(slurm_cluster, tmp_path):
    proc = cli(
        *("submit", str(SMOKE), "--cluster", "ci", "--preflight-only", "--json"),
        *("--set", f"logging.dir={tmp_path}", "--set", "cluster.slurm.gpu_request=gpus-per-task"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(_json(proc)["run_dir"])
    assert "#SBATCH --gpus-per-task=2" in (run_dir / "job.sbatch").read_text()
    assert json.loads((run_dir / "tasks/0/preflight.json").read_text())["ok"]


@pytest.mark.slow
@pytest.mark.extended
def test_an_untyped_gres_request_passes_the_preflight_where_the_cluster_types_its_gpus(slurm_cluster, tmp_path):
    proc = cli(
        *("submit", str(SMOKE), "--cluster", "ci", "--preflight-only", "--json"),
        *("--set", f"logging.dir={tmp_path}", "--set", "cluster.slurm.gpu_type=null"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(_json(proc)["run_dir"])
    assert "#SBATCH --gres=gpu:2\n" in (run_dir / "job.sbatch").read_text()
    assert json.loads((run_dir / "tasks/0/preflight.json").read_text())["ok"]
