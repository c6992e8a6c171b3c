"""Job management for local runs, and what every run dir says about itself.

Two jobs in one module because the second is the first's whole answer: a local run has no
scheduler, so its state *is* the run dir's own records, and the SLURM side
(``launchers.slurm.jobs``) falls back to the same records when SLURM has forgotten a job.

Run-dir records read here (all optional, all written by others):

* ``jobs.json`` — the launcher's record. The local launcher adds ``local: {host, launcher_pid,
  tasks: {i: {pid, started_at, exit_code, ended_at}}}`` through :func:`record_start` /
  :func:`record_exit` (the PID record), and :func:`cancel` adds ``cancelled: {at, tasks}``.
* ``tasks/<i>/state.json`` — the runtime's state (running/succeeded/failed/preempted, pid, host).
* ``tasks/<i>/metrics.jsonl`` — only its tail is read (last step and headline metric).
* ``tasks/<i>/restarts.jsonl`` — one line per restart with its cause.

Local states: a task whose bootstrap PID is alive (and is still our process: its command line
names the run dir) is running; tasks after it are pending (local sweeps run one after another);
an exit code decides the rest. A PID is only checked on the host that recorded it; elsewhere
the runtime's ``state.json`` is believed.

Cancel signals the task's bootstrap process with SIGTERM, not its process group: the bootstrap
runs in the terminal's process group (so Ctrl-C reaches it), and that group can hold the user's
own shell pipeline. The bootstrap forwards the signal to the driver (which checkpoints) and
stops this job's Ray itself; the launcher then stops the sweep. Only the running task can be
cancelled locally.

Not guaranteed: the state of a run whose launcher died without writing an exit code is
inferred ("failed: process gone").
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slime.core.errors import InfraError
from slime.core.paths import RunPaths, TaskPaths

__all__ = [
    "ACTIVE",
    "STATES",
    "RunStatus",
    "TaskStatus",
    "active",
    "aggregate",
    "cancel",
    "log_files",
    "metrics_tail",
    "pid_alive",
    "record_exit",
    "record_start",
    "restart_causes",
    "run_name",
    "run_started",
    "run_states",
    "run_status",
    "runtime_state",
]

#: our task states, whatever ran the job
STATES = ("pending", "running", "requeued", "suspended", "succeeded", "failed", "timeout", "cancelled", "unknown")
#: states in which a job may still do work (duplicate refusal, ``logs -f``)
ACTIVE = frozenset({"pending", "running", "requeued", "suspended"})
#: the first of these a metrics line has is shown as "the" metric
HEADLINE_METRICS = ("rollout/reward_mean", "eval/accuracy", "sft/loss", "train/loss")
_TAIL_BYTES = 64 * 1024
# runtime state.json → our state (preempted: stopped after a checkpoint, to be requeued)
_RUNTIME_STATES = {"running": "running", "succeeded": "succeeded", "failed": "failed", "preempted": "requeued"}


@dataclass(kw_only=True, slots=True)
class TaskStatus:
    """One task (sweep point) of a run, as status/list show it."""

    task: int
    state: str = "unknown"
    reason: str | None = None  # why pending, or what ended it
    job_id: str | None = None  # scheduler id shown to users ("123", "123_4"); local: None
    scheduler_state: str | None = None  # raw SLURM state, or the runtime's own
    source: str = "run dir"  # where the state came from: scontrol, squeue, jobcomp, process, run dir
    nodes: str | None = None
    exit_code: str | None = None
    restarts: int = 0
    restart_causes: list[str] = field(default_factory=list)
    step: int | None = None
    rollout_id: int | None = None
    metric: dict[str, Any] | None = None  # {"name", "value"}
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True, slots=True)
class RunStatus:
    run_dir: str
    name: str
    launcher: str
    job_ids: list[str]
    state: str
    started: float | None
    tasks: list[TaskStatus]
    preflight_only: bool = False

    @property
    def last_step(self) -> int | None:
        steps = [t.step for t in self.tasks if t.step is not None]
        return max(steps) if steps else None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "name": self.name,
            "launcher": self.launcher,
            "job_ids": self.job_ids,
            "state": self.state,
            "started": self.started,
            "last_step": self.last_step,
            "preflight_only": self.preflight_only,
            "tasks": [t.to_json() for t in self.tasks],
        }


def aggregate(states: list[str]) -> str:
    """One state for a run from its tasks' states (any running task makes the run running)."""
    if not states:
        return "unknown"
    for s in ("running", "requeued", "pending", "suspended"):
        if s in states:
            return s
    if all(s == "succeeded" for s in states):
        return "succeeded"
    for s in ("failed", "timeout", "cancelled", "unknown"):
        if s in states:
            return s
    return "unknown"


