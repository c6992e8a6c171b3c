"""The SLURM launcher on the real 2-node cluster (ci/slurm-cluster.sh): sbatch → per-job Ray →
gating preflight, through the ``slime-submit`` command.

Real slurmctld/slurmd, real Ray on two network namespaces (sn1, sn2). The only fakes: the GPUs
(GRES on char devices, so the collective runs over gloo and GPU counts come from SLURM), the
driver (``tests.fixtures.tinydriver`` stands in for the RL runtime), and, in the failure tests, a
wrapper around the ``ray`` command (``SLIME_RAY``) that makes Ray fail on a chosen node.
Each test reasons only about its own job ids. Timings are printed (``-s``), never asserted
beyond the bounds the feature promises (a failing node must fail the job within its timeout).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.slurm.cluster import job_records
from tests.fixtures.slurm_cluster import wait_job
from tests.fixtures.tinydriver import driver_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "specs" / "smoke-slurm.yaml"
SWEEP = REPO / "specs" / "sweep.yaml"
RAY = Path(sys.executable).parent / "ray"


def submit(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[subprocess.CompletedProcess, dict]:
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", *args, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    print(f"slime-submit {' '.join(args[:2])}... -> {proc.returncode} in {time.monotonic() - t:.1f} s")
    try:
        out = json.loads(proc.stdout[proc.stdout.index("{") :])
    except ValueError:
        out = {}
    return proc, out


def setting(path: str, value) -> tuple[str, str]:
    return "--set", f"{path}={json.dumps(value)}"  # JSON is YAML: any string survives --set


def ray_wrapper(tmp_path: Path, condition: str) -> Path:
    """A ``ray`` that fails (like a broken node would) when the shell ``condition`` holds."""
    path = tmp_path / "ray-wrapper"
    path.write_text(
        f"#!/bin/sh\nif {condition}; then\n"
        f'  echo "injected failure: ray cannot start on $(hostname)" >&2\n  exit 1\nfi\n'
        f'exec {RAY} "$@"\n'
    )
    path.chmod(0o755)
    return path


def forget_kept_ray_dirs(job: str) -> None:
    """Failed jobs keep their Ray dirs for debugging; these failures are on purpose."""
    import shutil

    from launchers.node.rayproc import temp_root

    for d in temp_root().glob(f"{job}-*"):
        shutil.rmtree(d, ignore_errors=True)


def test_preflight_only_bootstraps_both_nodes_and_maps_four_distinct_gpu_slots(slurm_cluster, tmp_path):
    """Also: hostile values in #SBATCH (account) and the logging dir reach SLURM exactly; nothing executes."""
    canary = "canary"  # lower case: SLURM lower-cases account names
    logdir = tmp_path / f"runs 'q' \"d\" $(touch {canary}) ;x `touch {canary}` %p"
    account = f"acct 'q' \"d\" $(touch {canary}) #1"
    t = time.monotonic()
    proc, out = submit(
        str(SMOKE), "--preflight-only", *setting("logging.dir", str(logdir)), *setting("cluster.slurm.account", account)
    )
    elapsed = time.monotonic() - t
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert pre["ok"] and pre["ray_nodes"] == 2
    assert pre["fake_gpus"] is True and [n["cuda"] for n in pre["nodes"]] == ["fake", "fake"]  # the spec opts in
    assert [n["host"] for n in pre["nodes"]] == ["sn1", "sn2"]
    assert [n["ip"] for n in pre["nodes"]] == [slurm_cluster.node_ips["sn1"], slurm_cluster.node_ips["sn2"]]
    slots = pre["slots"]
    assert len(slots) == 4 and len({(s["host"], s["gpu"]) for s in slots}) == 4
    assert [(s["node"], s["host"], s["gpu"]) for s in slots] == [
        (0, "sn1", "0"),
        (0, "sn1", "1"),
        (1, "sn2", "0"),
        (1, "sn2", "1"),
    ]
    assert all("actor" in s["roles"] for s in slots)  # trainer ranks on both nodes
    assert pre["collective"]["world"] == 2 and {r["host"] for r in pre["collective"]["results"]} == {"sn1", "sn2"}
    assert "preflight PASSED" in proc.stderr
    (rec,) = job_records(job)
    assert rec["JobState"] == "COMPLETED" and rec["Account"] == account
    assert (run_dir / "logs" / f"slurm-{job}.out").exists()  # the literal % of the dir survived SLURM's patterns
    assert not list(tmp_path.rglob(canary)) and not (REPO / canary).exists()
    print(
        f"preflight-only: {elapsed:.1f} s end to end; bootstrap→preflight passed {pre['bootstrap_seconds']:.1f} s; "
        f"preflight {pre['seconds']:.1f} s {pre['timings']}"
    )


