"""Name the cause of a failure from its error (exception type names and text) and say what to change.

Plain text rules, first match wins, so the same function reads a live exception in the driver and an
error line in a copied run dir's logs. Guaranteed: every error gets a cause (``bug``, ``input`` or
``infra`` by exit code when nothing more specific matches). Not guaranteed: telling a host OOM kill
from another SIGKILL when neither the kernel nor Ray said so (then ``process_killed``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slime.core.errors import ExitCode

__all__ = ["CAUSES", "CAUSES_BY_KEY", "Cause", "Named", "evidence", "name_cause", "remote_where"]


@dataclass(frozen=True, slots=True)
class Cause:
    key: str
    pattern: re.Pattern[str] | None  # matched against "TypeName: text" of the error
    title: str
    fix: str
    exit_code: int | None = None  # overrides the exit code classify gave, where the cause decides it


def _re(text: str) -> re.Pattern[str]:
    return re.compile(text, re.I | re.M)


CAUSES: tuple[Cause, ...] = (
    Cause(
        "collective_timeout",
        _re(
            r"(gloo|nccl|c10d|ProcessGroup|collective)\S*.{0,200}tim(ed|e)[ -]?out|Timed out waiting .{0,80}(recv|send)"
        ),
        "a collective of the trainer ranks timed out: a rank never joined it",
        "find the rank that is behind (its stack or the rank that died first, below); if the step is only slow, "
        "raise cluster.stall_timeout_s (it also sets the collective timeout)",
        ExitCode.STALL,
    ),
    Cause(
        "cuda_oom",
        _re(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA|CUBLAS_STATUS_ALLOC_FAILED"),
        "a GPU ran out of memory",
        "lower train.micro_batch_size (or train.dynamic_batch.max_tokens_per_gpu), or the engines' memory share; "
        "`slime-submit fit SPEC` shows what each role needs",
    ),
    Cause(
        "host_oom",
        _re(
            r"running low on memory|Out of memory: Killed process|oom_kill \d|memory cgroup out of memory|"
            r"host out of memory|MemoryError"
        ),
        "a process was killed for using more host memory than allowed",
        "give the job more memory (cluster.slurm.mem) or use less: fewer samples per rollout "
        "(rollout.batch_size), a smaller train.micro_batch_size, fewer engines per node",
    ),
    Cause(
        "disk_full",
        _re(r"No space left on device|Disk quota exceeded|file write failed|ENOSPC|EDQUOT|cannot save the checkpoint"),
        "a write failed: the file system is full or over quota",
        "free space there or point train.checkpoint.dir at a larger file system (train.checkpoint.keep: fewer "
        "kept checkpoints); the run resumes from the newest complete checkpoint",
    ),
    Cause(
        "node_lost",
        _re(
            r"^lost \S.{0,200} during training \(Ray marks the node dead|NodeDiedError|"
            r"node .{0,40} (died|was lost)"
        ),
        "a node of the job was lost",
        "nothing in the spec: the launcher requeues within cluster.slurm.max_failures; if one node keeps "
        "failing, exclude it (cluster.slurm.exclude)",
    ),
    Cause(
        "process_killed",
        _re(
            r"killed by signal|SIGKILL|SIGSEGV|SIGABRT|exit code -?(9|11|6|137|139)\b|actor died unexpectedly|"
            r"ActorDiedError|WorkerCrashedError|process .{0,40} exited|"
            r"lost a trainer or engine process|a trainer or engine process there died"
        ),
        "a trainer rank or engine process died (killed by a signal or crashed)",
        "see the dead process's log (below); an out-of-memory kill shows in the node's kernel log (dmesg); "
        "the launcher requeues within cluster.slurm.max_failures",
    ),
    Cause(
        "collective_error",
        _re(r"NCCL error|nccl(System|Internal|Invalid|Remote)Error|gloo.{0,40}(error|exception)|ProcessGroupGloo"),
        "a collective of the trainer ranks failed (NCCL/Gloo)",
        "usually a peer died first (see the other ranks); check cluster.network_interface and that every node "
        "reaches the others",
    ),
    Cause(
        "user_code",
        _re(
            r"RewardFunctionError|RewardValueError|reward function .{0,200} (raised|returned)|PluginContractError|"
            r"custom generate|generate function .{0,200} raised"
        ),
        "your code raised (a reward function or a custom generate)",
        "fix the function at the frame named below, then rerun",
    ),
    Cause(
        "data",
        _re(r"DatasetError|\.jsonl?:\d+|\.parquet.{0,20}row"),
        "a data file has a bad row",
        "fix or drop the row named below (the file and line), or change data.input_key / data.label_key",
    ),
)
CAUSES_BY_KEY = {c.key: c for c in CAUSES}
_BY_CODE = {
    ExitCode.SPEC: Cause("input", None, "the spec, its data or a checkpoint is wrong", "fix the input named below"),
    ExitCode.INFRA: Cause("infra", None, "the infrastructure failed (Ray, a node, a port)", "see the message"),
    ExitCode.STALL: Cause("stall", None, "the job stalled", "see the stacks"),
    ExitCode.INTERRUPTED: Cause("interrupted", None, "interrupted (Ctrl-C)", "nothing: rerun to resume"),
}
_BUG = Cause("bug", None, "an internal error (a bug)", "please report it with the traceback below")
_REMOTE = re.compile(r"ray::(\w+)\.(\w+)\(\) \(pid=(\d+), ip=([\d.]+)")
# ActorDiedError's lines about the dead actor
_DIED = re.compile(r"class_name: (\w+)\s+actor_id: \S+\s+pid: (\d+)\s+namespace: \S+\s+ip: ([\d.]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_AT = re.compile(r"\(at ([^()]+:\d+ in \w+)\)")


@dataclass(frozen=True, slots=True)
class Named:
    cause: Cause
    frame: str | None
    evidence: tuple[str, ...]


def name_cause(types: list[str], text: str, exit_code: int) -> Named:
    """The cause of an error whose exception chain has class names ``types`` and message ``text``."""
    subject = "\n".join([*types, text])
    for cause in CAUSES:
        if cause.pattern is not None and cause.pattern.search(subject):
            break
    else:
        cause = _BY_CODE.get(exit_code, _BUG)
    at = _AT.search(text)
    return Named(cause, at.group(1) if at else None, evidence(text, cause.pattern))


def evidence(text: str, pattern: re.Pattern[str] | None, limit: int = 5) -> tuple[str, ...]:
    """The lines of ``text`` that matter: those the cause matched, then the last ones, at most ``limit``."""
    # not a traceback's source lines (indented) nor its header: the messages are what matter
    text = _ANSI.sub("", text)  # Ray colours its task names
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip() and not ln[:1].isspace() and ln != "Traceback"]
    lines = [ln for ln in lines if not ln.startswith("Traceback (most recent call last)")]
    hits = [ln for ln in lines if pattern is not None and pattern.search(ln)]
    picked = list(dict.fromkeys([*hits[:3], *lines[-limit:]]))
    return tuple(ln[:400] for ln in picked[:limit])


def remote_where(text: str) -> tuple[str, int, str] | None:
    """(Ray actor ``Class.method``, pid, ip) of the process a Ray task error came from, if it names one."""
    died = _DIED.search(text)
    if died:
        return f"{died.group(1)} (dead)", int(died.group(2)), died.group(3)
    m = _REMOTE.search(text)
    return (f"{m.group(1)}.{m.group(2)}", int(m.group(3)), m.group(4)) if m else None
