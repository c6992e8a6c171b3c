"""Preemption → checkpoint → requeue → resume, and node loss, on the real 2-node SLURM cluster.

Real slurmctld/slurmd (ci/slurm-cluster.sh: the ``urgent`` partition preempts ``batch`` with grace
time and ``preempt_send_user_signal``), real Ray on sn1 + sn2, the real runtime (``slime.train``,
torch trainer ranks on both nodes, built-in engines) training a shortened copy of
``specs/smoke-slurm.yaml`` (1 fake GPU per node instead of 2 and more, shorter rollouts, a checkpoint
every 2 rollouts, W&B offline) that the test writes. Nothing is faked; the one test-only hook is
``SLIME_TEST_CHECKPOINT_PAUSE`` (``slime.runtime.checkpoint``), which holds one save open between
writing the temp dir and renaming it, so that SIGKILL lands inside the save window every time.

Steps are chosen at random from a seed printed by the test (``SLIME_PREEMPT_SEED`` reproduces a
run); every wait is bounded. Node loss is tested twice: under ``tests.fixtures.tinydriver`` (the launcher's
promise alone) and under the real runtime (``slime.runtime.failures.lost_node_error`` names the node,
exit 3, then the job is requeued within ``cluster.slurm.max_failures`` and resumes exactly). Two jobs on the
same nodes never share a Ray cluster: asserted by
``test_two_task_sweep_is_one_array_of_two_private_ray_clusters_on_the_same_nodes`` in
tests/e2e/test_slurm_e2e.py (two array tasks = two SLURM jobs on sn1 + sn2 at the same time).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm_cluster import job_records, run_sbatch, wait_job
from tests.fixtures.tinydriver import driver_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(420)]

REPO = Path(__file__).resolve().parents[2]
ROLLOUTS = 18
CHECKPOINT_INTERVAL = 2


def smoke_copy(tmp_path: Path, name: str, *, num_rollouts: int = ROLLOUTS, **cluster: object) -> Path:
    """specs/smoke-slurm.yaml, shortened, with frequent checkpoints and W&B offline."""
    text = (REPO / "specs" / "smoke-slurm.yaml").read_text()
    swaps = [
        ("name: smoke-slurm", f"name: {name}"),
        ("  gpus_per_node: 2\n", "  gpus_per_node: 1\n"),
        ("  cpus_per_node: 2 ", "  cpus_per_node: 1 "),
        ("num_rollouts: 2", f"num_rollouts: {num_rollouts}"),
        ("  seed: 1\n", f"  seed: 1\n  checkpoint: {{interval: {CHECKPOINT_INTERVAL}, keep: 2, save_hf: false}}\n"),
        ("data/arith/train.jsonl", str(REPO / "specs" / "data" / "arith" / "train.jsonl")),
        ("dir: ../runs", f"dir: {tmp_path / 'runs'}"),
        ("mode: disabled", "mode: offline"),
        (  # the SLURM settings (cluster.slurm)
            "    signal_grace_s: 60\n",
            "    signal_grace_s: 60\n" + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in cluster.items()),
        ),
    ]
    for old, new in swaps:
        assert old in text, f"specs/smoke-slurm.yaml changed: {old!r} not found"
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def submit(spec: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", str(spec), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    return Path(out["run_dir"]), out["job_ids"][0]


def rollouts(task: Path) -> list[int]:
    try:
        lines = (task / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line)["rollout_id"])
        except (ValueError, KeyError):
            pass  # a line being written
    return out


def wait_for(what: str, pred, log: Path, timeout: float = 150.0, poll: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            tail = log.read_text()[-4000:] if log.exists() else "(no log)"
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; job log tail:\n{tail}")
        time.sleep(poll)


def resumed_at(log: Path, restart: int) -> int | None:
    """The rollout run ``restart`` of the job resumed from (its "resumed from" line), once it did."""
    text = log.read_text() if log.exists() else ""
    _, sep, after = text.partition(f"slime: restart {restart} of task 0 ")
    m = re.search(r"^resumed from \S+ \(rollout (\d+),", after, re.M) if sep else None
    return int(m.group(1)) if m else None


def restart_count(job: str) -> int:
    (rec,) = job_records(job)
    return int(rec.get("Restarts", "0"))


def host_pids(pred) -> list[int]:
    """PIDs (as this, the root, namespace sees them) of processes on any node matching ``pred(cmdline, environ)``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if pred(cmd, env):
            out.append(int(entry.name))
    return out


