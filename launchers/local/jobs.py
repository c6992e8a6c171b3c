"""Job management for local runs: PID records, state inference, cancel by signal, log files.

A local run's state is its run dir's records (``launchers.status``) plus the PID record in
``jobs.json`` (:func:`record_start`/:func:`record_exit`; ``cancelled`` added by :func:`cancel`). A task
whose bootstrap PID is alive and still ours is running, later tasks pending, exit codes decide the
rest; elsewhere than the recording host, ``state.json`` is believed. :func:`cancel` sends SIGTERM to
the running task's bootstrap, not its process group.
Not guaranteed: the state of a run whose launcher died without writing an exit code is inferred
("failed: process gone").
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import time
from pathlib import Path

from launchers.status import (
    CancelResult,
    RunStatus,
    TaskStatus,
    aggregate,
    fill_from_records,
    run_name,
    run_started,
    runtime_state,
    runtime_word,
    task_count,
)
from slime.core.errors import InfraError
from slime.core.paths import RunPaths
from slime.core.states import RunState

__all__ = ["cancel", "log_files", "pid_alive", "record_exit", "record_start", "run_status"]


# ----------------------------------------------------------------------------- PID records
def pid_alive(pid: int, marker: str | None = None) -> bool:
    """Whether ``pid`` runs (on this host) and, with ``marker``, its command line contains it
    (a recycled PID belongs to someone else)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, not ours to signal
    if marker is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return True  # no /proc: trust kill(0)
    if Path(f"/proc/{pid}/stat").exists():
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return False  # a zombie has finished
        except (OSError, IndexError):
            pass
    return marker in cmdline


def _update_jobs(paths: RunPaths, update) -> None:
    doc = paths.read_jobs()
    update(doc)
    paths.write_jobs(doc)


def record_start(paths: RunPaths, task: int, pid: int) -> None:
    """Called by the local launcher when task ``task``'s bootstrap process ``pid`` started."""

    def upd(doc: dict) -> None:
        local = doc.setdefault("local", {})
        local.update(host=socket.gethostname(), launcher_pid=os.getpid())
        local.setdefault("tasks", {})[str(task)] = {"pid": pid, "started_at": time.time()}

    _update_jobs(paths, upd)


def record_exit(paths: RunPaths, task: int, returncode: int) -> None:
    """Called by the local launcher when task ``task`` ended with ``returncode``."""

    def upd(doc: dict) -> None:
        rec = doc.setdefault("local", {}).setdefault("tasks", {}).setdefault(str(task), {})
        rec.update(exit_code=returncode, ended_at=time.time())

    _update_jobs(paths, upd)


# ----------------------------------------------------------------------------- local status
_CANCELLED = "cancelled by slime-submit cancel"


def _local_task(paths: RunPaths, i: int, doc: dict, running_seen: bool) -> TaskStatus:
    tp = paths.task(i)
    local = doc.get("local") or {}
    rec = (local.get("tasks") or {}).get(str(i)) or {}
    here = local.get("host") in (None, socket.gethostname())
    cancelled = i in ((doc.get("cancelled") or {}).get("tasks") or []) or (doc.get("cancelled") or {}).get("all")
    rt = runtime_state(tp) or {}
    ts = TaskStatus(
        task=i,
        source="process",
        scheduler_state=rt.get("state"),
        log=str(next(iter(sorted(tp.logs.glob("*.out"))), "")) or None,
        started=_time(rec.get("started_at")),
        ended=_time(rec.get("ended_at")),
    )
    if "exit_code" in rec:
        rc = rec["exit_code"]
        ts.exit_code = str(rc)
        if rc == 0 and rt.get("state") in (None, RunState.SUCCEEDED):
            ts.state = RunState.SUCCEEDED
        elif cancelled:
            ts.state, ts.reason = RunState.CANCELLED, _CANCELLED
        else:
            ts.state, ts.reason = RunState.FAILED, rt.get("error") or f"exit code {rc}"
    elif "pid" in rec:
        _from_pid(ts, paths, rec["pid"], local, here=here, cancelled=bool(cancelled), runtime=rt)
    elif rt:  # no PID record (older launcher): believe the runtime, checking its PID when we can
        ts.state = runtime_word(rt.get("state"))
        ts.source = "run dir"
        if ts.state == RunState.RUNNING and rt.get("host") == socket.gethostname() and not pid_alive(rt.get("pid", -1)):
            ts.state, ts.reason = RunState.FAILED, f"runtime process {rt.get('pid')} is gone (killed?)"
    else:
        _never_started(ts, doc, here=here, cancelled=bool(cancelled), running_seen=running_seen)
    return fill_from_records(ts, tp)


