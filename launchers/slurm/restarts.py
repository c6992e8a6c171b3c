"""Restarts of a SLURM task: why it stopped, whether it may run again, one record per restart.

The batch script calls ``python -m launchers.slurm.restarts start|after RUN_DIR --task N``
(``step-rc`` prints the head's step exit code). ``start`` records the cause of a restart SLURM made
itself (read from slurmstepd's log lines) and refuses to run (exit 3) once ``cluster.slurm.
max_requeues``/``max_failures`` are spent, so a job cannot loop for ever. ``after`` classifies the
step's exit and requeues within budget. Each restart is one line of ``tasks/<i>/restarts.jsonl``.
Not guaranteed: a cause when the batch host died (recorded ``unknown``, counted as a failure); exact
counts if two runs of one task write at once (SLURM never runs one job id twice at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launchers.status import metrics_tail, runtime_state
from slime.core.errors import ExitCode
from slime.core.paths import RunPaths, TaskPaths, atomic_write, read_jsonl
from slime.core.rendezvous import Rendezvous
from slime.core.states import RunState

__all__ = [
    "FAILURE_CAUSES",
    "REQUEUE_CAUSES",
    "STALL_CAUSES",
    "Budget",
    "after",
    "append",
    "bad_nodes",
    "budget",
    "cause_from_log",
    "main",
    "previous_run_log",
    "read",
    "start",
    "step_rc",
    "usr1_cause",
]

#: restarts counted against cluster.slurm.max_requeues (the job was stopped, nothing failed)
REQUEUE_CAUSES = ("preempted", "requeued", "time_limit", "requeue_excluding")
#: restarts counted against cluster.slurm.max_failures
FAILURE_CAUSES = ("failure", "node_failure", "unknown")
#: restarts counted against cluster.slurm.max_stalls (the watchdog ended a job that made no progress: exit 124)
STALL_CAUSES = ("stall",)
TIME_LIMIT_SLACK_S = 90  # SLURM checks time limits periodically: USR1 may come this much early or late
_SLURM_CAUSES = (
    ("DUE TO PREEMPTION", "preempted"),
    ("DUE TO JOB REQUEUE", "requeued"),
    ("DUE TO NODE FAIL", "node_failure"),
)
_STEPD = re.compile(
    r"^slurmstepd[^:]*: error: \*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED AT \S+ (DUE TO [A-Z ]+?)"
    r"(?:,| \*\*\*)",
    re.M,
)


def _start_line(task: int) -> re.Pattern[str]:
    return re.compile(rf"^slime: job \S+ task {task} on .*$", re.M)


@dataclass(frozen=True, slots=True)
class Budget:
    requeues: int
    failures: int
    max_requeues: int
    max_failures: int
    stalls: int = 0
    max_stalls: int = 1

    def spent(self) -> str | None:
        """Why the task must not run again, or None."""
        if self.requeues > self.max_requeues:
            return (
                f"it was restarted {self.requeues} times after preemptions/time limits/requeues, more than "
                f"cluster.slurm.max_requeues={self.max_requeues}"
            )
        if self.failures > self.max_failures:
            return (
                f"it was restarted {self.failures} times after failures, more than "
                f"cluster.slurm.max_failures={self.max_failures}"
            )
        if self.stalls > self.max_stalls:
            return (
                f"it was restarted {self.stalls} times after stalls, more than cluster.slurm.max_stalls="
                f"{self.max_stalls}"
            )
        return None

    def allows(self, kind: str) -> bool:
        """Whether one more restart of ``kind`` (requeues|failures|stalls) fits the budget."""
        if kind == "stalls":
            return self.stalls < self.max_stalls
        return self.requeues < self.max_requeues if kind == "requeues" else self.failures < self.max_failures

    def words(self) -> str:
        return (
            f"requeues {self.requeues}/{self.max_requeues} (cluster.slurm.max_requeues), "
            f"failures {self.failures}/{self.max_failures} (cluster.slurm.max_failures), "
            f"stalls {self.stalls}/{self.max_stalls} (cluster.slurm.max_stalls)"
        )


def kind_of(cause: str) -> str:
    if cause in STALL_CAUSES:
        return "stalls"
    return "requeues" if cause in REQUEUE_CAUSES else "failures"


# ----------------------------------------------------------------------------- the record
def read(tp: TaskPaths) -> list[dict[str, Any]]:
    return read_jsonl(tp.restarts)  # a torn line of a run killed while appending: skipped, never fatal


def append(tp: TaskPaths, record: dict[str, Any]) -> dict[str, Any]:
    """Add one restart record (whole-file atomic rewrite: readers never see half a line)."""
    record = {"time": round(time.time(), 3), **record, "budget": kind_of(str(record.get("cause")))}
    prior = tp.restarts.read_text() if tp.restarts.exists() else ""
    if prior and not prior.endswith("\n"):
        prior += "\n"
    atomic_write(tp.restarts, prior + json.dumps(record, sort_keys=True) + "\n")
    return record


def budget(records: list[dict[str, Any]], cluster: dict[str, Any]) -> Budget:
    kinds = [kind_of(str(r.get("cause"))) for r in records]
    return Budget(
        requeues=kinds.count("requeues"),
        failures=kinds.count("failures"),
        max_requeues=int(cluster.get("max_requeues", 5)),
        max_failures=int(cluster.get("max_failures", 0)),
        stalls=kinds.count("stalls"),
        max_stalls=int(cluster.get("max_stalls", 1)),
    )


def _cluster(tp: TaskPaths) -> dict[str, Any]:
    try:
        doc = json.loads(tp.resolved.read_text())
        cluster = doc["spec"]["cluster"]
        return dict(cluster.get("slurm") or cluster)  # a run dir written before spec v2: the flat v1 section
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"slime: cannot read the task's resolved spec {tp.resolved}: {exc}") from None


def _progress(tp: TaskPaths) -> dict[str, Any]:
    """Step/rollout reached and the checkpoint a restart resumes from (the runtime's own records)."""
    step, rollout_id, _ = metrics_tail(tp)
    rt = runtime_state(tp) or {}
    return {"step": step, "rollout_id": rollout_id, "checkpoint": rt.get("checkpoint")}


# ----------------------------------------------------------------------------- evidence
def previous_run_log(log_text: str, task: int) -> str:
    """The part of the (appended) job log written by the run before the current one."""
    starts = [m.start() for m in _start_line(task).finditer(log_text)]
    if len(starts) < 2:
        return ""
    return log_text[starts[-2] : starts[-1]]


def cause_from_log(text: str) -> tuple[str | None, str | None]:
    """(cause, slurmstepd's line) from a run's log: why SLURM ended it, if it said."""
    for m in _STEPD.finditer(text):
        for words, cause in _SLURM_CAUSES:
            if m.group(2).startswith(words):
                return cause, m.group(0).strip()
    return None, None


def bad_nodes(tp: TaskPaths, instance: str) -> list[str]:
    """Nodes the bootstrap of run ``instance`` (``<job>.<restart>``) recorded as failed: their own
    rendezvous records, and the nodes the head's report (``preflight.json``) names."""
    hosts = Rendezvous(tp.rendezvous, instance).failed_hosts()
    try:
        pre = json.loads(tp.preflight_json.read_text())
    except (OSError, ValueError):
        pre = {}
    if isinstance(pre, dict) and pre.get("instance") == instance and pre.get("ok") is False:
        hosts += [str(h) for h in pre.get("bad_nodes") or []]
    return sorted(set(hosts))


def _slurm_time(text: str | None) -> float | None:
    if not text or text in ("None", "Unknown", "(null)"):
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def usr1_cause(record: dict[str, str], grace_s: float, now: float | None = None) -> str:
    """Why USR1 came, from the job's scontrol record: preempted (PreemptTime set), time_limit (the
    end is within the warning window), else requeued (a user sent it)."""
    if _slurm_time(record.get("PreemptTime")) is not None:
        return "preempted"
    end = _slurm_time(record.get("EndTime"))
    now = time.time() if now is None else now
    if end is not None and end - now <= grace_s + TIME_LIMIT_SLACK_S:
        return "time_limit"
    return "requeued"


# ----------------------------------------------------------------------------- decisions
def _env_int(name: str) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else 0


def _refuse(tp: TaskPaths, message: str) -> int:
    print(f"slime: {message}", flush=True)
    doc = runtime_state(tp) or {}
    doc.update(state=RunState.FAILED, exit_code=ExitCode.INFRA, error=message, updated=time.time())
    atomic_write(tp.state, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return ExitCode.INFRA


def _blame(tp: TaskPaths, hosts: list[str], instance: str) -> None:
    records = Rendezvous(tp.rendezvous, instance).node_records()
    errors = [str(r["error"]).splitlines()[0] for r in records if r.get("host") in hosts and r.get("error")]
    doc = runtime_state(tp) or {}
    words = f"node failure on {', '.join(hosts)}" + (f" ({'; '.join(errors)})" if errors else "")
    if words not in str(doc.get("error") or ""):
        doc["error"] = words + (f"; then: {doc['error']}" if doc.get("error") else "")
        doc.update(state=RunState.FAILED, updated=time.time())
        atomic_write(tp.state, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def start(run_dir: Path, task: int, *, job_id: str, restart: int, log: Path | None = None) -> int:
    """Record an unrecorded SLURM-initiated restart, then refuse (exit 3) when a budget is spent."""
    tp = RunPaths(run_dir).task(task)
    cluster = _cluster(tp)
    records = read(tp)
    if restart > 0 and not any(r.get("restart") == restart and str(r.get("job_id")) == job_id for r in records):
        text = ""
        try:
            text = (log or _log_path(run_dir, task)).read_text(errors="replace")
        except (OSError, ValueError, AttributeError):
            text = ""
        prev = previous_run_log(text, task)
        cause, line = cause_from_log(prev)
        prev_nodes = re.search(r" on (\S+) \(restart", prev)
        rec: dict[str, Any] = {
            "job_id": job_id,
            "restart": restart,
            "cause": cause or "unknown",
            "by": "slurm",
            "nodes": prev_nodes.group(1) if prev_nodes else None,
            **_progress(tp),
        }
        bad = bad_nodes(tp, f"{job_id}.{restart - 1}")
        if cause == "node_failure" or (cause is None and bad):
            rec["cause"] = "node_failure"
            rec["bad_nodes"] = bad or None  # slurmstepd's "ON <host>" is the batch host, not the failed node
        rec["detail"] = line or (
            "SLURM requeued the job without saying why in its log (the batch host may have died)"
            if cause is None
            else None
        )
        rec = append(tp, rec)
        records.append(rec)
    b = budget(records, cluster)
    why = b.spent()
    if why:
        return _refuse(
            tp,
            f"task {task} will not run again: {why}. Its restarts: "
            f"{', '.join(str(r.get('cause')) for r in records)} (see {tp.restarts}). Fix: find out "
            "why it keeps stopping; to go on, resubmit with train.checkpoint.load pointing at its "
            f"newest checkpoint under {tp.checkpoints}, or raise the budget",
        )
    if restart > 0:
        last = records[-1] if records else {}
        print(f"slime: restart {restart} of task {task} (cause: {last.get('cause', '?')}; {b.words()})", flush=True)
    return 0


def _log_path(run_dir: Path, task: int) -> Path | None:
    from launchers.slurm.jobs import log_path
    from slime.core.errors import InfraError

    try:
        return log_path(RunPaths(run_dir), task)
    except InfraError:
        return None


def _job_record(job_id: str) -> dict[str, str] | None:
    from launchers.slurm.cluster import _run, parse_record

    proc = _run(["scontrol", "show", "job", "-o", job_id], timeout=20)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    return parse_record(lines[0]) if proc.returncode == 0 and lines else None


def _requeue(target: str) -> str | None:
    from launchers.slurm.cluster import _run

    proc = _run(["scontrol", "requeue", target], timeout=30, ignore_term=True)
    return None if proc.returncode == 0 else (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")


def _running_record(job_id: str, task: int, restart: int) -> dict[str, str] | None:
    """The job's scontrol record while this run of it may still decide (None, said why, otherwise)."""
    try:
        rec = _job_record(job_id)
    except Exception as exc:  # noqa: BLE001 - no controller: do not requeue blind
        rec, err = None, str(exc)
    else:
        err = "scontrol does not know the job"
    if rec is None:
        print(f"slime: not requeueing task {task}: cannot read job {job_id} from slurmctld ({err})", flush=True)
        return None
    restarts = rec.get("Restarts", "0")
    if rec.get("JobState") != "RUNNING" or (restarts.isdigit() and int(restarts) > restart):
        print(
            f"slime: job {job_id} is {rec.get('JobState')} (restarts {restarts}): SLURM is ending or requeueing "
            "it; nothing to do here",
            flush=True,
        )
        return None
    return rec


def node_failure(tp: TaskPaths, instance: str) -> tuple[str, list[str], str] | None:
    """(stage, nodes, error) when run ``instance``'s bootstrap or preflight failed naming nodes: the
    report the head's bootstrap wrote (``preflight.json``; its ``stage`` is ``bootstrap`` when Ray
    never came up), else None."""
    try:
        pre = json.loads(tp.preflight_json.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(pre, dict) or pre.get("instance") != instance or pre.get("ok") is not False:
        return None
    hosts = [str(h) for h in pre.get("bad_nodes") or []]
    return (str(pre.get("stage") or "preflight"), hosts, str(pre.get("error") or "")) if hosts else None


def requeue_excluding(tp: TaskPaths, cluster: dict[str, Any], *, job_id: str, restart: int, nodes: str | None) -> bool:
    """``cluster.slurm.on_preflight_failure: requeue_excluding``: after a bootstrap/preflight failure that
    named nodes, requeue the job with them excluded while ``cluster.slurm.max_requeues`` allows (the job
    moves away from a bad node; it is not retried on it). True when the job was requeued."""
    failure = node_failure(tp, f"{job_id}.{restart}")
    if cluster.get("on_preflight_failure") != "requeue_excluding" or failure is None:
        return False
    stage, hosts, error = failure
    b = budget(read(tp), cluster)
    if not b.allows("requeues"):
        print(
            f"slime: not requeueing excluding {', '.join(hosts)}: cluster.slurm.max_requeues allows no more "
            f"({b.words()})",
            flush=True,
        )
        return False
    record = {"cause": "requeue_excluding", "by": "slime", "stage": stage, "excluded": hosts, "bad_nodes": hosts}
    append(tp, {**record, "job_id": job_id, "restart": restart + 1, "nodes": nodes, "detail": error[:500]})
    from launchers.slurm.cluster import requeue_excluding as requeue
    from slime.core.errors import InfraError

    try:
        requeue(job_id, hosts)
    except InfraError as exc:
        print(f"slime: could not requeue: {exc}", flush=True)
        return False
    print(f"slime: requeued job {job_id} excluding {', '.join(hosts)}", flush=True)
    return True


def _cause(
    tp: TaskPaths, rc: int, rec: dict[str, str], signal_name: str | None, cluster: dict[str, Any], instance: str
) -> tuple[str, str, list[str]]:
    """(cause, detail, bad nodes) of a step that ended with ``rc``."""
    if rc == ExitCode.REQUEUE:
        cause = usr1_cause(rec, float(cluster.get("signal_grace_s", 120))) if signal_name == "USR1" else "requeued"
        detail = {
            "preempted": f"preempted (PreemptTime {rec.get('PreemptTime')}); checkpoint saved in the grace time",
            "time_limit": f"time limit {rec.get('TimeLimit')} near (EndTime {rec.get('EndTime')})",
            "requeued": "stopped on request (USR1) after a checkpoint",
        }[cause]
        return cause, detail, []
    if rc == ExitCode.STALL:
        return "stall", "no progress within cluster.stall_timeout_s (stacks in tasks/<i>/diagnosis/)", []
    bad = bad_nodes(tp, instance)
    detail = f"exit code {rc}" + (f" after a failure on {', '.join(bad)}" if bad else "")
    return ("node_failure" if bad else "failure"), detail, bad


def step_rc(run_dir: Path, task: int, *, rc: int, instance: str) -> int:
    """The step's exit code as the job's: the head's own, which it records in the rendezvous when it finishes
    (``done-<instance>``), else ``rc`` (srun's). srun reports the highest exit code of its tasks, and a worker
    node it stopped after the head ended (``--kill-on-bad-exit``) could report 143 over the head's 3 or 75."""
    head = Rendezvous(RunPaths(run_dir).task(task).rendezvous, instance).done_rc()
    return rc if head is None else head


def after(
    run_dir: Path,
    task: int,
    *,
    rc: int,
    signal_name: str | None,
    job_id: str,
    restart: int,
    target: str,
    nodes: str | None = None,
) -> int:
    """Decide what follows the step's exit ``rc`` (see the module doc); returns ``rc``."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # our own requeue TERMs the job: finish the record first
    tp = RunPaths(run_dir).task(task)
    if rc == 0:
        return 0
    cluster = _cluster(tp)
    rec = _running_record(job_id, task, restart)
    if rec is None:
        return rc
    if rc != ExitCode.REQUEUE and requeue_excluding(tp, cluster, job_id=job_id, restart=restart, nodes=nodes):
        return rc
    records = read(tp)
    b = budget(records, cluster)
    cause, detail, bad = _cause(tp, rc, rec, signal_name, cluster, f"{job_id}.{restart}")
    kind = kind_of(cause)
    if not b.allows(kind):
        limit = f"cluster.slurm.max_{kind}"
        message = f"task {task} stopped ({cause}: {detail}) and is not requeued: {limit} allows no more ({b.words()})"
        if rc == ExitCode.REQUEUE:
            _refuse(tp, message)  # state.json said "preempted": say why it stays stopped
        else:
            print(f"slime: {message}", flush=True)
            if bad:  # status shows state.json's error: let it name the node, not only the symptom
                _blame(tp, bad, f"{job_id}.{restart}")
        return rc
    progress = _progress(tp)
    record = {"job_id": job_id, "restart": restart + 1, "cause": cause, "by": "slime", "nodes": nodes}
    record = append(tp, {**record, "bad_nodes": bad or None, "detail": detail, **progress})
    failed = _requeue(target)
    if failed:
        print(f"slime: could not requeue job {target}: {failed}", flush=True)
        return rc
    print(
        f"slime: requeued job {target} ({record['cause']}: {detail}; {budget(records + [record], cluster).words()})",
        flush=True,
    )
    return rc


# ----------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launchers.slurm.restarts", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("start", "after", "step-rc"):
        s = sub.add_parser(name)
        s.add_argument("run_dir", type=Path)
        s.add_argument("--task", type=int, required=True)
        if name == "step-rc":
            s.add_argument("--rc", type=int, required=True, help="srun's exit code")
        if name == "start":
            s.add_argument(
                "--log",
                type=Path,
                default=None,
                help="the job's log, read for SLURM's reason (default: from jobs.json)",
            )
        if name == "after":
            s.add_argument("--rc", type=int, required=True)
            s.add_argument("--signal", default="", help="the signal the batch shell got (USR1, TERM or empty)")
    args = p.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    restart = _env_int("SLURM_RESTART_COUNT")
    nodes = os.environ.get("SLURM_JOB_NODELIST")
    if args.cmd == "start":
        return start(args.run_dir, args.task, job_id=job_id, restart=restart, log=args.log)
    if args.cmd == "step-rc":
        print(step_rc(args.run_dir, args.task, rc=args.rc, instance=f"{job_id}.{restart}"))
        return 0
    array, index = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    target = f"{array}_{index}" if array and index else job_id
    return after(
        args.run_dir,
        args.task,
        rc=args.rc,
        signal_name=args.signal or None,
        job_id=job_id,
        restart=restart,
        target=target,
        nodes=nodes,
    )


if __name__ == "__main__":
    sys.exit(main())
