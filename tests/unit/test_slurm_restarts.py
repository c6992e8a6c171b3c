"""``launchers.slurm.restarts``: causes, budgets and the restarts record, plus the batch script's glue.

Real files in a real run-dir layout, the real module run as ``python -m`` by the real rendered script
under bash. The one fake: ``scontrol`` (and ``srun`` for the script tests) are small shell scripts on
PATH that print a job record and log their arguments, because no slurmctld runs in unit tests; the
same paths run against real SLURM in tests/e2e/test_slurm_preemption.py.
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

from launchers.node.driverproc import catches
from launchers.slurm import restarts
from slime.core.paths import RunPaths
from slime.core.rendezvous import Rendezvous
from tests.fixtures.fake_slurm import FakeSlurm
from tests.fixtures.slurm_script import compile_script, spec_text

REPO = Path(__file__).resolve().parents[2]

PREEMPT = "slurmstepd-sn1: error: *** JOB 7 ON sn1 CANCELLED AT 2026-11-30T03:23:03 DUE TO PREEMPTION ***"
REQUEUE = "slurmstepd-sn1: error: *** JOB 7 ON sn1 CANCELLED AT 2026-11-30T03:23:23 DUE TO JOB REQUEUE ***"
NODEFAIL = (
    "slurmstepd-sn2: error: *** JOB 7 ON sn2 CANCELLED AT 2026-11-30T03:23:23 DUE TO NODE FAILURE, "
    "SEE SLURMCTLD LOG FOR DETAILS ***"
)


def run_dir(tmp_path: Path, **cluster) -> RunPaths:
    paths = RunPaths(tmp_path / "run")
    tp = paths.task(0)
    tp.dir.mkdir(parents=True)
    c = {"max_requeues": 2, "max_failures": 1, "signal_grace_s": 60, **cluster}
    tp.resolved.write_text(json.dumps({"spec": {"cluster": {"launcher": "slurm", "nodes": 2, "slurm": c}}}))
    paths.logs.mkdir()
    paths.write_jobs({"launcher": "slurm", "job_ids": ["7"], "arrays": [], "tasks": 1})
    return paths


def log_with(paths: RunPaths, *runs: str) -> Path:
    """The job log: one ``slime: job`` start line per run, each followed by its text."""
    log = paths.logs / "slurm-7.out"
    log.write_text("".join(f"slime: job 7 task 0 on sn[1-2] (restart {i})\n{text}\n" for i, text in enumerate(runs)))
    return log


def test_causes_come_from_slurmstepds_line_in_the_previous_run_only():
    log = f"slime: job 7 task 0 on sn[1-2] (restart 0)\n{PREEMPT}\nslime: job 7 task 0 on sn[1-2] (restart 1)\n"
    assert restarts.cause_from_log(restarts.previous_run_log(log, 0)) == ("preempted", PREEMPT)
    log2 = log + f"{REQUEUE}\nslime: job 7 task 0 on sn[1-2] (restart 2)\n"
    assert restarts.cause_from_log(restarts.previous_run_log(log2, 0))[0] == "requeued"
    assert restarts.cause_from_log(NODEFAIL)[0] == "node_failure"
    assert restarts.cause_from_log("srun: error: sn2: task 1: Exited with exit code 3") == (None, None)
    assert restarts.previous_run_log("slime: job 7 task 0 on sn1 (restart 0)\n", 0) == ""  # a first run
    assert restarts.previous_run_log(log, 1) == ""  # another task's lines do not count


def test_usr1_cause_reads_preempt_time_then_the_time_limit():
    now = time.mktime(time.strptime("2026-11-30T03:28:03", "%Y-%m-%dT%H:%M:%S"))
    assert (
        restarts.usr1_cause({"PreemptTime": "2026-11-30T03:28:03", "EndTime": "2026-11-30T03:29:03"}, 60, now)
        == "preempted"
    )
    assert restarts.usr1_cause({"PreemptTime": "None", "EndTime": "2026-11-30T03:29:03"}, 60, now) == "time_limit"
    assert restarts.usr1_cause({"PreemptTime": "None", "EndTime": "2026-11-30T09:00:00"}, 60, now) == "requeued"
    assert restarts.usr1_cause({"EndTime": "Unknown"}, 60, now) == "requeued"


def test_budgets_are_separate_and_say_which_is_spent():
    recs = [{"cause": c} for c in ("preempted", "time_limit", "requeued", "failure")]
    b = restarts.budget(recs, {"max_requeues": 3, "max_failures": 1})
    assert (b.requeues, b.failures, b.spent()) == (3, 1, None)
    assert not b.allows("requeues") and not b.allows("failures")
    b = restarts.budget(recs + [{"cause": "node_failure"}], {"max_requeues": 3, "max_failures": 1})
    assert "cluster.slurm.max_failures=1" in b.spent() and "2 times after failures" in b.spent()
    b = restarts.budget(recs[:3], {"max_requeues": 2, "max_failures": 0})
    assert "cluster.slurm.max_requeues=2" in b.spent()
    assert restarts.kind_of("requeue_excluding") == "requeues" and restarts.kind_of("unknown") == "failures"


def test_start_records_a_restart_slurm_made_and_names_the_failed_node(tmp_path):
    paths = run_dir(tmp_path)
    tp = paths.task(0)
    tp.metrics.write_text('{"rollout_id": 4, "step": 5}\n')
    Rendezvous(tp.rendezvous, "7.0").write_node(1, host="sn2", state="failed", error="Ray on sn2 exited")
    Rendezvous(tp.rendezvous, "7.0").write_node(0, host="sn1", state="joined")
    log = log_with(paths, "srun: error: sn2: task 1: Exited with exit code 3", "")
    assert restarts.start(paths.root, 0, job_id="7", restart=1, log=log) == 0
    (rec,) = restarts.read(tp)
    assert (rec["cause"], rec["bad_nodes"], rec["restart"], rec["by"]) == ("node_failure", ["sn2"], 1, "slurm")
    assert (rec["step"], rec["rollout_id"], rec["budget"], rec["nodes"]) == (5, 4, "failures", "sn[1-2]")
    # the same restart seen again (the helper rerun) is not recorded twice
    assert restarts.start(paths.root, 0, job_id="7", restart=1, log=log) == 0
    assert len(restarts.read(tp)) == 1


def test_start_refuses_once_a_budget_is_spent_and_says_why_in_state_json(tmp_path, capsys):
    paths = run_dir(tmp_path, max_requeues=1)
    tp = paths.task(0)
    restarts.append(tp, {"job_id": "7", "restart": 1, "cause": "preempted"})
    log = log_with(paths, "", REQUEUE, "")
    assert restarts.start(paths.root, 0, job_id="7", restart=2, log=log) == restarts.ExitCode.INFRA
    assert [r["cause"] for r in restarts.read(tp)] == ["preempted", "requeued"]
    state = json.loads(tp.state.read_text())
    assert state["state"] == "failed" and "cluster.slurm.max_requeues=1" in state["error"]
    assert "will not run again" in capsys.readouterr().out
    # a restart without any reason in the log (batch host died): unknown, counted as a failure
    paths = run_dir(tmp_path / "b", max_failures=0)
    assert restarts.start(paths.root, 0, job_id="7", restart=1, log=log_with(paths, "", "")) == 3
    (rec,) = restarts.read(paths.task(0))
    assert rec["cause"] == "unknown" and "batch host" in rec["detail"]


def test_a_run_dir_written_before_spec_v2_still_reads_its_budgets_from_the_flat_cluster(tmp_path, capsys):
    paths = run_dir(tmp_path)
    tp = paths.task(0)
    tp.resolved.write_text(json.dumps({"spec": {"cluster": {"max_requeues": 0, "max_failures": 0}}}))
    log = log_with(paths, "", PREEMPT, "")
    assert restarts.start(paths.root, 0, job_id="7", restart=1, log=log) == restarts.ExitCode.INFRA
    assert "cluster.slurm.max_requeues=0" in json.loads(tp.state.read_text())["error"]


def test_a_torn_last_line_is_skipped_and_repaired_on_append(tmp_path):
    tp = run_dir(tmp_path).task(0)
    tp.restarts.write_text('{"cause": "preempted", "restart": 1}\n{"cause": "requ')
    assert [r["cause"] for r in restarts.read(tp)] == ["preempted"]
    restarts.append(tp, {"cause": "failure", "restart": 2})
    assert [r["cause"] for r in restarts.read(tp)] == ["preempted", "failure"]


# ----------------------------------------------------------------------------- after (fake scontrol)
def fake_scontrol(tmp_path: Path, record: str) -> FakeSlurm:
    fake = FakeSlurm(tmp_path)
    fake.add_scontrol(record)
    return fake


def after(paths: RunPaths, tmp_path: Path, record: str, *args: str, restart: int = 0) -> tuple[int, str, list[str]]:
    fake = fake_scontrol(tmp_path, record)
    env = fake.env(SLURM_JOB_ID="7", SLURM_RESTART_COUNT=str(restart), SLURM_JOB_NODELIST="sn[1-2]")
    proc = subprocess.run(
        [sys.executable, "-m", "launchers.slurm.restarts", "after", str(paths.root), "--task", "0", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout + proc.stderr, fake.calls()


RUNNING = "JobId=7 JobState=RUNNING Restarts=0 PreemptTime=None EndTime=2099-01-01T00:00:00 TimeLimit=UNLIMITED"


def test_after_a_checkpoint_stop_on_preemption_the_job_requeues_itself(tmp_path):
    paths = run_dir(tmp_path)
    tp = paths.task(0)
    tp.state.write_text(json.dumps({"state": "preempted", "checkpoint": "/ck/8"}))
    rec = RUNNING.replace("PreemptTime=None", "PreemptTime=2026-11-30T03:41:41")
    rc, out, calls = after(paths, tmp_path, rec, "--rc", "75", "--signal", "USR1")
    assert rc == 75, out
    assert calls == ["show job -o 7", "requeue 7"]
    (r,) = restarts.read(tp)
    assert (r["cause"], r["restart"], r["by"], r["checkpoint"], r["nodes"]) == (
        "preempted",
        1,
        "slime",
        "/ck/8",
        "sn[1-2]",
    )
    assert "requeued job 7 (preempted" in out and "requeues 1/2" in out


def test_after_a_failure_within_max_failures_requeues_and_names_the_node(tmp_path):
    paths = run_dir(tmp_path)
    tp = paths.task(0)
    Rendezvous(tp.rendezvous, "7.0").write_node(1, host="sn2", state="lost", error="Ray on sn2 exited")
    rc, out, calls = after(paths, tmp_path, RUNNING, "--rc", "3")
    assert calls[-1] == "requeue 7", out
    (r,) = restarts.read(tp)
    assert (r["cause"], r["bad_nodes"], r["budget"]) == ("node_failure", ["sn2"], "failures")
    # the next failure is over cluster.slurm.max_failures=1: no requeue, the job ends FAILED
    rc, out, calls = after(paths, tmp_path / "x", RUNNING.replace("Restarts=0", "Restarts=1"), "--rc", "1", restart=1)
    assert calls == ["show job -o 7"] and "cluster.slurm.max_failures allows no more" in out
    assert len(restarts.read(tp)) == 1


def test_a_stall_is_retried_once_by_default_then_the_job_fails(tmp_path):
    paths = run_dir(tmp_path, max_failures=0)  # stalls have their own budget: cluster.slurm.max_stalls
    tp = paths.task(0)
    rc, out, calls = after(paths, tmp_path, RUNNING, "--rc", "124")
    assert rc == 124 and calls[-1] == "requeue 7", out
    (r,) = restarts.read(tp)
    assert (r["cause"], r["budget"]) == ("stall", "stalls") and "cluster.stall_timeout_s" in r["detail"]
    assert "stalls 1/1 (cluster.slurm.max_stalls)" in out
    rc, out, calls = after(paths, tmp_path / "x", RUNNING.replace("Restarts=0", "Restarts=1"), "--rc", "124", restart=1)
    assert calls == ["show job -o 7"] and "cluster.slurm.max_stalls allows no more" in out
    assert len(restarts.read(tp)) == 1
    assert restarts.budget([{"cause": "stall"}] * 2, {"max_stalls": 1}).spent().endswith("cluster.slurm.max_stalls=1")
    assert restarts.budget([{"cause": "stall"}], {"max_stalls": 2}).allows("stalls")


def test_after_does_nothing_when_slurm_is_ending_or_requeueing_the_job(tmp_path):
    paths = run_dir(tmp_path)
    for record in (RUNNING.replace("RUNNING", "COMPLETING"), RUNNING.replace("Restarts=0", "Restarts=1")):
        rc, out, calls = after(paths, tmp_path, record, "--rc", "75", "--signal", "TERM")
        assert rc == 75 and calls[-1] == "show job -o 7" and "nothing to do" in out
    assert restarts.read(paths.task(0)) == []


def test_after_a_stop_with_the_requeue_budget_spent_the_task_stays_stopped(tmp_path):
    paths = run_dir(tmp_path, max_requeues=0)
    tp = paths.task(0)
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 50))
    rc, out, calls = after(
        paths, tmp_path, RUNNING.replace("2099-01-01T00:00:00", end), "--rc", "75", "--signal", "USR1"
    )
    assert calls == ["show job -o 7"] and restarts.read(tp) == []
    state = json.loads(tp.state.read_text())
    assert (
        state["state"] == "failed" and "time_limit" in state["error"] and "cluster.slurm.max_requeues" in state["error"]
    )


# ----------------------------------------------------------------------------- the batch script's glue
def failed_report(paths: RunPaths, instance: str, stage: str = "bootstrap", hosts: tuple[str, ...] = ("sn2",)) -> None:
    """The report the head's bootstrap writes when Ray did not come up on ``hosts`` (or the preflight failed)."""
    report = {"ok": False, "stage": stage, "instance": instance, "bad_nodes": list(hosts), "error": "missing: sn2"}
    paths.task(0).preflight_json.write_text(json.dumps(report))


