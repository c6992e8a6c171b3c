"""Talking to SLURM: sbatch, scontrol, sacct. Every failure is an InfraError naming the fix.

:func:`check_fits` says at submit which constraint (GPUs, CPUs, memory) no set of partition nodes
meets, :func:`check_dependencies` which ``depends_on`` job sbatch cannot wait for;
:func:`max_array_size` reads ``MaxArraySize``; :func:`sbatch` submits; :func:`job_records` and
:func:`wait_jobs` follow jobs (``scontrol show job``, then ``sacct -c`` once slurmctld forgot them);
:func:`requeue_excluding` requeues a running job and extends its ``ExcNodeList``, in that order.
submitit's job-state watcher is not used: it needs slurmdbd, which some clusters lack.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from slime.core.errors import InfraError
from slime.spec.types import Spec

__all__ = [
    "FINAL_STATES",
    "NodeInfo",
    "check_dependencies",
    "check_fits",
    "gres_gpus",
    "job_records",
    "max_array_size",
    "mem_mb",
    "parse_record",
    "partition_nodes",
    "requeue_excluding",
    "require_sbatch",
    "sbatch",
    "scontrol_records",
    "wait_jobs",
]

FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
DEFAULT_MAX_ARRAY_SIZE = 1001  # SLURM's default when the config cannot be read


def require_sbatch() -> str:
    path = shutil.which("sbatch")
    if path is None:
        raise InfraError(
            "sbatch is not on PATH: cluster.launcher is 'slurm' but this machine has no SLURM client. "
            "Run slime-submit on a login node of the cluster, or set cluster.launcher: local"
        )
    return path


def _ignore_term() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _run(
    args: Sequence[str],
    *,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    ignore_term: bool = False,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            input=input,
            cwd=cwd,
            preexec_fn=_ignore_term if ignore_term else None,
        )
    except FileNotFoundError:
        raise InfraError(f"{args[0]} is not installed or not on PATH (needed for cluster.launcher: slurm)") from None
    except subprocess.TimeoutExpired:
        raise InfraError(
            f"`{' '.join(args)}` did not answer within {timeout:.0f} s: is slurmctld up? (check with `scontrol ping`)"
        ) from None


def parse_record(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line as a dict (values may hold spaces)."""
    keys = list(_KEY.finditer(line))
    record = {}
    for m, nxt in zip(keys, keys[1:] + [None]):
        record[m.group(1)] = line[m.end() : nxt.start() if nxt else len(line)].strip()
    return record


def scontrol_records(*what: str) -> list[dict[str, str]]:
    proc = _run(["scontrol", "show", *what, "-o"])
    if proc.returncode != 0:
        raise InfraError(f"`scontrol show {' '.join(what)}` failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return [parse_record(line) for line in proc.stdout.splitlines() if line.strip()]


def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``)."""
    proc = _run(["scontrol", "show", "config"])
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", proc.stdout, flags=re.M)
    if proc.returncode != 0 or not m:
        return DEFAULT_MAX_ARRAY_SIZE
    return int(m.group(1))


def gres_gpus(gres: str) -> int:
    """GPUs in a ``Gres`` value: ``gpu:2``, ``gpu:a100:4(S:0-1)``, ``gpu:a:2,gpu:b:1`` → 2, 4, 3."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres or ""):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def mem_mb(mem: str) -> int:
    """SLURM memory text ('64G', '500M', '1T', '2048') in MiB."""
    m = re.fullmatch(r"(\d+)([KMGT]?)", mem)
    if not m:
        raise ValueError(f"not a SLURM memory size: {mem!r}")
    return int(int(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2)])


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    gpus: int
    cpus: int
    mem_mb: int
    state: str
    gres: str


def partition_nodes(partition: str | None) -> tuple[str, list[NodeInfo]]:
    """(partition name, its nodes) — the default partition when ``partition`` is None."""
    parts = scontrol_records("partition")
    if partition is None:
        default = next((p for p in parts if p.get("Default") == "YES"), None)
        if default is None:
            raise InfraError(
                "cluster.slurm.partition is not set and the cluster has no default partition; "
                f"set cluster.slurm.partition to one of: {', '.join(p.get('PartitionName', '?') for p in parts)}"
            )
        partition = default["PartitionName"]
    elif not any(p.get("PartitionName") == partition for p in parts):
        raise InfraError(
            f"cluster.slurm.partition {partition!r} does not exist on this cluster; partitions: "
            f"{', '.join(p.get('PartitionName', '?') for p in parts)}"
        )
    nodes = []
    for rec in scontrol_records("node"):
        if partition not in rec.get("Partitions", "").split(","):
            continue
        nodes.append(
            NodeInfo(
                name=rec.get("NodeName", "?"),
                gres=rec.get("Gres", ""),
                gpus=gres_gpus(rec.get("Gres", "")),
                cpus=int(rec.get("CPUTot", "0") or 0),
                mem_mb=int(rec.get("RealMemory", "0") or 0),
                state=rec.get("State", ""),
            )
        )
    return partition, nodes