def _time(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _from_pid(ts: TaskStatus, paths: RunPaths, pid: int, local: dict, *, here: bool, cancelled: bool, runtime: dict):
    """A task whose bootstrap started and has not recorded an exit code: is its process still ours?"""
    if not here:
        ts.state = runtime_word(runtime.get("state"), default=RunState.RUNNING)
        ts.reason, ts.source = f"runs on {local.get('host')} (PID not checked from here)", "run dir"
    elif pid_alive(pid, str(paths.root)):
        ts.state = RunState.RUNNING
        if runtime.get("state") is None:
            ts.reason = "starting (Ray bootstrap / preflight)"
    elif cancelled:
        ts.state, ts.reason = RunState.CANCELLED, _CANCELLED
    elif runtime.get("state") == RunState.SUCCEEDED:
        ts.state = RunState.SUCCEEDED
    else:
        ts.state, ts.reason = RunState.FAILED, f"process {pid} is gone without an exit code (killed?)"


def _never_started(ts: TaskStatus, doc: dict, *, here: bool, cancelled: bool, running_seen: bool) -> None:
    local = doc.get("local") or {}
    launcher_alive = here and pid_alive(local.get("launcher_pid", -1))
    if cancelled:
        ts.state, ts.reason = RunState.CANCELLED, "cancelled before it started"
    elif launcher_alive or (not local and not doc.get("preflight_only") and running_seen):
        ts.state, ts.reason = RunState.PENDING, "waiting for the previous task (local sweeps run one at a time)"
    elif local:
        ts.state, ts.reason = RunState.CANCELLED, "never ran: an earlier task failed or the run was stopped"
    else:
        ts.state, ts.reason = RunState.UNKNOWN, "no record of this task"


def run_status(paths: RunPaths) -> RunStatus:
    doc = paths.read_jobs()
    tasks: list[TaskStatus] = []
    for i in range(task_count(paths)):
        tasks.append(_local_task(paths, i, doc, any(t.state.is_active for t in tasks)))
    return RunStatus(
        run_dir=str(paths.root),
        name=run_name(paths),
        launcher=doc.get("launcher", "local"),
        job_ids=[str(j) for j in doc.get("job_ids", [])],
        state=aggregate(t.state for t in tasks),
        started=run_started(paths),
        tasks=tasks,
        preflight_only=bool(doc.get("preflight_only")),
    )


# ----------------------------------------------------------------------------- cancel, logs
def _nothing_to_cancel(paths: RunPaths, status: RunStatus, task: int | None) -> CancelResult:
    if task is None:
        return CancelResult(
            run_dir=paths.root, state=status.state, message=f"nothing to cancel: the run is {status.state}"
        )
    state = status.tasks[task].state
    ended = f"task {task}'s state is unknown" if state == RunState.UNKNOWN else f"task {task} already ended ({state})"
    return CancelResult(run_dir=paths.root, state=state, tasks=(), message=f"nothing to cancel: {ended}")


def cancel(paths: RunPaths, task: int | None = None) -> CancelResult:
    """SIGTERM the running task's bootstrap (see the module doc); says what was signalled."""
    status = run_status(paths)
    local = paths.read_jobs().get("local") or {}
    again = f"slime-submit cancel {shlex.quote(str(paths.root))}"
    if local.get("host") not in (None, socket.gethostname()):
        raise InfraError(f"run {paths.root} runs on host {local.get('host')}; cancel it there (`{again}`)")
    running = [t for t in status.tasks if t.state == RunState.RUNNING]
    if task is not None:
        if task not in range(len(status.tasks)):
            raise InfraError(f"--task {task}: run {paths.root} has tasks 0..{len(status.tasks) - 1}")
        state = status.tasks[task].state
        if not state.is_active:  # as for a finished run: nothing to do is not an error
            return _nothing_to_cancel(paths, status, task)
        if not any(t.task == task for t in running):
            raise InfraError(
                f"task {task} of {paths.root} is {state}, not running; local sweeps run one task at a "
                f"time, so only the running task can be cancelled (cancel the whole run: `{again}`)"
            )
        running = [t for t in running if t.task == task]
    if not running and not status.state.is_active:
        return _nothing_to_cancel(paths, status, None)

    def upd(d: dict) -> None:
        rec = d.setdefault("cancelled", {"at": time.time(), "tasks": []})
        rec["tasks"] = sorted(set(rec.get("tasks", [])) | {t.task for t in running})
        if task is None:
            rec["all"] = True

    _update_jobs(paths, upd)
    signalled = []
    for t in running:
        pid = ((local.get("tasks") or {}).get(str(t.task)) or {}).get("pid")
        if pid is None:
            pid = (runtime_state(paths.task(t.task)) or {}).get("pid")
        if isinstance(pid, int) and pid_alive(pid):
            try:
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
            except ProcessLookupError:
                pass
    return CancelResult(
        run_dir=paths.root, state=RunState.CANCELLED, cancelled=tuple(t.task for t in running), pids=tuple(signalled)
    )


def log_files(paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
    """A local task's logs: the per-node bootstrap logs (driver output goes to the terminal)."""
    tp = paths.task(task)
    if node is not None:
        return [p for p in (tp.node_log(node, "out"), tp.node_log(node, "err")) if p.exists()] or [tp.node_log(node)]
    return sorted(tp.logs.glob("*.out")) + sorted(tp.logs.glob("*.err"))