def test_after_a_bootstrap_failure_naming_a_node_requeue_excluding_moves_the_job_off_it(tmp_path):
    """cluster.slurm.on_preflight_failure: requeue_excluding is decided here, after the step: the node side
    only recorded the failure (report, rendezvous records) and exited 3."""
    paths = run_dir(tmp_path, on_preflight_failure="requeue_excluding")
    failed_report(paths, "7.0")
    rc, out, calls = after(paths, tmp_path, RUNNING, "--rc", "3")
    assert rc == 3, out
    assert calls == ["show job -o 7", "show job 7 -o", "requeue 7", "update JobId=7 ExcNodeList=sn2"]
    (r,) = restarts.read(paths.task(0))
    assert (r["cause"], r["budget"], r["stage"], r["excluded"], r["bad_nodes"], r["restart"], r["by"]) == (
        "requeue_excluding",
        "requeues",
        "bootstrap",
        ["sn2"],
        ["sn2"],
        1,
        "slime",
    )
    assert r["detail"] == "missing: sn2" and "requeued job 7 excluding sn2" in out


def test_requeue_excluding_spends_max_requeues_then_the_failure_budget_decides(tmp_path):
    paths = run_dir(tmp_path, on_preflight_failure="requeue_excluding", max_requeues=0, max_failures=1)
    failed_report(paths, "7.0", stage="preflight")
    rc, out, calls = after(paths, tmp_path, RUNNING, "--rc", "3")
    assert "not requeueing excluding sn2: cluster.slurm.max_requeues allows no more" in out
    assert calls == ["show job -o 7", "requeue 7"]  # a plain requeue: within cluster.slurm.max_failures
    (r,) = restarts.read(paths.task(0))
    assert (r["cause"], r["bad_nodes"], r["budget"]) == ("node_failure", ["sn2"], "failures")


