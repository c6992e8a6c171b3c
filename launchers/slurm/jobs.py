"""SLURM job management: per-task state of a run, cancel, log locations, job id → run dir.

A task's state comes from the first source that knows it: ``scontrol show job`` (``squeue -t all``
for ``list``), then the job completion log (``sacct -c``, which needs no slurmdbd), then the run
dir's own records (``launchers.status``). ``STATE_MAP`` is the one table from SLURM states to
``slime.core.states.RunState``; restarts are the larger of SLURM's count and ``restarts.jsonl``.
Logs: the batch log under ``logs/`` and the bootstrap's per-node logs under ``tasks/<i>/logs/``.
Not guaranteed: states of jobs purged from slurmctld and absent from a completion log (a job killed
hard may show as "unknown").
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from launchers.slurm.cluster import _run, parse_record
from launchers.status import (
    CancelResult,
    RunStatus,
    TaskStatus,
    aggregate,
    fill_from_records,
    run_name,
    run_started,
    runtime_state,
    task_count,
)
from slime.core.errors import InfraError
from slime.core.paths import RunPaths
from slime.core.states import RunState

__all__ = [
    "DEFAULT_SOURCES",
    "SACCT_FIELDS",
    "SQUEUE_FORMAT",
    "STATE_MAP",
    "cancel",
    "dropped_tasks",
    "expand_task_ids",
    "explain_reason",
    "find_run",
    "log_files",
    "log_path",
    "map_state",
    "parse_sacct",
    "parse_scontrol",
    "parse_squeue",
    "plain_job_id",
    "run_states",
    "run_status",
    "task_from_run_dir",
    "task_layout",
    "tasks_from_jobcomp",
    "tasks_from_records",
]

#: SLURM job state → ours. The one table; anything missing maps to RunState.UNKNOWN.
STATE_MAP: dict[str, RunState] = {
    "PENDING": RunState.PENDING,
    "RESV_DEL_HOLD": RunState.PENDING,
    "CONFIGURING": RunState.RUNNING,
    "RUNNING": RunState.RUNNING,
    "COMPLETING": RunState.RUNNING,
    "STAGE_OUT": RunState.RUNNING,
    "RESIZING": RunState.RUNNING,
    "SIGNALING": RunState.RUNNING,
    "COMPLETED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "NODE_FAIL": RunState.FAILED,
    "OUT_OF_MEMORY": RunState.FAILED,
    "BOOT_FAIL": RunState.FAILED,
    "DEADLINE": RunState.FAILED,
    "SPECIAL_EXIT": RunState.FAILED,
    "TIMEOUT": RunState.TIMEOUT,
    "CANCELLED": RunState.CANCELLED,
    "REVOKED": RunState.CANCELLED,
    "PREEMPTED": RunState.REQUEUED,
    "REQUEUED": RunState.REQUEUED,
    "REQUEUE_HOLD": RunState.REQUEUED,
    "REQUEUE_FED": RunState.REQUEUED,
    "SUSPENDED": RunState.SUSPENDED,
    "STOPPED": RunState.SUSPENDED,
}
# squeue's compact codes (%t) for the same states
_SHORT = {
    "PD": "PENDING",
    "CF": "CONFIGURING",
    "R": "RUNNING",
    "CG": "COMPLETING",
    "SO": "STAGE_OUT",
    "RS": "RESIZING",
    "SI": "SIGNALING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
    "BF": "BOOT_FAIL",
    "DL": "DEADLINE",
    "SE": "SPECIAL_EXIT",
    "TO": "TIMEOUT",
    "CA": "CANCELLED",
    "RV": "REVOKED",
    "PR": "PREEMPTED",
    "RQ": "REQUEUED",
    "RH": "REQUEUE_HOLD",
    "RF": "REQUEUE_FED",
    "S": "SUSPENDED",
    "ST": "STOPPED",
    "RD": "RESV_DEL_HOLD",
}

#: why a job waits, in words (SkyPilot-style: say what to do about it)
REASONS: dict[str, str] = {
    "Resources": "waiting for free nodes/GPUs (the partition is busy)",
    "Priority": "other jobs in the queue have higher priority",
    "Dependency": "waiting for the job it depends on",
    "DependencyNeverSatisfied": "its dependency can never be met: cancel it",
    "JobArrayTaskLimit": "sweep.max_parallel tasks are already running",
    "JobHeldUser": "held by a user: `scontrol release <job>` to let it run",
    "JobHeldAdmin": "held by an administrator",
    "BeginTime": "not allowed to start yet (a requeued job waits a few seconds)",
    "ReqNodeNotAvail": "a required node is down, drained or reserved",
    "PartitionDown": "the partition is down",
    "PartitionNodeLimit": "asks for more nodes than the partition allows",
    "PartitionTimeLimit": "cluster.slurm.time_limit exceeds the partition's limit",
    "NodeDown": "a node it needs is down",
    "BadConstraints": "no node matches the constraints: check cluster.slurm.constraint/gpus_per_node/mem",
    "QOSMaxJobsPerUserLimit": "your QOS job limit is reached",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "AssocMaxJobsLimit": "your account's job limit is reached",
    "launch failed requeued held": "the launch failed and SLURM held the job: check the nodes, then release it",
}
DEFAULT_SOURCES = ("scontrol", "jobcomp", "rundir")
SQUEUE_FORMAT = "%i|%A|%F|%K|%T|%r|%N|%Z"
SACCT_FIELDS = "jobid,state,exitcode,nodelist,start,end,workdir"
_START = re.compile(r"^slime: job (\d+) task (\d+)", re.M)
_END = re.compile(r"^slime: task (\d+) finished with exit code (\d+)", re.M)


def map_state(slurm_state: str | None) -> RunState:
    """``'CANCELLED by 0'``, ``'CA'``, ``'RUNNING'`` → our state (``UNKNOWN`` when unmapped)."""
    word = (slurm_state or "").split()[0].rstrip("+") if (slurm_state or "").split() else ""
    return STATE_MAP.get(_SHORT.get(word, word), RunState.UNKNOWN)


def explain_reason(reason: str | None) -> str | None:
    """``'Resources'`` → ``'Resources: waiting for free nodes/GPUs ...'``; None for no reason."""
    if not reason or reason in ("None", "(null)"):
        return None
    words = REASONS.get(reason)
    return f"{reason}: {words}" if words else reason


def expand_task_ids(text: str | None) -> list[int]:
    """Array task ids as SLURM prints them (``'3'``, ``'0-2%1'``, ``'[1,4-5%2]'``) → sorted ints."""
    if not text or text in ("N/A", "(null)"):
        return []
    out: set[int] = set()
    for part in text.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


# ----------------------------------------------------------------------------- parsing
def parse_scontrol(text: str) -> list[dict[str, str]]:
    """``scontrol show job -o`` output → one record per line."""
    return [parse_record(line) for line in text.splitlines() if line.strip()]


def parse_squeue(text: str) -> list[dict[str, str]]:
    """``squeue -h -t all -o SQUEUE_FORMAT`` → records with scontrol's key names."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 7)
        if len(parts) < 8:
            continue
        _, jid, array_id, task_ids, state, reason, nodes, workdir = parts
        rec = {
            "JobId": jid.strip(),
            "JobState": state.strip(),
            "Reason": reason.strip(),
            "NodeList": nodes.strip(),
            "WorkDir": workdir.rstrip("\n"),
        }
        if task_ids.strip() not in ("", "N/A"):
            rec.update(ArrayJobId=array_id.strip(), ArrayTaskId=task_ids.strip())
        out.append(rec)
    return out


