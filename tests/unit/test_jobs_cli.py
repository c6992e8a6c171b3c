"""``slime-submit status/logs/cancel/list`` on run dirs made here (local runs with real processes,
and a SLURM run dir whose job SLURM does not know, answered from the run dir's own records).

The SLURM side against the live cluster is tests/e2e/test_job_management.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launchers.local.jobs import record_exit, record_start
from slime.cli.main import main
from slime.core.paths import RunPaths

pytestmark = pytest.mark.timeout(60)


def make_run(parent: Path, name: str, launcher: str = "local", started: float = 0.0, **jobs) -> RunPaths:
    paths = RunPaths.create(
        parent, name, [("resolved.json", json.dumps({"name": name.split("-")[0]}), 0o644), ("spec.yaml", "x\n", 0o644)]
    )
    paths.task(0).logs.mkdir(parents=True)
    paths.write_jobs(
        {
            "launcher": launcher,
            "job_ids": [],
            "tasks": 1,
            "preflight_only": False,
            "submitted_at": started or time.time(),
            **jobs,
        }
    )
    return paths


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # rich tables: one row per line


def run(capsys, *argv: str) -> tuple[int, dict | str]:
    rc = main(list(argv))
    out = capsys.readouterr().out
    try:
        return rc, json.loads(out)
    except ValueError:
        return rc, out


@pytest.fixture
def runs(tmp_path):
    """Two local runs: an older finished one with metrics, a newer one whose bootstrap is running."""
    d = tmp_path / "runs"
    old = make_run(d, "alpha-20260101-000000-aaaaaa", started=time.time() - 100)
    record_exit(old, 0, 0)
    old.task(0).state.write_text(json.dumps({"state": "succeeded"}))
    old.task(0).metrics.write_text(
        "".join(json.dumps({"rollout_id": k, "step": k + 1, "rollout/reward_mean": k / 4}) + "\n" for k in range(5))
    )
    old.task(0).node_log("vm").write_text("line 1\nline 2\nline 3\n")
    new = make_run(d, "beta-20260101-000100-bbbbbb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
            "print('ready', flush=True)\ntime.sleep(60)",
            str(new.root),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    record_start(new, 0, proc.pid)
    yield d, old, new, proc
    proc.kill()
    proc.wait()


def test_list_shows_newest_first_with_state_and_last_step(runs, capsys):
    d, old, new, _ = runs
    rc, out = run(capsys, "list", "--dir", str(d), "--json")
    assert rc == 0
    assert [(r["name"], r["state"], r["last_step"], r["launcher"]) for r in out["runs"]] == [
        ("beta", "running", None, "local"),
        ("alpha", "succeeded", 5, "local"),
    ]
    assert out["runs"][1]["run_dir"] == str(old.root)
    rc, out = run(capsys, "list", "--dir", str(d), "--limit", "1", "--json")
    assert [r["name"] for r in out["runs"]] == ["beta"]
    rc, text = run(capsys, "list", "--dir", str(d))
    assert rc == 0 and "alpha-20260101-000000-aaaaaa" in text and "succeeded" in text


def test_status_of_the_newest_run_by_default_and_of_a_given_run_dir(runs, capsys, monkeypatch):
    d, old, new, _ = runs
    monkeypatch.setenv("SLIME_RUNS_DIR", str(d))
    rc, out = run(capsys, "status", "--json")
    assert rc == 0 and out["run_dir"] == str(new.root) and out["tasks"][0]["state"] == "running"
    rc, out = run(capsys, "status", str(old.root), "--json")
    (t,) = out["tasks"]
    assert (out["state"], t["step"], t["rollout_id"], t["metric"]) == (
        "succeeded",
        5,
        4,
        {"name": "rollout/reward_mean", "value": 1.0},
    )
    rc, text = run(capsys, "status", str(old.root))
    assert rc == 0 and "rollout/reward_mean=1" in text and "succeeded" in text


def test_status_shows_the_newest_diagnosis_record_of_a_task(runs, capsys):
    from slime.diagnosis.record import Diagnosis, append

    d, old, new, _ = runs
    rc, out = run(capsys, "status", str(old.root), "--json")
    assert out["tasks"][0]["diagnosis"] is None
    append(old.task(0), Diagnosis(cause="bug", title="older", fix="f", exit_code=1))
    append(old.task(0), Diagnosis(cause="stall", title="no progress in the rollout for 15s", fix="f", exit_code=124))
    rc, out = run(capsys, "status", str(old.root), "--json")
    assert rc == 0 and out["tasks"][0]["diagnosis"]["cause"] == "stall"
    rc, text = run(capsys, "status", str(old.root))
    assert "task 0 last failure: stall no progress in the rollout for 15s (slime-submit why)" in text


def test_bad_targets_and_tasks_are_usage_errors(runs, capsys, tmp_path):
    d, old, *_ = runs
    rc, out = run(capsys, "status", str(old.root), "--task", "3", "--json")
    assert rc == 2 and "tasks 0..0" in out["message"]
    rc, out = run(capsys, "status", str(tmp_path), "--json")  # a dir that is not a run dir
    assert rc == 2 and "not a run dir" in out["message"]
    rc, out = run(capsys, "status", "no such thing", "--dir", str(d), "--json")
    assert rc == 2 and "neither a run dir nor a job id" in out["message"]
    rc, out = run(capsys, "status", "--dir", str(tmp_path / "empty"), "--json")
    assert rc == 2 and "no runs under" in out["message"]
    rc, out = run(capsys, "cancel", "--dir", str(d), "--json")
    assert rc == 2 and "never guesses" in out["message"]


def test_logs_print_and_json(runs, capsys):
    d, old, *_ = runs
    rc, text = run(capsys, "logs", str(old.root), "--tail", "2")
    assert rc == 0 and text == "line 2\nline 3\n"
    rc, out = run(capsys, "logs", str(old.root), "--node", "vm", "--json")
    assert out["files"] == [
        {"path": str(old.task(0).node_log("vm")), "exists": True, "text": "line 1\nline 2\nline 3\n"}
    ]
    rc, out = run(capsys, "logs", str(old.root), "--node", "nosuchnode", "--json")
    assert rc == 0 and out["files"][0]["exists"] is False
    rc, text = run(capsys, "logs", str(old.root), "-f")  # a finished run: prints what there is and stops
    assert rc == 0 and text.endswith("line 3\n")


def test_logs_follow_streams_until_the_task_ends(runs, capsys):
    d, old, new, proc = runs
    log = new.task(0).node_log("vm")
    log.write_text("starting\n")

    def job():
        for i in range(3):
            time.sleep(0.3)
            with log.open("a") as fh:
                fh.write(f"step {i}\n")
        proc.terminate()
        record_exit(new, 0, proc.wait())

    t = threading.Thread(target=job)
    t.start()
    started = time.monotonic()
    rc = main(["logs", str(new.root), "-f", "--poll", "0.1", "--json"])
    t.join()
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rc == 0 and time.monotonic() - started < 20
    assert "".join(x.get("text", "") for x in lines) == "starting\nstep 0\nstep 1\nstep 2\n"
    assert lines[-1]["done"] is True and lines[-1]["state"] == "failed"  # killed, exit 143, no cancel record


def test_cancel_a_running_local_run(runs, capsys):
    d, old, new, proc = runs
    rc, out = run(capsys, "cancel", str(new.root), "--json")
    assert rc == 0 and out["cancelled"] == [0] and out["pids"] == [proc.pid]
    assert proc.wait(timeout=10) == 143  # SIGTERM reached it
    record_exit(new, 0, 143)
    rc, out = run(capsys, "status", str(new.root), "--json")
    assert out["state"] == "cancelled"
    rc, out = run(capsys, "cancel", str(old.root), "--json")
    assert rc == 0 and out["cancelled"] == [] and "succeeded" in out["message"]


def test_a_slurm_job_id_resolves_through_jobs_json_and_the_run_dir_answers(tmp_path, capsys):
    """Job 9876543 is unknown to SLURM (or SLURM is absent): the batch log's last line decides."""
    d = tmp_path / "runs"
    paths = make_run(d, "gamma-20260101-000200-cccccc", launcher="slurm", job_ids=["9876543"], arrays=[])
    paths.logs.mkdir()
    (paths.logs / "slurm-9876543.out").write_text(
        "slime: job 9876543 task 0 on sn1 (restart 0)\nslime: task 0 finished with exit code 0\n"
    )
    rc, out = run(capsys, "status", "9876543", "--dir", str(d), "--json")
    assert rc == 0 and out["run_dir"] == str(paths.root)
    (t,) = out["tasks"]
    assert (t["state"], t["source"], t["job_id"]) == ("succeeded", "run dir", "9876543")
    assert t["log"] == str(paths.logs / "slurm-9876543.out")
    rc, text = run(capsys, "logs", "9876543", "--dir", str(d))
    assert "finished with exit code 0" in text