# ----------------------------------------------------------------------------- run-dir records
def _tail_lines(path: Path, nbytes: int = _TAIL_BYTES) -> list[str]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            data = fh.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if size > nbytes else lines  # the first line may be cut


def metrics_tail(tp: TaskPaths) -> tuple[int | None, int | None, dict[str, Any] | None]:
    """(step, rollout_id, headline metric) of the last complete metrics line, reading only the tail."""
    for line in reversed(_tail_lines(tp.metrics)):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn line
        if not isinstance(rec, dict):
            continue
        metric = next(({"name": k, "value": rec[k]} for k in HEADLINE_METRICS if rec.get(k) is not None), None)
        step, rid = rec.get("step"), rec.get("rollout_id")
        return (step if isinstance(step, int) else None, rid if isinstance(rid, int) else None, metric)
    return None, None, None


def restart_causes(tp: TaskPaths) -> list[str]:
    """One word per restart (``preempted``, ``node_failure: sn2``, ...), oldest first."""
    causes = []
    for line in _tail_lines(tp.restarts, 1 << 20):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            causes.append("?")
            continue
        bad = rec.get("bad_nodes") or []
        causes.append(str(rec.get("cause", "?")) + (f": {','.join(map(str, bad))}" if bad else ""))
    return causes


def runtime_state(tp: TaskPaths) -> dict[str, Any] | None:
    try:
        doc = json.loads(tp.state.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def run_name(paths: RunPaths) -> str:
    """The spec's name (from resolved.json), else the run dir's name."""
    name = _read_json(paths.resolved).get("name")
    return name if isinstance(name, str) else paths.root.name


def run_started(paths: RunPaths) -> float | None:
    """Submit time: jobs.json ``submitted_at``, else when the run dir was made (``spec.yaml`` is
    written once, at creation; cheaper than parsing the lock for every run ``list`` shows)."""
    t = paths.read_jobs().get("submitted_at")
    if isinstance(t, (int, float)):
        return float(t)
    try:
        return paths.spec.stat().st_mtime
    except OSError:
        return None


def fill_from_records(ts: TaskStatus, tp: TaskPaths) -> TaskStatus:
    """Add last step/metric and restart causes (what SLURM cannot know) to ``ts``."""
    ts.step, ts.rollout_id, ts.metric = metrics_tail(tp)
    ts.restart_causes = restart_causes(tp)
    ts.restarts = max(ts.restarts, len(ts.restart_causes))
    return ts


def task_count(paths: RunPaths) -> int:
    n = paths.read_jobs().get("tasks")
    return n if isinstance(n, int) and n > 0 else max(1, len(paths.task_indices()))


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
    )
    if "exit_code" in rec:
        rc = rec["exit_code"]
        ts.exit_code = str(rc)
        if rc == 0 and rt.get("state") in (None, "succeeded"):
            ts.state = "succeeded"
        elif cancelled:
            ts.state, ts.reason = "cancelled", "cancelled by slime-submit cancel"
        else:
            ts.state = "failed"
            ts.reason = rt.get("error") or f"exit code {rc}"
    elif "pid" in rec:
        if not here:
            ts.state = _RUNTIME_STATES.get(rt.get("state", ""), "running")
            ts.reason, ts.source = f"runs on {local.get('host')} (PID not checked from here)", "run dir"
        elif pid_alive(rec["pid"], str(paths.root)):
            ts.state = "running"
            if rt.get("state") is None:
                ts.reason = "starting (Ray bootstrap / preflight)"
        elif cancelled:
            ts.state, ts.reason = "cancelled", "cancelled by slime-submit cancel"
        elif rt.get("state") == "succeeded":
            ts.state = "succeeded"
        else:
            ts.state, ts.reason = "failed", f"process {rec['pid']} is gone without an exit code (killed?)"
    elif rt:  # no PID record (older launcher): believe the runtime, checking its PID when we can
        ts.state = _RUNTIME_STATES.get(rt.get("state", ""), "unknown")
        ts.source = "run dir"
        if ts.state == "running" and rt.get("host") == socket.gethostname() and not pid_alive(rt.get("pid", -1)):
            ts.state, ts.reason = "failed", f"runtime process {rt.get('pid')} is gone (killed?)"
    else:
        launcher_alive = here and pid_alive(local.get("launcher_pid", -1))
        if cancelled:
            ts.state, ts.reason = "cancelled", "cancelled before it started"
        elif launcher_alive or (not local and not doc.get("preflight_only") and running_seen):
            ts.state, ts.reason = "pending", "waiting for the previous task (local sweeps run one at a time)"
        elif local:
            ts.state, ts.reason = "cancelled", "never ran: an earlier task failed or the run was stopped"
        else:
            ts.state, ts.reason = "unknown", "no record of this task"
    return fill_from_records(ts, tp)


