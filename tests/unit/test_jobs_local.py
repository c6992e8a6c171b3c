"""Local job management on real processes: PID records, state inference, cancel by signal, metrics tail.

The "bootstrap" here is a real child process whose command line names the run dir (as the real
bootstrap's does); the local launcher end to end is in tests/e2e/test_job_management.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launchers.local import jobs as local_jobs
from launchers.local.jobs import pid_alive, record_exit, record_start, run_status
from launchers.status import metrics_tail
from slime.core.errors import InfraError
from slime.core.paths import RunPaths


def make_run(tmp_path: Path, tasks: int = 1, name: str = "demo") -> RunPaths:
    root = tmp_path / f"{name}-20260101-000000-abcdef"
    paths = RunPaths.create(
        tmp_path,
        root.name,
        [("resolved.json", json.dumps({"name": name}), 0o644), ("spec.yaml", "name: demo\n", 0o644)],
    )
    for i in range(tasks):
        paths.task(i).dir.mkdir(parents=True)
    paths.write_jobs({"launcher": "local", "job_ids": [], "tasks": tasks, "preflight_only": False})
    return paths


def fake_bootstrap(paths: RunPaths, *, handle_term: bool = True) -> subprocess.Popen:
    """A process that looks like the bootstrap (run dir on its command line) and exits 143 on TERM."""
    code = (
        "import signal, sys, time\n"
        + ("signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n" if handle_term else "")
        + "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(paths.root), "--task", "0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline() == "ready\n"  # its TERM handler is in place
    return proc


def write_state(paths: RunPaths, i: int, **doc) -> None:
    paths.task(i).state.write_text(json.dumps(doc))


def test_running_task_then_pending_task_then_exit_codes(tmp_path):
    paths = make_run(tmp_path, tasks=2)
    proc = fake_bootstrap(paths)
    try:
        record_start(paths, 0, proc.pid)
        st = run_status(paths)
        assert [t.state for t in st.tasks] == ["running", "pending"]
        assert st.state == "running" and "starting" in st.tasks[0].reason  # no state.json yet
        assert "one at a time" in st.tasks[1].reason
        assert run_status(paths).state.is_active
    finally:
        proc.kill()
        proc.wait()
    record_exit(paths, 0, 0)
    write_state(paths, 0, state="succeeded")
    other = fake_bootstrap(paths)
    try:
        record_start(paths, 1, other.pid)
        assert [t.state for t in run_status(paths).tasks] == ["succeeded", "running"]
    finally:
        other.kill()
        other.wait()
    record_exit(paths, 1, 1)
    write_state(paths, 1, state="failed", error="boom: out of cheese")
    st = run_status(paths)
    assert [t.state for t in st.tasks] == ["succeeded", "failed"] and st.state == "failed"
    assert st.tasks[1].reason == "boom: out of cheese" and st.tasks[1].exit_code == "1"
    assert not run_status(paths).state.is_active


def test_a_vanished_process_without_exit_code_is_failed_not_running(tmp_path):
    paths = make_run(tmp_path)
    proc = fake_bootstrap(paths)
    record_start(paths, 0, proc.pid)
    proc.kill()
    proc.wait()
    (t,) = run_status(paths).tasks
    assert t.state == "failed" and "gone" in t.reason


def test_a_recycled_pid_that_is_not_our_process_does_not_count_as_running(tmp_path):
    paths = make_run(tmp_path)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        record_start(paths, 0, stranger.pid)
        assert pid_alive(stranger.pid) and not pid_alive(stranger.pid, str(paths.root))
        assert run_status(paths).tasks[0].state == "failed"
    finally:
        stranger.kill()
        stranger.wait()


def test_cancel_signals_the_running_bootstrap_and_status_says_cancelled(tmp_path):
    paths = make_run(tmp_path, tasks=2)
    proc = fake_bootstrap(paths)
    record_start(paths, 0, proc.pid)
    with pytest.raises(InfraError, match="only the running task"):
        local_jobs.cancel(paths, task=1)
    out = local_jobs.cancel(paths)
    assert out.cancelled == (0,) and out.pids == (proc.pid,)
    assert proc.wait(timeout=10) == 143  # it got SIGTERM and exited through its handler
    record_exit(paths, 0, 143)
    st = run_status(paths)
    assert [t.state for t in st.tasks] == ["cancelled", "cancelled"]
    assert local_jobs.cancel(paths).cancelled == ()  # nothing left to cancel


def test_runtime_state_without_pid_records_is_believed_and_checked(tmp_path):
    """Runs from a launcher that records no PIDs: state.json (pid, host) is all there is."""
    paths = make_run(tmp_path)
    import socket

    write_state(paths, 0, state="running", pid=2**22 + 12345, host=socket.gethostname())
    assert run_status(paths).tasks[0].state == "failed"  # that PID does not exist
    write_state(paths, 0, state="preempted")
    assert run_status(paths).tasks[0].state == "requeued"
    write_state(paths, 0, state="succeeded")
    assert run_status(paths).tasks[0].state == "succeeded"


def test_metrics_tail_reads_the_last_complete_line_and_the_headline_metric(tmp_path):
    paths = make_run(tmp_path)
    tp = paths.task(0)
    lines = [json.dumps({"rollout_id": -1, "step": 0, "eval/accuracy": 0.1})]
    lines += [
        json.dumps({"rollout_id": k, "step": k + 1, "rollout/reward_mean": k / 10, "pad": "x" * 500})
        for k in range(400)
    ]  # ~200 KB: only the tail is read
    tp.metrics.write_text("\n".join(lines) + "\n" + '{"rollout_id": 400, "st')  # a torn last line
    step, rid, metric = metrics_tail(tp)
    assert (step, rid) == (400, 399) and metric == {"name": "rollout/reward_mean", "value": 39.9}
    tp.metrics.write_text(json.dumps({"rollout_id": -1, "step": 0, "sft/loss": 2.5}) + "\n")
    assert metrics_tail(tp) == (0, -1, {"name": "sft/loss", "value": 2.5})
    tp.metrics.unlink()
    assert metrics_tail(tp) == (None, None, None)


def test_restarts_come_from_restarts_jsonl_with_causes(tmp_path):
    paths = make_run(tmp_path)
    paths.task(0).restarts.write_text(
        json.dumps({"cause": "preempted"}) + "\n" + json.dumps({"cause": "timeout"}) + "\n"
    )
    record_exit(paths, 0, 0)
    (t,) = run_status(paths).tasks
    assert t.restarts == 2 and t.restart_causes == ["preempted", "timeout"]


def test_log_files_are_the_node_logs(tmp_path):
    paths = make_run(tmp_path)
    tp = paths.task(0)
    tp.logs.mkdir()
    tp.node_log("vm").write_text("hello\n")
    assert local_jobs.log_files(paths, 0) == [tp.node_log("vm")]
    assert local_jobs.log_files(paths, 0, "vm") == [tp.node_log("vm")]
    assert local_jobs.log_files(paths, 0, "nope") == [tp.node_log("nope")]  # reported as missing by the CLI


def test_zombie_is_not_alive(tmp_path):
    paths = make_run(tmp_path)
    proc = fake_bootstrap(paths, handle_term=False)
    proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while pid_alive(proc.pid, str(paths.root)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(proc.pid, str(paths.root))  # a zombie (not yet reaped) has finished
    proc.wait()