def expand_hostlist(names: Sequence[str]) -> list[str]:
    """Node names with SLURM host lists (``gpu[03-05,07]``) expanded by ``scontrol show hostnames``,
    SLURM's own parser, so an exclude list means here what it means to sbatch."""
    if not any("[" in n for n in names):
        return list(names)
    proc = _run(["scontrol", "show", "hostnames", ",".join(names)])
    if proc.returncode != 0:
        raise InfraError(
            f"cluster.slurm.exclude {list(names)}: SLURM cannot read it as a host list: "
            f"{proc.stderr.strip() or proc.stdout.strip()}"
        )
    return proc.stdout.split()


def check_fits(spec: Spec, nodes: list[NodeInfo], partition: str) -> None:
    """Raise InfraError when ``cluster.nodes`` nodes of ``partition`` cannot hold one node's request."""
    c, sl = spec.cluster, spec.cluster.slurm
    excluded = set(expand_hostlist(sl.exclude))
    usable = [n for n in nodes if n.name not in excluded]
    cpus = c.cpus_per_node or max(1, c.gpus_per_node)
    need_mem = mem_mb(sl.mem) if sl.mem else 0
    have = ", ".join(f"{n.name} ({n.gres or 'no gres'}, {n.cpus} CPUs, {n.mem_mb} MB)" for n in usable) or "none"
    constraints = [
        (
            "cluster.gpus_per_node",
            c.gpus_per_node,
            lambda n: n.gpus >= c.gpus_per_node,
            f"gres gpu:{c.gpus_per_node} per node",
            max((n.gpus for n in usable), default=0),
            "GPUs",
        ),
        (
            "cluster.cpus_per_node",
            cpus,
            lambda n: n.cpus >= cpus,
            f"{cpus} CPUs per node",
            max((n.cpus for n in usable), default=0),
            "CPUs",
        ),
        (
            "cluster.slurm.mem",
            need_mem,
            lambda n: n.mem_mb >= need_mem,
            f"{sl.mem} memory per node",
            max((n.mem_mb for n in usable), default=0),
            "MB",
        ),
    ]
    for field, need, ok, what, best, unit in constraints:
        if need and not any(ok(n) for n in usable):
            raise InfraError(
                f"{field}={need if field != 'cluster.slurm.mem' else sl.mem}: no node of partition "
                f"{partition!r} offers {what} (the most is {best} {unit}; nodes: {have}). "
                f"SLURM could never start this job. Fix: lower {field} to at most "
                f"{best if field != 'cluster.slurm.mem' else str(best) + 'M'}, or choose another partition"
            )
    fitting = [n for n in usable if all(ok(n) for _, need, ok, *_ in constraints if need)]
    if len(fitting) < c.nodes:
        raise InfraError(
            f"cluster.nodes={c.nodes}: partition {partition!r} has only {len(fitting)} node(s) with "
            f"gres gpu:{c.gpus_per_node}, {cpus} CPUs"
            + (f", {sl.mem} memory" if sl.mem else "")
            + f" (nodes: {have}"
            + (f"; excluded: {', '.join(sorted(excluded))}" if excluded else "")
            + f"). Fix: set cluster.nodes <= {len(fitting)} or choose another partition"
        )