def run_status(paths: RunPaths) -> RunStatus:
    doc = paths.read_jobs()
    tasks: list[TaskStatus] = []
    for i in range(task_count(paths)):
        tasks.append(_local_task(paths, i, doc, any(t.state in ACTIVE for t in tasks)))
    return RunStatus(
        run_dir=str(paths.root),
        name=run_name(paths),
        launcher=doc.get("launcher", "local"),
        job_ids=[str(j) for j in doc.get("job_ids", [])],
        state=aggregate([t.state for t in tasks]),
        started=run_started(paths),
        tasks=tasks,
        preflight_only=bool(doc.get("preflight_only")),
    )


def run_states(runs: list[RunPaths]) -> dict[Path, RunStatus]:
    """Status of many local runs (``list``)."""
    return {p.root: run_status(p) for p in runs}


def active(paths: RunPaths) -> bool:
    return run_status(paths).state in ACTIVE


# ----------------------------------------------------------------------------- cancel, logs
def cancel(paths: RunPaths, task: int | None = None) -> dict[str, Any]:
    """SIGTERM the running task's bootstrap (see the module doc); returns what was signalled."""
    status = run_status(paths)
    doc = paths.read_jobs()
    local = doc.get("local") or {}
    again = f"slime-submit cancel {shlex.quote(str(paths.root))}"
    if local.get("host") not in (None, socket.gethostname()):
        raise InfraError(f"run {paths.root} runs on host {local.get('host')}; cancel it there (`{again}`)")
    running = [t for t in status.tasks if t.state == "running"]
    if task is not None:
        if task not in range(len(status.tasks)):
            raise InfraError(f"--task {task}: run {paths.root} has tasks 0..{len(status.tasks) - 1}")
        state = status.tasks[task].state
        if state not in ACTIVE:  # as for a finished run: nothing to do is not an error
            return {
                "run_dir": str(paths.root),
                "cancelled": [],
                "tasks": [],
                "state": state,
                "message": "nothing to cancel: "
                + (f"task {task}'s state is unknown" if state == "unknown" else f"task {task} already ended ({state})"),
            }
        if not any(t.task == task for t in running):
            raise InfraError(
                f"task {task} of {paths.root} is {state}, not running; local sweeps run one task at a "
                f"time, so only the running task can be cancelled (cancel the whole run: `{again}`)"
            )
        running = [t for t in running if t.task == task]
    if not running and status.state not in ACTIVE:
        return {
            "run_dir": str(paths.root),
            "cancelled": [],
            "state": status.state,
            "message": f"nothing to cancel: the run is {status.state}",
        }

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
    return {"run_dir": str(paths.root), "cancelled": [t.task for t in running], "pids": signalled, "state": "cancelled"}


def log_files(paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
    """A local task's logs: the per-node bootstrap logs (driver output goes to the terminal)."""
    tp = paths.task(task)
    if node is not None:
        return [p for p in (tp.node_log(node, "out"), tp.node_log(node, "err")) if p.exists()] or [tp.node_log(node)]
    return sorted(tp.logs.glob("*.out")) + sorted(tp.logs.glob("*.err"))
