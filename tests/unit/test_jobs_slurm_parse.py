"""Parsing real scontrol/squeue/sacct -c output (captured from the CI cluster, see
tests/fixtures/slurm_outputs/README.md) into per-task states of a run dir.

The SLURM commands themselves are exercised against the live cluster in
tests/e2e/test_job_management.py; here the captured text is fed to the same functions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launchers.slurm.jobs import (
    dropped_tasks,
    log_path,
    parse_sacct,
    parse_scontrol,
    parse_squeue,
    plain_job_id,
    task_from_run_dir,
    task_layout,
    tasks_from_jobcomp,
    tasks_from_records,
)
from slime.core.paths import RunPaths

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_outputs"


def fixture(rel: str, run_dir: Path) -> str:
    return (FIX / rel).read_text().replace("@RUN_DIR@", str(run_dir))


@pytest.fixture
def sweep_run(tmp_path: Path) -> tuple[RunPaths, dict]:
    """A run dir laid out like the captured sweep: jobs.json, and the batch logs' first lines."""
    paths = RunPaths(tmp_path / "jm-test-20261130-013928-905b79")
    paths.logs.mkdir(parents=True)
    jobs = json.loads((FIX / "sweep" / "jobs.json").read_text())
    paths.write_jobs(jobs)
    for i in range(3):
        paths.task(i).dir.mkdir(parents=True)
    return paths, jobs


def started(paths: RunPaths, task: int, plain: str, rc: int | None = None) -> None:
    layout = task_layout(paths.read_jobs(), 3)
    text = f"slime: job {plain} task {task} on sn1 (restart 0)\nsome output\n"
    if rc is not None:
        text += f"slime: task {task} finished with exit code {rc}\n"
    log_path(paths, task, layout).write_text(text)


def test_layout_and_log_paths_follow_the_launchers_jobs_json(sweep_run):
    paths, jobs = sweep_run
    layout = task_layout(jobs, 3)
    assert layout == {0: ("63", 0), 1: ("63", 1), 2: ("63", 2)}
    assert log_path(paths, 1, layout) == paths.logs / "slurm-63_1.out"
    assert task_layout({"job_ids": ["7"], "arrays": []}, 1) == {0: ("7", None)}
    assert task_layout({"job_ids": ["7"], "arrays": []}, 1)[0][1] is None
    split = {
        "job_ids": ["10", "11"],
        "arrays": [
            {"job_id": "10", "first_task": 0, "last_task": 1},
            {"job_id": "11", "first_task": 2, "last_task": 2},
        ],
    }
    assert task_layout(split, 3) == {0: ("10", 0), 1: ("10", 1), 2: ("11", 0)}


def test_whole_array_pending_is_pending_for_every_task_with_the_reason(sweep_run):
    paths, jobs = sweep_run
    recs = parse_scontrol(fixture("sweep/scontrol_pending.txt", paths.root))
    assert len(recs) == 1 and recs[0]["ArrayTaskId"] == "0-2%1" and recs[0]["WorkDir"] == str(paths.root)
    tasks = tasks_from_records(recs, task_layout(jobs, 3), paths.root)
    assert [tasks[i].state for i in range(3)] == ["pending"] * 3
    assert [tasks[i].job_id for i in range(3)] == ["63_0", "63_1", "63_2"]
    assert tasks[0].reason.startswith("Resources: waiting for free nodes")
    # squeue (one call for many runs in `list`) says the same
    sq = tasks_from_records(
        parse_squeue(fixture("sweep/squeue_pending.txt", paths.root)), task_layout(jobs, 3), paths.root, "squeue"
    )
    assert {i: (t.state, t.reason) for i, t in sq.items()} == {i: (t.state, t.reason) for i, t in tasks.items()}


def test_a_task_cancelled_while_pending_vanishes_from_slurm_and_is_reported_cancelled(sweep_run):
    paths, jobs = sweep_run
    layout = task_layout(jobs, 3)
    recs = parse_scontrol(fixture("sweep/scontrol_after_cancel.txt", paths.root))
    assert recs[0]["ArrayTaskId"] == "0-1%1"  # SLURM dropped task 2
    found = tasks_from_records(recs, layout, paths.root)
    assert sorted(found) == [0, 1]
    dropped = dropped_tasks(recs, layout, paths, found)
    assert list(dropped) == [2] and dropped[2].state == "cancelled"
    started(paths, 2, "99")  # ...but a task that has a log ran: its absence means "purged", not cancelled
    assert dropped_tasks(recs, layout, paths, found) == {}