def status(run_dir: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "slime.cli.main", "status", str(run_dir), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


# Four runs of one job, each a 2-node Ray start plus a runtime start: 270 s on a quiet machine, ~430 s on CI
# beside the learning tests (each start took 50-90 s there)
@pytest.mark.timeout(900)
def test_preempted_requeued_and_killed_in_a_save_the_run_still_has_every_step_once(slurm_cluster, tmp_path):
    seed = int(os.environ.get("SLIME_PREEMPT_SEED", random.SystemRandom().randrange(10**6)))
    rng = random.Random(seed)
    k1 = rng.randint(2, 5)  # preempted by an urgent job once rollout k1 was logged
    d2 = rng.randint(2, 4)  # scontrol requeue d2 rollouts after the second run resumed
    k3 = rng.choice([11, 13, 15])  # kill -9 inside the save of rollout k3 (odd: saved by interval 2)
    print(
        f"SLIME_PREEMPT_SEED={seed}: preempt after rollout {k1}, requeue {d2} rollouts after the resume, "
        f"kill -9 in the save of rollout {k3}"
    )
    spec = smoke_copy(tmp_path, "preempt", max_requeues=2, max_failures=1)
    t0 = time.monotonic()
    run_dir, job = submit(spec, env={"SLIME_TEST_CHECKPOINT_PAUSE": f"{k3}:90"})
    task, log = run_dir / "tasks" / "0", run_dir / "logs" / f"slurm-{job}.out"
    timings = {}

    # 1. an urgent job needs both nodes' GPUs: SLURM preempts ours with grace time; it checkpoints, requeues itself
    wait_for(f"rollout {k1}", lambda: max(rollouts(task), default=-2) >= k1, log)
    urgent = run_sbatch(["-p", "urgent", "-N2", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 1"])
    wait_for("the preemption's restart", lambda: restart_count(job) >= 1, log, 60)
    timings["preempted"] = time.monotonic() - t0
    wait_job(urgent, timeout=120)

    # 2. scontrol requeue: TERM to every process of the job; the next run resumes from the last periodic checkpoint
    wait_for("the second run to resume", lambda: resumed_at(log, 1) is not None, log)
    resumed = resumed_at(log, 1)
    k2 = min(resumed + d2, k3 - 4)
    wait_for(f"rollout {k2}", lambda: max(rollouts(task), default=-2) >= k2, log)
    subprocess.run(["scontrol", "requeue", job], check=True, timeout=30)
    timings["requeued"] = time.monotonic() - t0
    print(f"second run resumed after rollout {resumed}; requeued after rollout {k2}")

    # 3. SIGKILL the driver while it saves rollout k3 (temp dir written, not yet renamed)
    marker = task / "checkpoints" / f".test-pause-{k3}"
    wait_for(f"the save of rollout {k3}", marker.exists, log)
    tmp_dirs = list((task / "checkpoints").glob(f".tmp-{k3}-*"))
    assert tmp_dirs and (tmp_dirs[0] / "state.json").exists() and not (task / "checkpoints" / str(k3)).exists()
    (driver,) = host_pids(lambda cmd, env: "-m slime.train" in cmd and str(run_dir) in cmd)
    os.kill(driver, signal.SIGKILL)
    timings["killed"] = time.monotonic() - t0

    (rec,) = wait_job(job, timeout=360)
    elapsed = time.monotonic() - t0
    text = log.read_text()
    assert rec["JobState"] == "COMPLETED" and rec["Restarts"] == "3", text[-4000:]

    # every rollout exactly once, in order, though three runs each began again from a checkpoint
    assert rollouts(task) == list(range(-1, ROLLOUTS)), text[-4000:]
    state = json.loads((task / "state.json").read_text())
    assert state["state"] == "succeeded" and state["checkpoint"].endswith(f"/checkpoints/{ROLLOUTS - 1}")
    # the save killed half-way was never used: the run after it resumed from the checkpoint before it
    previous = task / "checkpoints" / str(k3 - 2)
    assert f"resumed from {previous} (rollout {k3 - 2}," in text
    assert not list((task / "checkpoints").glob(".tmp-*"))
    # one W&B run across the four runs of the job
    run_id = (task / "wandb_run_id").read_text().strip()
    offline = sorted(p.name for p in (task / "wandb" / "wandb").glob("offline-run-*"))
    assert len(offline) == 4 and all(name.endswith(f"-{run_id}") for name in offline), offline

    recs = [json.loads(line) for line in (task / "restarts.jsonl").read_text().splitlines()]
    assert [(r["restart"], r["cause"], r["budget"]) for r in recs] == [
        (1, "preempted", "requeues"),
        (2, "requeued", "requeues"),
        (3, "failure", "failures"),
    ]
    assert (
        recs[0]["by"] == "slime"
        and recs[0]["rollout_id"] >= k1
        and recs[0]["checkpoint"].endswith(f"/checkpoints/{recs[0]['rollout_id']}")
    )  # graceful: saved where it stopped
    assert recs[1]["by"] == "slurm" and "DUE TO JOB REQUEUE" in recs[1]["detail"] and recs[1]["rollout_id"] >= k2
    assert recs[1]["rollout_id"] < k3 and recs[2]["rollout_id"] >= k3  # each event hit the run it was meant for
    assert recs[2]["detail"] == "exit code 137" and recs[2]["checkpoint"] == str(previous)
    st = status(run_dir)
    (t,) = st["tasks"]
    assert (st["state"], t["restarts"], t["restart_causes"], t["step"]) == (
        "succeeded",
        3,
        ["preempted", "requeued", "failure"],
        ROLLOUTS,
    )
    print(
        f"preemption e2e: {elapsed:.1f} s for 4 runs of the job; events at "
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
    )


def test_a_node_lost_while_the_job_runs_fails_it_in_bounded_time_naming_the_node(slurm_cluster, tmp_path):
    """sn2's Ray (``ray start``, raylet, workers) is SIGKILLed while the job's driver runs, as when the node
    dies under it. With cluster.slurm.max_failures: 0 the job must end FAILED, quickly, and say which node
    failed. The driver is ``tests.fixtures.tinydriver`` (it just holds the job's Ray cluster): what is under test is the
    launcher's promise that a lost node ends the job whatever the driver does (srun --kill-on-bad-exit
    stops the step once sn2's bootstrap reports the loss), and how the loss is recorded and shown."""
    spec = smoke_copy(tmp_path, "nodeloss", max_failures=0)
    run_dir, job = submit(spec, env=driver_env(SLIME_TINYDRIVER_SLEEP="300"))
    task, log = run_dir / "tasks" / "0", run_dir / "logs" / f"slurm-{job}.out"
    wait_for("the driver", (task / "driver-probe.json").exists, log)
    marker = f"SLIME_RAY_NODE=/tmp/slime-ray/{job}-0-1\0".encode()
    victims = host_pids(lambda cmd, env: marker in env)
    assert victims, "no Ray process of this job found on sn2"
    t = time.monotonic()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (rec,) = wait_job(job, states=("FAILED",), timeout=120)
    elapsed = time.monotonic() - t
    text = log.read_text()
    assert elapsed < 60, f"the job took {elapsed:.0f} s to fail after the node was lost"
    assert "slime: task 0 stopped (node_failure" in text and "failure on sn2" in text, text[-4000:]
    assert not (task / "restarts.jsonl").exists()  # max_failures: 0 → no restart
    (t0,) = status(run_dir)["tasks"]
    assert t0["state"] == "failed" and "node failure on sn2" in t0["reason"], t0
    nodes = {
        json.loads(p.read_text())["host"]: json.loads(p.read_text())
        for p in (task / "rendezvous").glob(f"node-{job}.0-*.json")
    }
    assert nodes["sn2"]["state"] == "failed" and "Ray on sn2 exited unexpectedly" in nodes["sn2"]["error"]
    for d in Path("/tmp/slime-ray").glob(f"{job}-*"):  # kept for debugging a failure; this one was on purpose
        subprocess.run(["rm", "-rf", str(d)], check=False)
    print(f"node loss: job FAILED {elapsed:.1f} s after sn2's Ray was killed; reason: {t0['reason'][:200]}")


def test_a_node_lost_during_real_training_is_recorded_in_bounded_time_and_the_requeued_run_finishes(
    slurm_cluster, tmp_path
):
    """The real runtime (``slime.train``: a trainer rank and an engine on each node) loses sn2 mid-training:
    every process of this job's Ray node on sn2 (found through the temp dir sn2's bootstrap recorded in the
    rendezvous dir, never by name) is SIGKILLed once rollout k was logged. With cluster.slurm.max_failures: 1 the
    failure must be recorded naming sn2 within 60 s, the job requeued once, and the second run must resume
    from the last checkpoint and log every rollout exactly once. Stand-in: a node's death is its Ray dying
    (slurmd on sn2 stays up, as it must for the rest of the suite)."""
    seed = int(os.environ.get("SLIME_PREEMPT_SEED", random.SystemRandom().randrange(10**6)))
    total = 10
    k = random.Random(seed).randint(2, 5)
    print(f"SLIME_PREEMPT_SEED={seed}: sn2 lost after rollout {k} of {total}")
    spec = smoke_copy(tmp_path, "nodeloss-train", num_rollouts=total, max_failures=1)
    run_dir, job = submit(spec)
    task, log = run_dir / "tasks" / "0", run_dir / "logs" / f"slurm-{job}.out"
    wait_for(f"rollout {k}", lambda: max(rollouts(task), default=-2) >= k, log, timeout=240)
    sn2 = json.loads((task / "rendezvous" / f"node-{job}.0-1.json").read_text())
    assert sn2["host"] == "sn2" and sn2["state"] == "joined", sn2
    marker = f"SLIME_RAY_NODE={sn2['temp_dir']}\0".encode()
    victims = host_pids(lambda cmd, env: marker in env or sn2["temp_dir"] in cmd)
    raylets = [p for p in victims if "raylet" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")]
    assert raylets, f"this job's raylet on sn2 was not found among {victims}"
    t = time.monotonic()
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    at_kill = max(rollouts(task))

    def recorded():
        return (
            [json.loads(x) for x in (task / "restarts.jsonl").read_text().splitlines()]
            if (task / "restarts.jsonl").exists()
            else None
        )

    (rec,) = wait_for("the failure's restart record", recorded, log, timeout=90)
    recorded_s = time.monotonic() - t
    text = log.read_text()
    assert recorded_s < 60, f"the failure was recorded {recorded_s:.0f} s after sn2 was lost"
    assert (rec["cause"], rec["budget"], rec["bad_nodes"], rec["restart"]) == (
        "node_failure",
        "failures",
        ["sn2"],
        1,
    ), (rec, text[-4000:])
    assert at_kill <= rec["rollout_id"] <= at_kill + 1, rec  # the rollout in flight may have been logged
    first_run = text.partition("slime: restart 1 of task 0 ")[0]
    assert "Traceback" not in first_run and "internal error" not in first_run, first_run[-6000:]
    # the runtime itself names the node (exit 3, so the failure budget applies), not a gloo error as "a bug"
    assert re.search(r"^error: lost sn2 \(10\.[\d.]+\) during training \(", first_run, re.M), first_run[-6000:]
    assert "driver exited with code 3" in first_run, first_run[-6000:]

    (job_rec,) = wait_job(job, timeout=300)
    elapsed = time.monotonic() - t
    text = log.read_text()
    assert job_rec["Restarts"] == "1", text[-4000:]
    ck = rec["checkpoint"]
    # checkpoints are saved after rollouts 1, 3, 5, ... (interval 2), each after its metrics line: the newest
    # finished one is the last scheduled at or before the last logged rollout, or the one before it when
    # the kill landed during that rollout's save (a partial save must never be the one resumed from)
    scheduled = [r for r in range(rec["rollout_id"] + 1) if (r + 1) % CHECKPOINT_INTERVAL == 0]
    allowed = scheduled[-2:] if scheduled and scheduled[-1] == rec["rollout_id"] else scheduled[-1:]
    assert ck and int(Path(ck).name) in allowed, (rec, allowed)
    assert resumed_at(log, 1) == int(Path(ck).name), text[-4000:]
    assert rollouts(task) == list(range(-1, total)), text[-4000:]  # every rollout once, in order
    st = status(run_dir)
    (t0,) = st["tasks"]
    assert (st["state"], t0["restarts"], t0["restart_causes"], t0["step"]) == (
        "succeeded",
        1,
        ["node_failure: sn2"],
        total,
    )
    for d in Path("/tmp/slime-ray").glob(f"{job}-*"):  # Ray dirs kept for debugging the first run's failure
        subprocess.run(["rm", "-rf", str(d)], check=False)
    print(re.search(r"^error: lost .*$", text, re.M).group(0)[:400])
    print(
        f"node loss in training: restart recorded {recorded_s:.1f} s after sn2's Ray was killed "
        f"(at rollout {at_kill}); job COMPLETED {elapsed:.1f} s after the kill"
    )