def parse_sacct(text: str) -> dict[str, list[dict[str, str]]]:
    """``sacct -c -n -P -o SACCT_FIELDS`` → rows by plain job id, in log order (one per run)."""
    out: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 6)  # WorkDir is last: it may itself contain '|'
        if len(parts) < 7:
            continue
        jid, state, code, nodes, start, end, workdir = parts
        out.setdefault(jid.strip(), []).append(
            {
                "JobId": jid.strip(),
                "JobState": state.strip(),
                "ExitCode": code,
                "NodeList": nodes,
                "StartTime": start,
                "EndTime": end,
                "WorkDir": workdir,
            }
        )
    return out


# ----------------------------------------------------------------------------- layout
def task_layout(jobs: dict[str, Any], n_tasks: int) -> dict[int, tuple[str, int | None]]:
    """Task → (SLURM job id, array index or None) from ``jobs.json``."""
    arrays = jobs.get("arrays") or []
    if arrays:
        layout: dict[int, tuple[str, int | None]] = {}
        for a in arrays:
            for t in range(int(a["first_task"]), int(a["last_task"]) + 1):
                layout[t] = (str(a["job_id"]), t - int(a["first_task"]))
        return layout
    ids = [str(j) for j in jobs.get("job_ids") or []]
    return {0: (ids[0], None)} if ids and n_tasks >= 1 else {}


