"""Pytest plug-in: the real local SLURM cluster (``ci/slurm-cluster.sh``) as a fixture.

``slurm_cluster`` (session scope) returns a :class:`SlurmCluster` describing the cluster as
SLURM itself reports it (``scontrol show node/partition/config``), so it stays right whatever
settings ``up`` was run with.

Guaranteed:
- A healthy cluster that is already up is used as is and left running.
- Otherwise, as root with namespaces available, the fixture runs ``ci/slurm-cluster.sh up``
  and, only if no cluster existed before (it created it), ``down`` at the end of the session.
- When the cluster cannot be started here (not root, no ``unshare``/``nsenter``/``ip``, no
  SLURM and no ``apt-get``) the tests are skipped with that reason, except when ``CI=true``:
  then they fail, so CI never silently skips them. A failing ``up`` is always a failure.

Helpers (usable without the fixture): :func:`run_sbatch` submits and returns the job id;
:func:`wait_job` polls ``scontrol show job -o`` (falling back to ``sacct -c``, the job
completion log, once the job left slurmctld's memory) and fails fast, with the job record, when
the job ends in a state nobody waits for instead of sleeping until the timeout.
Not guaranteed: isolation from other users of the same cluster (jobs from other test sessions
may share the nodes); tests should only reason about their own job ids.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "ci" / "slurm-cluster.sh"
STATE_DIR = Path(os.environ.get("SLIME_SLURM_STATE_DIR", "/var/lib/slime-slurm"))

#: states after which a job never runs again (REQUEUED/PREEMPTED are transient with requeue)
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


class SlurmError(RuntimeError):
    """A SLURM command failed or a job did not reach the expected state."""


def _run(
    args: Sequence[str],
    *,
    input: str | None = None,
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), input=input, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def parse_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` line (``Key=Value`` pairs; values may hold spaces)."""
    keys = list(_KEY.finditer(line))
    record = {}
    for m, nxt in zip(keys, keys[1:] + [None]):
        end = nxt.start() if nxt else len(line)
        record[m.group(1)] = line[m.end() : end].strip()
    return record


def scontrol_records(*args: str) -> list[dict[str, str]]:
    """``scontrol show <args> -o`` as one dict per line."""
    proc = _run(["scontrol", "show", *args, "-o"])
    if proc.returncode != 0:
        raise SlurmError(f"scontrol show {' '.join(args)} failed: {proc.stderr.strip()}")
    return [parse_record(line) for line in proc.stdout.splitlines() if line.strip()]


def run_sbatch(
    script: str | Sequence[str], *args: str, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None
) -> str:
    """Submit a job with ``sbatch --parsable``; return its job id.

    ``script`` is either the batch script text (starts with ``#!``; sent on stdin) or a list of
    sbatch arguments (e.g. ``["-N2", "--wrap", "hostname"]``). ``args`` are extra sbatch options.
    """
    if isinstance(script, str):
        if not script.startswith("#!"):
            raise ValueError("run_sbatch: script text must start with '#!' (or pass a list of sbatch arguments)")
        cmd, stdin = ["sbatch", "--parsable", *args], script
    else:
        cmd, stdin = ["sbatch", "--parsable", *args, *script], None
    proc = _run(cmd, input=stdin, cwd=cwd, env=env)
    if proc.returncode != 0:
        raise SlurmError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {proc.stdout!r} {proc.stderr!r}")
    return job_id


def job_records(job_id: str) -> list[dict[str, str]]:
    """Current records of a job (one per array task, plus the pending-array record if any).

    From ``scontrol show job -o``; once slurmctld forgot the job (after MinJobAge), from the
    job completion log via ``sacct -c`` (fewer fields: JobId, JobState, NodeList; array tasks
    are logged there under their own plain job ids, so an array is not found as a whole).
    """
    proc = _run(["scontrol", "show", "job", "-o", str(job_id)])
    if proc.returncode == 0 and proc.stdout.strip():
        return [parse_record(line) for line in proc.stdout.splitlines() if line.strip()]
    acct = _run(["sacct", "-c", "-n", "-P", "-j", str(job_id), "-o", "jobid,state,nodelist"])
    records = []
    for line in acct.stdout.splitlines():
        jid, state, nodes = (line.split("|") + ["", "", ""])[:3]
        records.append({"JobId": jid, "JobState": state.split()[0], "NodeList": nodes})
    if not records:
        raise SlurmError(f"job {job_id} is unknown to scontrol ({proc.stderr.strip()}) and to the job completion log")
    return records


