"""What a run is doing, as every launcher reports it, and what a run dir says about itself.

:class:`RunStatus`/:class:`TaskStatus` answer ``Launcher.status``; :class:`CancelResult` answers
``cancel``; a run's state is :func:`aggregate` of its tasks' (:class:`slime.core.states.RunState`).
The run-dir records read here (``jobs.json``, ``tasks/<i>/state.json``, the tail of
``metrics.jsonl``, ``restarts.jsonl``, ``resolved.json``) are a local run's whole state and SLURM's
fallback once slurmctld forgot a job; all optional, all written by others.
Not guaranteed: anything about a record its writer left torn (a torn last line is skipped).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slime.core.paths import RunPaths, TaskPaths
from slime.core.states import RunState

__all__ = [
    "HEADLINE_METRICS",
    "THROUGHPUT_WINDOW",
    "CancelResult",
    "RunStatus",
    "TaskStatus",
    "aggregate",
    "fill_from_records",
    "latest_eval",
    "launcher_name",
    "metrics_tail",
    "restart_causes",
    "run_name",
    "run_started",
    "runtime_state",
    "runtime_word",
    "task_count",
    "throughput",
]

#: the first of these a metrics line has is shown as "the" metric
HEADLINE_METRICS = ("rollout/reward_mean", "eval/accuracy", "sft/loss", "train/loss")
#: metrics lines the computed throughput averages over
THROUGHPUT_WINDOW = 5
_TAIL_BYTES = 64 * 1024
_EVAL_TAIL_BYTES = 1 << 20
_PERF_UNITS = (
    (re.compile(r"^perf/.*tok(en)?s?_?(per_?s(ec)?|/s)$"), "tok/s"),
    (re.compile(r"^perf/.*samples?_?(per_?s(ec)?|/s)$"), "samples/s"),
)


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
    started: float | None = None  # when this attempt started (launcher record, else the runtime's)
    ended: float | None = None  # when it ended (None while active)
    elapsed_s: float | None = None  # ended (or now) - started
    num_rollouts: int | None = None  # the runtime's planned rollouts (progress: rollout_id + 1 of these)
    throughput: dict[str, Any] | None = None  # {"name", "value", "unit"}: perf/* or computed
    eval: dict[str, Any] | None = None  # the newest eval metric: {"name", "value", "rollout_id"}

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
def _tail(path: Path, nbytes: int) -> tuple[list[str], bool]:
    """The last lines within ``nbytes`` of ``path``, and whether that was the whole file."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            data = fh.read()
    except OSError:
        return [], True
    lines = data.decode("utf-8", "replace").splitlines()
    return (lines[1:], False) if size > nbytes else (lines, True)  # the first line may be cut


def _tail_lines(path: Path, nbytes: int = _TAIL_BYTES) -> list[str]:
    return _tail(path, nbytes)[0]


def _records(path: Path, nbytes: int = _TAIL_BYTES) -> tuple[list[dict[str, Any]], bool]:
    """The complete JSON-object lines of the file's tail, newest first (torn lines skipped)."""
    lines, whole = _tail(path, nbytes)
    out = []
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn line
        if isinstance(rec, dict):
            out.append(rec)
    return out, whole


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _headline(rec: dict[str, Any]) -> tuple[int | None, int | None, dict[str, Any] | None]:
    metric = next(({"name": k, "value": rec[k]} for k in HEADLINE_METRICS if rec.get(k) is not None), None)
    step, rid = rec.get("step"), rec.get("rollout_id")
    return (step if isinstance(step, int) else None, rid if isinstance(rid, int) else None, metric)


def metrics_tail(tp: TaskPaths) -> tuple[int | None, int | None, dict[str, Any] | None]:
    """(step, rollout_id, headline metric) of the last complete metrics line, reading only the tail."""
    records, _ = _records(tp.metrics)
    return _headline(records[0]) if records else (None, None, None)