def display_id(job_id: str, index: int | None) -> str:
    return job_id if index is None else f"{job_id}_{index}"


def _same_dir(a: str | None, b: Path) -> bool:
    if not a or a in ("(null)", "Unknown"):
        return True  # nothing to compare with: accept
    return os.path.realpath(a) == os.path.realpath(b)


def _null(v: str | None) -> str | None:
    return None if v in (None, "", "(null)", "None", "N/A", "Unknown") else v


def _reason_for(state: RunState, rec: dict[str, str]) -> str | None:
    reason = rec.get("Reason")
    if state in (RunState.PENDING, RunState.REQUEUED, RunState.SUSPENDED):
        return explain_reason(reason)
    if state in (RunState.FAILED, RunState.TIMEOUT) and _null(reason):
        return f"{reason} (exit code {rec.get('ExitCode', '?')})"
    if state == RunState.CANCELLED and reason == "DependencyNeverSatisfied":  # a chain step (--kill-on-invalid-dep)
        return f"never started: the job it depends on did not end as required ({rec.get('Dependency', '?')})"
    return None


def tasks_from_records(
    records: Iterable[dict[str, str]],
    layout: dict[int, tuple[str, int | None]],
    run_dir: Path,
    source: str = "scontrol",
) -> dict[int, TaskStatus]:
    """Task states from scontrol (or squeue) records of the run's jobs."""
    inverse = {key: t for t, key in layout.items()}
    out: dict[int, TaskStatus] = {}
    for rec in records:
        if not _same_dir(rec.get("WorkDir"), run_dir):
            continue  # a job id reused by another job
        if rec.get("ArrayJobId"):
            keys = [(rec["ArrayJobId"], i) for i in expand_task_ids(rec.get("ArrayTaskId"))]
        else:
            keys = [(rec.get("JobId", ""), None)]
        for key in keys:
            task = inverse.get(key)
            if task is None:
                continue
            raw = rec.get("JobState", "")
            state = map_state(raw)
            restarts = rec.get("Restarts", "0")
            out[task] = TaskStatus(
                task=task,
                state=state,
                scheduler_state=raw,
                source=source,
                job_id=display_id(*key),
                reason=_reason_for(state, rec),
                nodes=_null(rec.get("NodeList")),
                exit_code=_null(rec.get("ExitCode")),
                restarts=int(restarts) if restarts.isdigit() else 0,
            )
    return out


def dropped_tasks(
    records: Iterable[dict[str, str]],
    layout: dict[int, tuple[str, int | None]],
    paths: RunPaths,
    found: dict[int, TaskStatus],
    source: str = "scontrol",
) -> dict[int, TaskStatus]:
    """Array tasks that never started (no batch log) and are missing from the records of their still
    known array: SLURM drops an array task cancelled while it waits in the array's pending record,
    and keeps no other trace of it. (A task that ran and was purged earlier has a log: not this.)"""
    known = {r.get("ArrayJobId") for r in records if r.get("ArrayJobId") and _same_dir(r.get("WorkDir"), paths.root)}
    return {
        t: TaskStatus(
            task=t,
            state=RunState.CANCELLED,
            scheduler_state="CANCELLED",
            source=source,
            job_id=display_id(job, index),
            reason="cancelled before it started (SLURM keeps no record of such array tasks)",
        )
        for t, (job, index) in layout.items()
        if index is not None and job in known and t not in found and not log_path(paths, t, layout).exists()
    }