def test_two_task_sweep_is_one_array_of_two_private_ray_clusters_on_the_same_nodes(slurm_cluster, tmp_path):
    env = driver_env(SLIME_TINYDRIVER_WAIT_TASKS="2", SLIME_TINYDRIVER_WAIT_S="150")
    t = time.monotonic()
    proc, out = submit(
        str(SWEEP),
        *setting("cluster.nodes", 2),
        *setting("cluster.gpus_per_node", 1),
        *setting("sweep.grid", {"train.seed": [1, 2]}),
        *setting("logging.dir", str(tmp_path)),
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]  # one array job
    jobs = json.loads((run_dir / "jobs.json").read_text())
    assert jobs["arrays"] == [{"job_id": job, "first_task": 0, "last_task": 1, "array": "0-1%2"}]
    records = wait_job(job, timeout=300)
    assert len(records) == 2, records
    elapsed = time.monotonic() - t
    probes = [json.loads((run_dir / f"tasks/{i}/driver-probe.json").read_text()) for i in (0, 1)]
    for i, probe in enumerate(probes):
        assert probe["task"] == i and probe["array_task"] == str(i) and probe["overrides"] == {"train.seed": i + 1}
        assert sorted(n["host"] for n in probe["nodes"]) == ["sn1", "sn2"]  # each saw exactly its 2 nodes
        assert probe["waited_for_others"] is True  # both clusters were up at the same time
        assert json.loads((run_dir / f"tasks/{i}/preflight.json").read_text())["ok"]
    a, b = probes
    assert a["job_id"] != b["job_id"]
    assert a["cluster_id"] != b["cluster_id"] and a["gcs_address"] != b["gcs_address"]
    assert not {n["node_id"] for n in a["nodes"]} & {n["node_id"] for n in b["nodes"]}
    assert {n["ip"] for n in a["nodes"]} == {n["ip"] for n in b["nodes"]}  # ... on the same two machines
    print(f"2-task sweep: {elapsed:.1f} s from submit to both tasks COMPLETED")