def _dependency_problem(job: str, when: str) -> str | None:
    """Why sbatch cannot wait for ``job`` (None: it can): unknown, or ended in a way that settles it."""
    proc = _run(["scontrol", "show", "job", "-o", job])
    live = [parse_record(line) for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []
    if live:
        failed = sorted({r.get("JobState", "?") for r in live} & (FINAL_STATES - {"COMPLETED", "PREEMPTED"}))
        if when == "ok" and failed:
            return (
                f"job {job} ended {'/'.join(failed)}, so a job waiting for its success would never start. "
                "Fix: set its when: any, or rerun that job first"
            )
        return None
    ended = sorted({r.get("JobState", "?") for r in job_records(job)})  # sacct -c: gone from slurmctld
    if ended:
        return (
            f"job {job} ended ({'/'.join(ended)}) and SLURM no longer tracks it, so sbatch cannot wait for it. "
            "Fix: remove the entry (nothing is left to wait for)"
        )
    return f"SLURM knows no job {job}. Fix: name a queued or running job (`slime-submit status RUN` shows its id)"


def check_dependencies(deps: Sequence) -> None:
    """Refuse ``cluster.slurm.depends_on`` entries sbatch would reject or that could never be met, naming each."""
    for i, dep in enumerate(deps):
        why = _dependency_problem(dep.job, dep.when)
        if why:
            raise InfraError(f"cluster.slurm.depends_on[{i}].job: {why}")


def sbatch(
    script: str,
    *,
    array: str | None = None,
    dependency: str | None = None,
    kill_on_invalid_dep: bool = False,
    extra_env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> str:
    """Submit ``script`` (a path) with ``sbatch --parsable``; return the job id."""
    cmd = ["sbatch", "--parsable"]
    if array is not None:
        cmd.append(f"--array={array}")
    if dependency is not None:
        cmd.append(f"--dependency={dependency}")
    if kill_on_invalid_dep:  # a dependency that can never be met ends the job instead of leaving it pending
        cmd.append("--kill-on-invalid-dep=yes")
    cmd.append(script)
    env = {**os.environ, **(extra_env or {})}
    proc = _run(cmd, env=env, timeout=120, cwd=cwd)
    if proc.returncode != 0:
        raise InfraError(f"sbatch refused the job ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise InfraError(f"sbatch printed no job id: {proc.stdout.strip()!r} {proc.stderr.strip()!r}")
    return job_id


def job_records(job_id: str) -> list[dict[str, str]]:
    """A job's records (one per array task): scontrol, else the job completion log (``sacct -c``)."""
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if proc.returncode == 0 and proc.stdout.strip():
        return [parse_record(line) for line in proc.stdout.splitlines() if line.strip()]
    acct = _run(["sacct", "-c", "-n", "-P", "-j", str(job_id), "-o", "jobid,state,exitcode,nodelist"])
    latest: dict[str, dict[str, str]] = {}
    for line in acct.stdout.splitlines():  # one line per run; requeued jobs appear more than once
        jid, state, code, nodes = (line.split("|") + ["", "", "", ""])[:4]
        latest[jid] = {
            "JobId": jid,
            "JobState": state.split()[0] if state else "?",
            "ExitCode": code,
            "NodeList": nodes,
        }
    return list(latest.values())


def wait_jobs(
    job_ids: Iterable[str],
    *,
    poll: float = 1.0,
    timeout: float | None = None,
    on_change: Callable[[str, list[dict[str, str]]], None] | None = None,
) -> dict[str, list[dict[str, str]]]:
    """Wait until every record of every job is in a final state; return the records by job id."""
    ids = list(job_ids)
    deadline = None if timeout is None else time.monotonic() + timeout
    seen: dict[str, tuple[str, ...]] = {}
    while True:
        done: dict[str, list[dict[str, str]]] = {}
        for jid in ids:
            recs = job_records(jid)
            states = tuple(r.get("JobState", "?") + "/" + r.get("Reason", "") for r in recs)
            if on_change and seen.get(jid) != states:
                on_change(jid, recs)
            seen[jid] = states
            if recs and all(r.get("JobState") in FINAL_STATES for r in recs):
                done[jid] = recs
        if len(done) == len(ids):
            return done
        if deadline is not None and time.monotonic() > deadline:
            raise InfraError(
                f"job(s) {', '.join(ids)} did not finish within {timeout:.0f} s "
                f"(states: {seen}); see `squeue -j {','.join(ids)}`"
            )
        time.sleep(poll)


def requeue_excluding(job_id: str, nodes: Sequence[str]) -> None:
    """Requeue running job ``job_id`` and add ``nodes`` to its ExcNodeList.

    Called from inside the job: the requeue makes SLURM TERM the job's processes, so the
    scontrol children ignore TERM (the caller should too) until the update is done; SLURM's
    KillWait leaves seconds for that, the update takes milliseconds.
    """
    recs = scontrol_records("job", str(job_id))
    current = recs[0].get("ExcNodeList", "(null)") if recs else "(null)"
    exclude = sorted(({current} if current not in ("", "(null)") else set()) | set(nodes))
    proc = _run(["scontrol", "requeue", str(job_id)], ignore_term=True)
    if proc.returncode != 0:
        raise InfraError(f"`scontrol requeue {job_id}` failed: {proc.stderr.strip()}")
    proc = _run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}"], ignore_term=True)
    if proc.returncode != 0:
        raise InfraError(f"job {job_id} was requeued but excluding {', '.join(nodes)} failed: {proc.stderr.strip()}")