def _read_head(path: Path, n: int = 8192) -> str:
    try:
        with path.open("rb") as fh:
            return fh.read(n).decode("utf-8", "replace")
    except OSError:
        return ""


def _read_tail(path: Path, n: int = 8192) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def plain_job_id(paths: RunPaths, task: int, layout: dict[int, tuple[str, int | None]]) -> str | None:
    """The plain SLURM job id task ``task`` ran under, from the first line its script printed."""
    if task not in layout:
        return None
    for m in _START.finditer(_read_head(log_path(paths, task, layout))):
        if int(m.group(2)) == task:
            return m.group(1)
    return None


def tasks_from_jobcomp(
    rows: dict[str, list[dict[str, str]]],
    layout: dict[int, tuple[str, int | None]],
    plain: dict[int, str],
    run_dir: Path,
    tasks: Iterable[int],
) -> dict[int, TaskStatus]:
    """Task states from the job completion log (``sacct -c``); see the module doc for arrays."""
    claimed = set(plain.values())
    out: dict[int, TaskStatus] = {}
    for task in tasks:
        if task not in layout:
            continue
        job, index = layout[task]
        jid = job if index is None else plain.get(task) or (job if job not in claimed else None)
        runs = [r for r in rows.get(jid or "", []) if _same_dir(r.get("WorkDir"), run_dir)]
        if not runs:
            continue
        rec = runs[-1]
        raw = rec["JobState"]
        state = map_state(raw)
        out[task] = TaskStatus(
            task=task,
            state=state,
            scheduler_state=raw.split()[0] if raw else raw,
            source="jobcomp",
            job_id=display_id(job, index),
            nodes=_null(rec.get("NodeList")),
            exit_code=_null(rec.get("ExitCode")),
            restarts=len(runs) - 1,
            reason=f"exit code {rec.get('ExitCode')}" if state == RunState.FAILED else None,
        )
    return out


def _exit_words(rc: int) -> str:
    if rc > 128:
        try:
            return f"exit code {rc} (killed by {signal.Signals(rc - 128).name}: cancelled, preempted or timed out)"
        except ValueError:
            pass
    return f"exit code {rc}"


def task_from_run_dir(paths: RunPaths, task: int, layout: dict[int, tuple[str, int | None]]) -> TaskStatus:
    """What the run dir alone says about a task SLURM no longer knows."""
    tp = paths.task(task)
    key = layout.get(task)
    ts = TaskStatus(task=task, source="run dir", job_id=display_id(*key) if key else None)
    # no layout entry (jobs.json missing or damaged): no batch log to read, the other records still answer
    log = _read_tail(log_path(paths, task, layout)) if task in layout else ""
    ends = [m for m in _END.finditer(log) if int(m.group(1)) == task]
    rt = runtime_state(tp) or {}
    try:
        pre = json.loads(tp.preflight_json.read_text())
    except (OSError, ValueError):
        pre = {}
    if ends:
        rc = int(ends[-1].group(2))
        ts.exit_code = str(rc)
        ts.state = RunState.SUCCEEDED if rc == 0 else RunState.FAILED
        ts.scheduler_state = f"exit {rc}"
        if rc:
            ts.reason = rt.get("error") or (pre.get("error") if pre.get("ok") is False else None) or _exit_words(rc)
    elif task in ((paths.read_jobs().get("cancelled") or {}).get("tasks") or []):
        ts.state, ts.reason = RunState.CANCELLED, "cancelled with slime-submit cancel (SLURM no longer knows the job)"
    elif isinstance(pre, dict) and pre.get("ok") is False:
        ts.state, ts.reason = RunState.FAILED, f"preflight failed: {pre.get('error', '')}"
    elif rt.get("state") in (RunState.SUCCEEDED, RunState.FAILED):
        ts.state, ts.scheduler_state = RunState(rt["state"]), rt["state"]
        ts.reason = rt.get("error")
    else:
        ts.state = RunState.UNKNOWN
        ts.reason = f"SLURM no longer knows job {ts.job_id} and the run dir has no final record" + (
            f" (the runtime last said {rt.get('state')})" if rt.get("state") else ""
        )
    return ts