def test_a_failed_preflight_is_a_plain_failure_without_requeue_excluding_or_from_an_earlier_run(tmp_path):
    paths = run_dir(tmp_path / "a")  # on_preflight_failure: fail (the default)
    failed_report(paths, "7.0")
    rc, out, calls = after(paths, tmp_path / "a", RUNNING, "--rc", "3")
    assert calls == ["show job -o 7", "requeue 7"]
    assert [(r["cause"], r["bad_nodes"]) for r in restarts.read(paths.task(0))] == [("node_failure", ["sn2"])]
    paths = run_dir(tmp_path / "b", on_preflight_failure="requeue_excluding")
    failed_report(paths, "7.0")  # the report of the run before this restart (7.1)
    rc, out, calls = after(paths, tmp_path / "b", RUNNING.replace("Restarts=0", "Restarts=1"), "--rc", "1", restart=1)
    assert calls == ["show job -o 7", "requeue 7"] and "excluding" not in out
    assert [r["cause"] for r in restarts.read(paths.task(0))] == ["failure"]


def test_the_script_turns_usr1_into_a_stop_file_and_requeues_after_exit_75(tmp_path):
    """USR1 reaches the batch shell: no signal goes to srun (slurmstepd would hand it to every process of
    the step, Ray's included); the stop file for this run appears; the step's 75 leads to a self-requeue."""
    paths = run_dir(tmp_path)
    script = compile_script(spec_text(logdir=str(tmp_path / "logs")), python=sys.executable)
    script = script.replace(str(tmp_path / "logs" / "run-1"), str(paths.root))
    fake = fake_scontrol(tmp_path, RUNNING)
    fake.add(
        "srun",
        "#!/bin/bash\ntrap 'echo USR1 >> \"$SHIM/srun-signals\"' USR1\n"
        'while [ ! -e "$SHIM/go" ]; do sleep 0.05; done\nexit 75\n',
    )
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = fake.env(
        SHIM=str(tmp_path),
        SLURM_JOB_ID="7",
        SLURM_RESTART_COUNT="0",
        SLURM_JOB_NODELIST="sn[1-2]",
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.Popen(
        ["bash", str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    stop = paths.task(0).rendezvous / "stop-7.0"
    first = proc.stdout.readline()  # printed after the traps are set (a USR1 before them would kill bash)
    assert first.startswith("slime: job 7 task 0"), first
    proc.send_signal(signal.SIGUSR1)
    end = time.monotonic() + 20
    while not stop.exists() and time.monotonic() < end:
        time.sleep(0.05)
    assert stop.exists()
    (tmp_path / "go").touch()
    out, _ = proc.communicate(timeout=60)
    out = first + out
    assert proc.returncode == 75, out
    assert not (tmp_path / "srun-signals").exists()
    assert "slime: task 0 finished with exit code 75" in out and "requeued job 7 (requeued" in out
    assert fake.calls()[-1] == "requeue 7"
    assert [r["cause"] for r in restarts.read(paths.task(0))] == ["requeued"]  # USR1 far from any time limit


@pytest.mark.parametrize(("head", "srun", "expected"), [(75, 143, 75), (3, 143, 3), (None, 143, 143), (0, 3, 0)])
def test_the_jobs_exit_code_is_the_heads_own_not_sruns_highest(tmp_path, head, srun, expected):
    """srun exits with the highest code of its tasks: a worker node it stopped after the head ended can say 143
    over the head's 3 (a flake seen under load on the real cluster) or over a checkpoint stop's 75, which must
    still requeue. The head records its own code in the rendezvous (``done-<job>.<restart>``); without that
    record (the head itself was killed) srun's code stands."""
    paths = run_dir(tmp_path)
    script = compile_script(spec_text(logdir=str(tmp_path / "logs")), python=sys.executable)
    path = tmp_path / "job.sbatch"
    path.write_text(script.replace(str(tmp_path / "logs" / "run-1"), str(paths.root)))
    if head is not None:
        Rendezvous(paths.task(0).rendezvous, "7.0").mark_done(head)
    Rendezvous(paths.task(0).rendezvous, "6.0").mark_done(0)  # an earlier job's record is not this run's
    fake = fake_scontrol(tmp_path, RUNNING)
    fake.add("srun", f"#!/bin/sh\nexit {srun}\n")
    env = fake.env(SHIM=str(tmp_path), SLURM_JOB_ID="7", SLURM_RESTART_COUNT="0", PYTHONPATH=str(REPO))
    proc = subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert f"slime: task 0 finished with exit code {expected}" in proc.stdout
    if expected == 75:  # the checkpoint stop is seen as one: the job requeues itself
        assert fake.calls()[-1] == "requeue 7" and [r["cause"] for r in restarts.read(paths.task(0))] == ["requeued"]
    assert restarts.step_rc(paths.root, 0, rc=srun, instance="7.0") == expected


def test_the_script_refuses_to_start_when_the_budget_is_spent(tmp_path):
    paths = run_dir(tmp_path, max_requeues=0)
    restarts.append(paths.task(0), {"job_id": "7", "restart": 1, "cause": "preempted"})
    script = compile_script(spec_text(logdir=str(tmp_path / "logs")), python=sys.executable)
    path = tmp_path / "job.sbatch"
    path.write_text(script.replace(str(tmp_path / "logs" / "run-1"), str(paths.root)))
    fake = FakeSlurm(tmp_path)
    fake.add("srun", '#!/bin/sh\ntouch "$SHIM/srun-ran"\n')
    env = fake.env(SHIM=str(tmp_path), SLURM_JOB_ID="7", SLURM_RESTART_COUNT="1", PYTHONPATH=str(REPO))
    proc = subprocess.run(["bash", str(path)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "will not run again" in proc.stdout and "slime: task 0 finished with exit code 3" in proc.stdout
    assert not (tmp_path / "srun-ran").exists()


# ----------------------------------------------------------------------------- bootstrap helpers
def test_catches_reads_the_signal_disposition_of_a_real_process():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\nprint('ign', flush=True)\n"
            "sys.stdin.readline()\nsignal.signal(signal.SIGUSR1, lambda *a: None)\n"
            "print('caught', flush=True)\ntime.sleep(30)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ign\n"
        assert catches(child.pid, signal.SIGUSR1) is False
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "caught\n"
        assert catches(child.pid, signal.SIGUSR1) is True
    finally:
        child.kill()
        child.wait()
    assert catches(child.pid, signal.SIGUSR1) is None  # gone


@pytest.mark.parametrize("rc,expected", [(0, True), (3, False)])
def test_done_rc_distinguishes_a_clean_end(tmp_path, rc, expected):
    rdv = Rendezvous(tmp_path, "7.0")
    assert rdv.done_rc() is None and not rdv.stop_requested()
    rdv.mark_done(rc)
    assert (rdv.done_rc() == 0) is expected
    rdv.stop_file.touch()
    assert rdv.stop_requested() and not Rendezvous(tmp_path, "7.1").stop_requested()


def test_a_stop_request_reaches_the_driver_once_after_it_installed_its_handler(tmp_path):
    """The request is there before the driver handles USR1 (its default action would kill it): it arrives
    once the handler exists, exactly once, and a driver killed by a signal is reported as 128+N."""
    import threading

    from launchers.node.driverproc import run_driver_process

    code = (
        "import signal, sys, time\ntime.sleep(1.5)\ngot = []\n"
        "signal.signal(signal.SIGUSR1, lambda *a: got.append(1))\n"
        "end = time.monotonic() + 4\nwhile time.monotonic() < end: time.sleep(0.05)\n"
        f"open({str(tmp_path / 'got')!r}, 'w').write(str(len(got)))\nsys.exit(75 if got else 0)"
    )
    said: list[str] = []
    rc = run_driver_process(
        [sys.executable, "-c", code],
        dict(os.environ),
        stop=threading.Event(),
        stop_requested=lambda: True,
        grace_s=5,
        say=said.append,
    )
    assert rc == 75 and (tmp_path / "got").read_text() == "1" and "stop requested" in said[0]
    rc = run_driver_process(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        dict(os.environ),
        stop=threading.Event(),
        stop_requested=lambda: False,
        grace_s=5,
        say=said.append,
    )
    assert rc == 128 + signal.SIGKILL