def _eval_name(rec: dict[str, Any]) -> str | None:
    keys = [k for k in rec if k.startswith("eval/") and _num(rec[k])]
    for pick in (
        lambda k: k == "eval/accuracy",
        lambda k: k.endswith("/accuracy"),
        lambda k: k.endswith("/reward"),
        lambda k: True,
    ):
        found = next((k for k in keys if pick(k)), None)
        if found:
            return found
    return None


def _first_eval(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    for rec in records:
        name = _eval_name(rec)
        if name:
            rid = rec.get("rollout_id")
            return {"name": name, "value": rec[name], "rollout_id": rid if isinstance(rid, int) else None}
    return None


def latest_eval(tp: TaskPaths, tail: tuple[list[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
    """The newest eval metric: ``eval/accuracy``, else a set's accuracy, else its reward.
    Evals run every few rollouts, so past the usual tail up to 1 MiB of the file is read.
    ``tail``: the usual tail's records (newest first) and whether they are the whole file."""
    records, whole = tail if tail is not None else _records(tp.metrics)
    found = _first_eval(records)
    if found is None and not whole:
        found = _first_eval(_records(tp.metrics, _EVAL_TAIL_BYTES)[0])
    return found


def _samples_per_rollout(tp: TaskPaths) -> int | None:
    from slime.spec.task import load_task_spec

    try:
        rollout = load_task_spec(tp.resolved).rollout
    except ValueError:
        return None
    return rollout.batch_size * rollout.n_samples_per_prompt


def throughput(tp: TaskPaths, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``{"name", "value", "unit"}``: the runtime's ``perf/*`` rate if the newest lines have one,
    else response tokens per second of step time over the last lines (see the module doc)."""
    window = records[:THROUGHPUT_WINDOW]
    for rec in window:
        for pattern, unit in _PERF_UNITS:
            keys = sorted((k for k in rec if pattern.match(k) and _num(rec[k])), key=lambda k: (k.count("/"), k))
            if keys:
                return {"name": keys[0], "value": rec[keys[0]], "unit": unit}
    steps = [
        r
        for r in window
        if _num(r.get("time/step_s")) and _num(r.get("rollout/response_len_mean")) and r.get("rollout_id", -1) >= 0
    ]
    seconds = sum(r["time/step_s"] for r in steps)
    samples = _samples_per_rollout(tp) if steps and seconds > 0 else None
    if not samples:
        return None
    tokens = sum(r["rollout/response_len_mean"] * samples for r in steps)
    return {"name": "response tokens / step time", "value": tokens / seconds, "unit": "tok/s"}


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
    """Add what SLURM cannot know to ``ts``: last step/metric, newest eval, throughput, progress,
    elapsed time (from ``ts.started``/``ts.ended`` when the launcher set them, else the runtime's
    ``state.json``) and restart causes."""
    records, whole = _records(tp.metrics)
    if records:
        ts.step, ts.rollout_id, ts.metric = _headline(records[0])
        ts.eval = latest_eval(tp, (records, whole))
        ts.throughput = throughput(tp, records)
    ts.restart_causes = restart_causes(tp)
    ts.restarts = max(ts.restarts, len(ts.restart_causes))
    rt = runtime_state(tp) or {}
    if isinstance(rt.get("num_rollouts"), int):
        ts.num_rollouts = rt["num_rollouts"]
    if ts.started is None and _num(rt.get("started")):
        ts.started = float(rt["started"])
        if not ts.state.is_active and ts.ended is None and _num(rt.get("updated")):
            ts.ended = float(rt["updated"])
    if ts.started is not None:
        end = ts.ended if ts.ended is not None else (time.time() if ts.state.is_active else None)
        ts.elapsed_s = max(0.0, end - ts.started) if end is not None else None
    return ts


def task_count(paths: RunPaths) -> int:
    """The run's task count: ``jobs.json``'s, else the task dirs present (at least 1)."""
    n = paths.read_jobs().get("tasks")
    return n if isinstance(n, int) and n > 0 else max(1, len(paths.task_indices()))