# ----------------------------------------------------------------------------- queries
def _scontrol(job_id: str) -> list[dict[str, str]]:
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    return parse_scontrol(proc.stdout) if proc.returncode == 0 else []  # rc 1: "Invalid job id" (purged)


def _sacct(job_ids: Sequence[str]) -> dict[str, list[dict[str, str]]]:
    if not job_ids:
        return {}
    proc = _run(["sacct", "-c", "-n", "-P", "-j", ",".join(sorted(set(job_ids))), "-o", SACCT_FIELDS])
    return parse_sacct(proc.stdout)  # stderr: "Unknown type ArrayJobId" noise from filetxt


def _status(
    paths: RunPaths, live: list[dict[str, str]] | None, sources: Sequence[str], live_source: str = "scontrol"
) -> RunStatus:
    doc = paths.read_jobs()
    n = task_count(paths)
    layout = task_layout(doc, n)
    found: dict[int, TaskStatus] = {}
    notes = []
    try:
        if live is None and "scontrol" in sources:
            live = [r for jid in dict.fromkeys(j for j, _ in layout.values()) for r in _scontrol(jid)]
        if live:
            found.update(tasks_from_records(live, layout, paths.root, live_source))
            found.update(dropped_tasks(live, layout, paths, found, live_source))
        missing = [t for t in range(n) if t not in found]
        if missing and "jobcomp" in sources:
            plain = {t: p for t in range(n) if (p := plain_job_id(paths, t, layout))}
            ids = {layout[t][0] for t in missing if t in layout} | {plain[t] for t in missing if t in plain}
            found.update(tasks_from_jobcomp(_sacct(sorted(ids)), layout, plain, paths.root, missing))
    except InfraError as exc:  # no SLURM client here, or slurmctld down: the run dir still answers
        notes.append(str(exc))
    tasks = []
    for t in range(n):
        ts = found.get(t) or task_from_run_dir(paths, t, layout)
        if t not in found and notes:
            ts.reason = f"{ts.reason or ''} ({notes[0]})".strip()
        ts.log = str(log_path(paths, t, layout)) if t in layout else None
        error = (runtime_state(paths.task(t)) or {}).get("error")
        if ts.state in (RunState.FAILED, RunState.TIMEOUT) and error and error not in (ts.reason or ""):
            ts.reason = f"{error} ({ts.reason})" if ts.reason else error  # the runtime says why, SLURM only how
        tasks.append(fill_from_records(ts, paths.task(t)))
    return RunStatus(
        run_dir=str(paths.root),
        name=run_name(paths),
        launcher="slurm",
        job_ids=[str(j) for j in doc.get("job_ids", [])],
        state=aggregate(t.state for t in tasks),
        started=run_started(paths),
        tasks=tasks,
        preflight_only=bool(doc.get("preflight_only")),
    )


def run_status(paths: RunPaths, sources: Sequence[str] = DEFAULT_SOURCES) -> RunStatus:
    """Every task's state (see the module doc for the sources; ``sources`` limits them, e.g. to
    ``("jobcomp", "rundir")`` to see what is known once slurmctld forgot the job)."""
    return _status(paths, None, sources)


def run_states(runs: list[RunPaths]) -> dict[Path, RunStatus]:
    """Status of many runs with one ``squeue`` call (and one ``sacct -c`` per run still unknown)."""
    ids = sorted({str(j) for p in runs for j in p.read_jobs().get("job_ids", [])})
    records: list[dict[str, str]] = []
    if ids:
        try:
            proc = _run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT])
            records = parse_squeue(proc.stdout) if proc.returncode == 0 else []
        except InfraError:
            records = []
    return {p.root: _status(p, records, ("jobcomp", "rundir"), "squeue") for p in runs}


def _task_ended(task: int, state: RunState) -> str:
    return f"task {task}'s state is unknown" if state == RunState.UNKNOWN else f"task {task} already ended ({state})"