def test_finished_sweep_from_scontrol_squeue_and_the_job_completion_log(sweep_run):
    paths, jobs = sweep_run
    layout = task_layout(jobs, 3)
    recs = parse_scontrol(fixture("sweep/scontrol_done.txt", paths.root))
    done = tasks_from_records(recs, layout, paths.root)
    assert {i: (t.state, t.scheduler_state, t.exit_code) for i, t in done.items()} == {
        0: ("succeeded", "COMPLETED", "0:0"),
        1: ("failed", "FAILED", "1:0"),
    }
    assert done[1].reason == "NonZeroExitCode (exit code 1:0)"
    assert dropped_tasks(recs, layout, paths, done)[2].state == "cancelled"
    sq = tasks_from_records(parse_squeue(fixture("sweep/squeue_done.txt", paths.root)), layout, paths.root)
    assert {i: t.state for i, t in sq.items()} == {0: "succeeded", 1: "failed"}

    # Once slurmctld forgot the job: sacct -c has plain ids only (65 for task 0, 63 for task 1);
    # the batch logs' first lines map them back to tasks.
    rows = parse_sacct(fixture("sweep/sacct_done.txt", paths.root))
    assert sorted(rows) == ["63", "65"]
    started(paths, 0, "65", 0)
    started(paths, 1, "63", 1)
    plain = {t: p for t in range(3) if (p := plain_job_id(paths, t, layout))}
    assert plain == {0: "65", 1: "63"}
    jc = tasks_from_jobcomp(rows, layout, plain, paths.root, range(3))
    assert {i: (t.state, t.job_id, t.source) for i, t in jc.items()} == {
        0: ("succeeded", "63_0", "jobcomp"),
        1: ("failed", "63_1", "jobcomp"),
    }
    # 63 is claimed by task 1: the never-started task 2 must not inherit its record
    assert 2 not in jc


def test_job_completion_rows_of_another_work_dir_are_ignored(sweep_run, tmp_path):
    paths, jobs = sweep_run
    rows = parse_sacct(fixture("sweep/sacct_done.txt", tmp_path / "someone-else"))
    started(paths, 0, "65", 0)
    layout = task_layout(jobs, 3)
    assert tasks_from_jobcomp(rows, layout, {0: "65"}, paths.root, range(3)) == {}
    recs = parse_scontrol(fixture("sweep/scontrol_done.txt", tmp_path / "someone-else"))
    assert tasks_from_records(recs, layout, paths.root) == {}


def test_run_dir_records_alone(sweep_run):
    paths, jobs = sweep_run
    layout = task_layout(jobs, 3)
    started(paths, 0, "65", 0)
    started(paths, 1, "63", 1)
    paths.task(1).state.write_text(json.dumps({"state": "failed", "error": "driver: out of memory"}))
    t0, t1, t2 = (task_from_run_dir(paths, i, layout) for i in range(3))
    assert (t0.state, t0.exit_code) == ("succeeded", "0")
    assert (t1.state, t1.reason) == ("failed", "driver: out of memory")
    assert t2.state == "unknown" and "no longer knows job 63_2" in t2.reason
    paths.write_jobs({**jobs, "cancelled": {"tasks": [2]}})
    assert task_from_run_dir(paths, 2, layout).state == "cancelled"
    started(paths, 2, "70", 143)
    assert "SIGTERM" in task_from_run_dir(paths, 2, layout).reason


def test_array_with_completed_running_and_throttled_tasks(tmp_path):
    paths = RunPaths(tmp_path / "run")
    layout = task_layout({"job_ids": ["38"], "arrays": [{"job_id": "38", "first_task": 0, "last_task": 2}]}, 3)
    tasks = tasks_from_records(parse_scontrol(fixture("array/scontrol_running.txt", paths.root)), layout, paths.root)
    assert {i: (t.state, t.job_id) for i, t in tasks.items()} == {
        0: ("succeeded", "38_0"),
        1: ("running", "38_1"),
        2: ("pending", "38_2"),
    }
    assert "max_parallel" in tasks[2].reason and tasks[1].nodes == "sn1"
    tasks = tasks_from_records(parse_scontrol(fixture("array/scontrol_done.txt", paths.root)), layout, paths.root)
    assert [tasks[i].state for i in range(3)] == ["succeeded", "failed", "succeeded"]


@pytest.mark.parametrize(
    "name,jid,state,reason,restarts",
    [
        ("scontrol_held", "39", "pending", "JobHeldUser: held by a user", 0),
        ("scontrol_held_cancelled", "39", "cancelled", None, 0),
        ("scontrol_running", "40", "running", None, 0),
        ("scontrol_cancelled", "40", "cancelled", None, 0),
        ("scontrol_requeued_pending", "67", "pending", "BeginTime: not allowed to start yet", 1),
        ("scontrol_requeued_done", "67", "succeeded", None, 1),
    ],
)
def test_plain_jobs(tmp_path, name, jid, state, reason, restarts):
    recs = parse_scontrol(fixture(f"single/{name}.txt", tmp_path))
    (t,) = tasks_from_records(recs, {0: (jid, None)}, tmp_path).values()
    assert (t.state, t.job_id, t.restarts) == (state, jid, restarts)
    assert (t.reason or "").startswith(reason or "")
    if reason is None:
        assert t.reason is None


def test_a_requeued_job_has_one_completion_row_per_run(tmp_path):
    rows = parse_sacct(fixture("single/sacct_requeued.txt", tmp_path))
    assert [r["JobState"] for r in rows["67"]] == ["PENDING", "COMPLETED"]
    (t,) = tasks_from_jobcomp(rows, {0: ("67", None)}, {}, tmp_path, [0]).values()
    assert (t.state, t.restarts, t.source) == ("succeeded", 1, "jobcomp")


def test_parsers_skip_garbage_and_keep_pipes_inside_work_dirs():
    assert parse_scontrol("\n\n") == []
    assert parse_squeue("short|line\n") == []
    weird = "/runs/a|b"
    rows = parse_sacct(f"5|COMPLETED|0:0|sn1|s|e|{weird}\nbroken\n")
    assert rows["5"][0]["WorkDir"] == weird
    sq = parse_squeue(f"5|5|5|N/A|RUNNING|None|sn1|{weird}\n")
    assert sq[0]["WorkDir"] == weird and "ArrayJobId" not in sq[0]
