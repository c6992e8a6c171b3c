"""What a run is doing, as every launcher reports it, and what a run dir says about itself.

:class:`RunStatus` / :class:`TaskStatus` are the answer of ``Launcher.status`` (``status``,
``list``, ``logs -f``, duplicate refusal); :class:`CancelResult` that of ``Launcher.cancel``.
States are :class:`slime.core.states.RunState`; a run's state is :func:`aggregate` of its tasks'.

The run-dir records read here are shared by both launchers (a local run has no scheduler, so its
state *is* these records; SLURM falls back on them once slurmctld forgot a job). All optional,
all written by others:

* ``jobs.json`` — the launcher's record (job ids, task count, submit time; ``launcher`` names it);
* ``tasks/<i>/state.json`` — the runtime's state (running/succeeded/failed/preempted, pid, host);
* ``tasks/<i>/metrics.jsonl`` — only its tail is read (last step and headline metric);
* ``tasks/<i>/restarts.jsonl`` — one line per restart with its cause.

Not guaranteed: anything about a record its writer left torn (a torn last line is skipped).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slime.core.paths import RunPaths, TaskPaths
from slime.core.states import RunState

__all__ = [
    "HEADLINE_METRICS",
    "CancelResult",
    "RunStatus",
    "TaskStatus",
    "aggregate",
    "fill_from_records",
    "launcher_name",
    "metrics_tail",
    "restart_causes",
    "run_name",
    "run_started",
    "runtime_state",
    "runtime_word",
    "task_count",
]

#: the first of these a metrics line has is shown as "the" metric
HEADLINE_METRICS = ("rollout/reward_mean", "eval/accuracy", "sft/loss", "train/loss")
_TAIL_BYTES = 64 * 1024


@dataclass(kw_only=True, slots=True)
class TaskStatus:
    """One task (sweep point) of a run, as status/list show it."""

    task: int
    state: RunState = RunState.UNKNOWN
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
    state: RunState
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


@dataclass(frozen=True, kw_only=True, slots=True)
class CancelResult:
    """What ``cancel`` did. ``cancelled``: the SLURM job ids scancel'ed, or the local task numbers
    signalled; empty with a ``message`` when there was nothing to cancel. ``None`` fields are not
    part of that launcher's answer (and not in its JSON)."""

    run_dir: Path
    state: RunState
    cancelled: tuple[str | int, ...] = ()
    tasks: tuple[int, ...] | None = None  # the tasks stopped
    pids: tuple[int, ...] | None = None  # local: the bootstrap processes signalled
    message: str | None = None  # why nothing was cancelled

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_dir": str(self.run_dir), "cancelled": list(self.cancelled)}
        for key in ("tasks", "pids"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value)
        out["state"] = self.state
        if self.message is not None:
            out["message"] = self.message
        return out


_ACTIVE_ORDER = (RunState.RUNNING, RunState.REQUEUED, RunState.PENDING, RunState.SUSPENDED)
_ENDED_ORDER = (RunState.FAILED, RunState.TIMEOUT, RunState.CANCELLED, RunState.UNKNOWN)


def aggregate(states: Iterable[RunState]) -> RunState:
    """One state for a run from its tasks' states (any running task makes the run running)."""
    states = list(states)
    if not states:
        return RunState.UNKNOWN
    for s in _ACTIVE_ORDER:
        if s in states:
            return s
    if all(s == RunState.SUCCEEDED for s in states):
        return RunState.SUCCEEDED
    return next((s for s in _ENDED_ORDER if s in states), RunState.UNKNOWN)


def runtime_word(text: str | None, default: RunState = RunState.UNKNOWN) -> RunState:
    """The runtime's ``state.json`` word as a job view shows it: ``preempted`` (stopped after a
    checkpoint, to be requeued) is ``requeued``; a word the runtime does not write is ``default``."""
    state = RunState.parse(text)
    if state == RunState.PREEMPTED:
        return RunState.REQUEUED
    return state if state in (RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED) else default


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
    """The runtime's ``state.json`` as written (None when absent or unreadable)."""
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


def launcher_name(paths: RunPaths) -> str:
    """The launcher that made the run: ``jobs.json``'s, else ``lock.json``'s, else ``local``."""
    launcher = paths.read_jobs().get("launcher")
    if not launcher:
        lock = _read_json(paths.lock)
        launcher = lock.get("launcher")
    return launcher if launcher and isinstance(launcher, str) else "local"


def fill_from_records(ts: TaskStatus, tp: TaskPaths) -> TaskStatus:
    """Add last step/metric and restart causes (what SLURM cannot know) to ``ts``."""
    ts.step, ts.rollout_id, ts.metric = metrics_tail(tp)
    ts.restart_causes = restart_causes(tp)
    ts.restarts = max(ts.restarts, len(ts.restart_causes))
    return ts


def task_count(paths: RunPaths) -> int:
    """The run's task count: ``jobs.json``'s, else the task dirs present (at least 1)."""
    n = paths.read_jobs().get("tasks")
    return n if isinstance(n, int) and n > 0 else max(1, len(paths.task_indices()))