def cancel(paths: RunPaths, task: int | None = None) -> CancelResult:
    """``scancel`` the run's jobs (every array), or one task (``JOB_INDEX`` of its array)."""
    status = run_status(paths)
    layout = task_layout(paths.read_jobs(), len(status.tasks))
    if task is not None and task not in range(len(status.tasks)):
        raise InfraError(f"--task {task}: run {paths.root} has tasks 0..{len(status.tasks) - 1}")
    tasks = [t for t in status.tasks if t.state.is_active and (task is None or t.task == task)]
    if task is not None and tasks and task not in layout:
        raise InfraError(f"run {paths.root} has no SLURM job for task {task} (jobs.json lists none)")
    if not tasks:
        what = _task_ended(task, status.tasks[task].state) if task is not None else f"the run is {status.state}"
        return CancelResult(run_dir=paths.root, state=status.state, tasks=(), message=f"nothing to cancel: {what}")
    if task is None:
        targets = sorted({layout[t.task][0] for t in tasks}, key=int)
    else:
        targets = [display_id(*layout[task])]
    proc = _run(["scancel", *targets])
    if proc.returncode != 0:
        raise InfraError(f"`scancel {' '.join(targets)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    doc = paths.read_jobs()  # a run-dir record of the cancel, for when SLURM has forgotten the job
    rec = doc.setdefault("cancelled", {})
    rec.update(
        at=time.time(),
        targets=sorted(set(rec.get("targets", [])) | set(targets)),
        tasks=sorted(set(rec.get("tasks", [])) | {t.task for t in tasks}),
    )
    paths.write_jobs(doc)
    return CancelResult(
        run_dir=paths.root, state=RunState.CANCELLED, cancelled=tuple(targets), tasks=tuple(t.task for t in tasks)
    )


def log_path(paths: RunPaths, task: int, layout: dict[int, tuple[str, int | None]] | None = None) -> Path:
    """The batch log of ``task`` (the ``--output`` of ``launchers.slurm.script.log_pattern``)."""
    layout = layout if layout is not None else task_layout(paths.read_jobs(), task_count(paths))
    if task not in layout:
        raise InfraError(f"run {paths.root} has no SLURM job for task {task} (jobs.json lists none)")
    job, index = layout[task]
    return paths.logs / (f"slurm-{job}.out" if index is None else f"slurm-{job}_{index}.out")


def log_files(paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
    """``--node``: that node's bootstrap logs; else the task's batch log (all nodes, stdout+stderr)."""
    if node is not None:
        tp = paths.task(task)
        return [p for p in (tp.node_log(node, "out"), tp.node_log(node, "err")) if p.exists()] or [tp.node_log(node)]
    return [log_path(paths, task)]


def find_run(job_id: str) -> tuple[Path, int | None] | None:
    """Run dir (and task) of SLURM job ``job_id`` (``123``, ``123_4``, or an array task's plain id),
    from the job's ``WorkDir`` (the launcher submits from the run dir): scontrol, else ``sacct -c``."""
    m = re.fullmatch(r"(\d+)(?:_(\d+))?", job_id.strip())
    if not m:
        return None
    jid, index = m.group(1), (int(m.group(2)) if m.group(2) else None)
    workdir, array_id = None, None
    for rec in _scontrol(jid):
        if rec.get("JobId") == jid or rec.get("ArrayJobId") == jid:
            workdir = rec.get("WorkDir")
            if rec.get("ArrayJobId") and index is None and rec.get("JobId") == jid:
                array_id = rec["ArrayJobId"]
                ids = expand_task_ids(rec.get("ArrayTaskId"))
                index = ids[0] if len(ids) == 1 and rec["ArrayJobId"] != jid else None
            break
    if workdir is None:
        rows = _sacct([jid]).get(jid, [])
        workdir = rows[-1].get("WorkDir") if rows else None
    if not workdir or not RunPaths(Path(workdir)).jobs.exists():
        return None
    paths = RunPaths(Path(workdir))
    layout = task_layout(paths.read_jobs(), task_count(paths))
    owner = array_id or jid
    if not any(j == owner for j, _ in layout.values()):
        # an array task's plain id that only the run dir's logs connect to the run
        plain = {t: plain_job_id(paths, t, layout) for t in layout}
        task = next((t for t, p in plain.items() if p == jid), None)
        return (paths.root, task) if task is not None else None
    task = next((t for t, key in layout.items() if key == (owner, index)), None) if index is not None else None
    return paths.root, task