def test_logs_follow_started_before_the_log_exists_prints_it_when_it_appears(runs, capsys):
    """`logs -f` right after submit: the bootstrap has not written its log yet."""
    d, old, new, proc = runs
    log = new.task(0).node_log("vm")
    assert not log.exists()

    def job():
        time.sleep(0.5)  # `logs -f` is polling by now, with no file to follow
        with log.open("a") as fh:
            fh.write("starting\n")
        for i in range(2):
            time.sleep(0.3)
            with log.open("a") as fh:
                fh.write(f"step {i}\n")
        proc.terminate()
        record_exit(new, 0, proc.wait())

    t = threading.Thread(target=job)
    t.start()
    started = time.monotonic()
    rc = main(["logs", str(new.root), "-f", "--poll", "0.1"])
    t.join()
    cap = capsys.readouterr()
    assert rc == 0 and time.monotonic() - started < 20
    assert cap.out == "starting\nstep 0\nstep 1\n"  # from the file's start, once each
    assert "task 0 is failed; stopped following" in cap.err  # and it stopped when the task ended


DAMAGED = {
    "array": "[1, 2]\n",
    "local not an object": {"local": [1]},
    "local task not an object": {"local": {"tasks": {"0": "x"}}},
    "arrays entry": {"arrays": [1]},
    "cancelled tasks": {"cancelled": {"tasks": "0"}},
    "not JSON": "[1, 2\n",
}