def test_more_gpus_per_node_than_the_nodes_have_fails_at_submit_naming_gres(slurm_cluster, tmp_path):
    t = time.monotonic()
    proc, out = submit(
        str(SMOKE),
        *setting("cluster.gpus_per_node", 3),
        *setting("train.gpus_per_node", 3),
        *setting("rollout.batch_size", 6),  # a valid spec: 12 samples over 6 trainer ranks
        *setting("logging.dir", str(tmp_path / "runs")),
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert out["error"] == "infrastructure"
    assert "cluster.gpus_per_node=3" in out["message"] and "gres gpu:3" in out["message"]
    assert "'batch'" in out["message"] and "at most 2" in out["message"]
    assert not (tmp_path / "runs").exists()  # refused before anything was written
    print(f"gres check refused the job in {time.monotonic() - t:.1f} s")


def test_without_fake_gpus_the_gres_gpus_without_cuda_fail_the_preflight_naming_both_nodes(slurm_cluster, tmp_path):
    """The CI nodes' GRES GPUs have no CUDA: without the cluster.fake_gpus opt-in they are broken GPU nodes."""
    proc, out = submit(
        str(SMOKE),
        "--preflight-only",
        *setting("cluster.fake_gpus", False),
        *setting("logging.dir", str(tmp_path / "runs")),
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert not pre["ok"] and pre["fake_gpus"] is False and pre["bad_nodes"] == ["sn1", "sn2"]
    failed = {(c["name"], c["node"]) for c in pre["checks"] if not c["ok"]}
    assert {("cuda", "sn1"), ("cuda", "sn2"), ("gpu_count", "sn1"), ("gpu_count", "sn2")} <= failed, failed
    assert "torch.cuda.is_available() is False" in pre["error"] and "cluster.fake_gpus: true" in pre["error"]
    assert "FAIL cuda [sn1]" in proc.stderr and "preflight FAILED" in proc.stderr
    forget_kept_ray_dirs(job)
    (rec,) = job_records(job)
    assert rec["JobState"] == "FAILED" and rec["ExitCode"].startswith("3:")


def test_a_node_whose_ray_cannot_start_fails_the_job_within_the_timeout_naming_it(slurm_cluster, tmp_path):
    timeout = 20
    wrapper = ray_wrapper(tmp_path, '[ "$(hostname)" = sn2 ]')
    t = time.monotonic()
    proc, out = submit(
        str(SMOKE),
        "--preflight-only",
        *setting("cluster.bootstrap_timeout_s", timeout),
        *setting("logging.dir", str(tmp_path / "runs")),
        env={"SLIME_RAY": str(wrapper)},
    )
    elapsed = time.monotonic() - t
    assert proc.returncode == 3, proc.stdout + proc.stderr
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert not pre["ok"] and pre["stage"] == "bootstrap" and pre["bad_nodes"] == ["sn2"]
    assert (
        "missing: sn2" in pre["error"]
        and "injected failure" in pre["error"]
        and "cluster.slurm.exclude" in pre["error"]
    )
    assert "sn2" in proc.stderr and "preflight FAILED" in proc.stderr
    forget_kept_ray_dirs(job)
    (rec,) = job_records(job)
    assert rec["JobState"] == "FAILED" and rec["ExitCode"].startswith("3:")
    # The job failed within its bootstrap timeout (plus SLURM's start/stop latency), not at some later hang.
    assert elapsed < timeout + 45, elapsed
    print(f"broken node: job failed {elapsed:.1f} s after submit (bootstrap timeout {timeout} s)")


def test_requeue_excluding_moves_the_job_off_a_node_that_fails(slurm_cluster, tmp_path):
    """The first run fails on whichever node it lands (Ray cannot start there); the job is requeued
    with that node excluded and passes on the other one."""
    wrapper = ray_wrapper(tmp_path, '[ "${SLURM_RESTART_COUNT:-0}" = 0 ]')
    t = time.monotonic()
    proc, out = submit(
        str(SMOKE),
        "--preflight-only",
        *setting("cluster.nodes", 1),
        *setting("train.nodes", 1),
        *setting("cluster.slurm.on_preflight_failure", "requeue_excluding"),
        *setting("cluster.bootstrap_timeout_s", 30),
        *setting("logging.dir", str(tmp_path / "runs")),
        env={"SLIME_RAY": str(wrapper)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir, (job,) = Path(out["run_dir"]), out["job_ids"]
    forget_kept_ray_dirs(job)
    (restart,) = [json.loads(line) for line in (run_dir / "tasks/0/restarts.jsonl").read_text().splitlines()]
    (bad,) = restart["excluded"]
    (rec,) = job_records(job)
    assert rec["JobState"] == "COMPLETED" and rec["Restarts"] == "1"
    assert rec["ExcNodeList"] == bad and rec["NodeList"] != bad
    pre = json.loads((run_dir / "tasks/0/preflight.json").read_text())
    assert pre["ok"] and [n["host"] for n in pre["nodes"]] == [rec["NodeList"]]
    print(f"requeue_excluding: failed on {bad}, passed on {rec['NodeList']}, {time.monotonic() - t:.1f} s in all")