def wait_job(
    job_id: str, states: Iterable[str] = ("COMPLETED",), timeout: float = 60.0, poll: float = 0.25
) -> list[dict[str, str]]:
    """Wait until every record of ``job_id`` (every array task) is in one of ``states``.

    Returns the records. Raises :class:`SlurmError` with the records when a task ends in a final
    state not in ``states`` (no point waiting) or when ``timeout`` seconds pass.
    """
    wanted = {s.upper() for s in ([states] if isinstance(states, str) else states)}
    deadline = time.monotonic() + timeout
    while True:
        records = job_records(job_id)
        current = [r.get("JobState", "?") for r in records]
        if all(s in wanted for s in current):
            return records
        stuck = [r for r in records if r.get("JobState") in FINAL_STATES - wanted]
        if stuck:
            raise SlurmError(
                f"job {job_id} ended as {current}, wanted {sorted(wanted)}:\n" + "\n".join(map(str, stuck))
            )
        if time.monotonic() >= deadline:
            raise SlurmError(
                f"job {job_id} still {current} after {timeout:.0f} s, wanted "
                f"{sorted(wanted)}:\n" + "\n".join(map(str, records))
            )
        time.sleep(poll)


@dataclass(frozen=True)
class SlurmCluster:
    """What the running cluster looks like (as SLURM reports it)."""

    nodes: tuple[str, ...]
    node_ips: dict[str, str]
    partitions: tuple[str, ...]
    default_partition: str
    gpus_per_node: int
    cpus_per_node: int
    state_dir: Path
    conf_path: Path
    jobcomp_log: Path
    log_dir: Path
    started_here: bool = False
    script: Path = field(default=SCRIPT)

    def run_sbatch(self, script: str | Sequence[str], *args: str, **kw) -> str:
        return run_sbatch(script, *args, **kw)

    def wait_job(
        self, job_id: str, states: Iterable[str] = ("COMPLETED",), timeout: float = 60.0
    ) -> list[dict[str, str]]:
        return wait_job(job_id, states, timeout)


def describe_cluster(started_here: bool = False) -> SlurmCluster:
    """Build a :class:`SlurmCluster` from ``scontrol`` output."""
    nodes = scontrol_records("node")
    parts = scontrol_records("partition")
    conf = _run(["scontrol", "show", "config"])
    settings = dict(re.findall(r"^(\w+)\s*=\s*(.*?)\s*$", conf.stdout, flags=re.M))
    gres = nodes[0].get("Gres", "") if nodes else ""
    gpus = re.search(r"gpu:(\d+)", gres)
    return SlurmCluster(
        nodes=tuple(n["NodeName"] for n in nodes),
        node_ips={n["NodeName"]: n["NodeAddr"] for n in nodes},
        partitions=tuple(p["PartitionName"] for p in parts),
        default_partition=next((p["PartitionName"] for p in parts if p.get("Default") == "YES"), ""),
        gpus_per_node=int(gpus.group(1)) if gpus else 0,
        cpus_per_node=int(nodes[0].get("CPUTot", "0")) if nodes else 0,
        state_dir=STATE_DIR,
        conf_path=Path(settings.get("SLURM_CONF", "/etc/slurm/slurm.conf")),
        jobcomp_log=Path(settings.get("JobCompLoc", str(STATE_DIR / "jobcomp.log"))),
        log_dir=STATE_DIR / "log",
        started_here=started_here,
    )


def cluster_healthy() -> bool:
    if shutil.which("sinfo") is None or not SCRIPT.exists():
        return False
    return _run(["bash", str(SCRIPT), "status"], timeout=60).returncode == 0


def cannot_start_reason() -> str | None:
    """Why ``ci/slurm-cluster.sh up`` cannot work here, or None."""
    if not sys.platform.startswith("linux"):
        return "the local SLURM cluster needs Linux namespaces"
    if os.geteuid() != 0:
        return "the local SLURM cluster needs root (network namespaces, mknod, /etc/hosts)"
    missing = [t for t in ("unshare", "nsenter", "ip", "bash") if shutil.which(t) is None]
    if missing:
        return f"the local SLURM cluster needs {', '.join(missing)} (util-linux, iproute2)"
    if shutil.which("slurmctld", path="/usr/sbin:/usr/bin") is None and not shutil.which("apt-get"):
        return "SLURM is not installed and apt-get is not available to install it"
    return None


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true, so not skipping: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The running local SLURM cluster; started (and later stopped) here if needed."""
    started = False
    if not cluster_healthy():
        reason = cannot_start_reason()
        if reason:
            _skip_or_fail(reason)
        existed = (STATE_DIR / "cluster.env").exists()
        proc = _run(["bash", str(SCRIPT), "up"], timeout=900)
        if proc.returncode != 0:
            pytest.fail(
                f"ci/slurm-cluster.sh up failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}", pytrace=False
            )
        started = not existed
    cluster = describe_cluster(started_here=started)
    yield cluster
    if started:
        proc = _run(["bash", str(SCRIPT), "down"], timeout=300)
        if proc.returncode != 0:
            print(f"ci/slurm-cluster.sh down failed:\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