@pytest.mark.parametrize("damage", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_jobs_json_is_ignored_with_a_warning_naming_it(runs, capsys, damage):
    d, old, new, _ = runs
    good = old.read_jobs()
    old.jobs.write_text(damage if isinstance(damage, str) else json.dumps({**good, **damage}))
    rc = main(["status", str(old.root), "--json"])
    cap = capsys.readouterr()
    out = json.loads(cap.out)
    # the state still comes from the run dir's other records (state.json, metrics)
    assert rc == 0 and out["state"] == "succeeded" and out["last_step"] == 5
    assert str(old.jobs) in out["problem"] and str(old.jobs) in cap.err and "ignoring it" in cap.err
    rc = main(["logs", str(old.root)])
    cap = capsys.readouterr()
    assert rc == 0 and cap.out == "line 1\nline 2\nline 3\n" and str(old.jobs) in cap.err
    rc, out = run(capsys, "list", "--dir", str(d), "--json")
    assert rc == 0 and [(r["name"], r["state"]) for r in out["runs"]] == [("beta", "running"), ("alpha", "succeeded")]
    assert out["runs"][0]["problem"] is None and str(old.jobs) in out["runs"][1]["problem"]
    rc, text = run(capsys, "list", "--dir", str(d))
    assert rc == 0 and "beta" in text and "(jobs.json unreadable)" in text
    assert old.read_jobs() == {}  # what every reader sees: as if there were no jobs.json


def test_list_survives_a_slurm_run_whose_jobs_json_is_damaged_and_an_unknown_launcher(runs, capsys):
    d, old, new, _ = runs
    bad = make_run(d, "gamma-20260101-000200-cccccc", launcher="slurm")
    bad.lock.write_text(json.dumps({"launcher": "slurm"}))  # what the run falls back to without jobs.json
    bad.jobs.write_text("[1, 2]\n")
    bad.task(0).state.write_text(json.dumps({"state": "succeeded"}))
    other = make_run(d, "delta-20260101-000300-dddddd", launcher="pbs")
    rc, out = run(capsys, "list", "--dir", str(d), "--json")
    assert rc == 0
    rows = {r["run_dir"]: r for r in out["runs"]}
    assert len(rows) == 4 and rows[str(new.root)]["state"] == "running"
    assert rows[str(bad.root)]["state"] == "succeeded" and str(bad.jobs) in rows[str(bad.root)]["problem"]
    assert rows[str(other.root)]["state"] == "unknown" and "'pbs'" in rows[str(other.root)]["problem"]
    rc, out = run(capsys, "status", str(bad.root), "--json")
    assert rc == 0 and out["launcher"] == "slurm" and out["state"] == "succeeded"


def test_cancel_one_finished_task_is_not_an_error(runs, capsys):
    d, old, *_ = runs
    rc, out = run(capsys, "cancel", str(old.root), "--task", "0", "--json")
    assert rc == 0 and out["cancelled"] == []
    assert out["message"] == "nothing to cancel: task 0 already ended (succeeded)"
    rc, text = run(capsys, "cancel", str(old.root), "--task", "0")
    assert rc == 0 and "already ended (succeeded)" in text
    rc, out = run(capsys, "cancel", str(old.root), "--task", "1", "--json")  # no such task: still an error
    assert rc == 2 and "tasks 0..0" in out["message"]


def test_cancel_one_finished_slurm_task_says_it_ended(tmp_path, capsys):
    d = tmp_path / "runs"
    paths = make_run(d, "gamma-20260101-000200-cccccc", launcher="slurm", job_ids=["9876543"], arrays=[])
    paths.logs.mkdir()
    (paths.logs / "slurm-9876543.out").write_text("slime: task 0 finished with exit code 1\n")
    rc, out = run(capsys, "cancel", str(paths.root), "--task", "0", "--json")
    assert rc == 0 and out["message"] == "nothing to cancel: task 0 already ended (failed)"


def test_suggested_commands_quote_a_run_dir_with_spaces(tmp_path, capsys):
    import shlex

    d = tmp_path / "my runs"
    paths = make_run(d, "it's here")
    paths.jobs.write_text("[]\n")
    rc, text = run(capsys, "list", "--dir", str(d))
    (line,) = [x for x in text.splitlines() if "slime-submit status" in x]
    assert rc == 0 and shlex.split(line.split("`")[1]) == ["slime-submit", "status", str(paths.root)]
    # a running task without a log yet: `logs` says how to wait for it
    paths = make_run(d, "pending run")
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)", str(paths.root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        record_start(paths, 0, proc.pid)
        rc = main(["logs", str(paths.root)])
        err = capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait()
    assert rc == 0 and "no log yet for task 0 (running)" in err
    assert shlex.split(err.split("`")[1]) == ["slime-submit", "logs", "-f", str(paths.root), "--task", "0"]
