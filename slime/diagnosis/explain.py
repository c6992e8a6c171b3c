"""What ``slime-submit why`` shows: one task's failure, read from its run dir alone.

Sources, all files of the run dir (so a copy taken off the cluster works): ``state.json``, the
``diagnosis.json`` records, ``restarts.jsonl``, the stack dumps and every node's logs. Without a
record (the driver was killed before it could write one) the cause is read from the logs' error
lines. Not guaranteed: a cause for a task that never started (``status`` says why it is pending).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slime.core.paths import RunPaths, TaskPaths, read_jsonl
from slime.diagnosis.causes import name_cause
from slime.diagnosis.record import Diagnosis, read

__all__ = ["Explanation", "explain"]

_ERROR_LINE = re.compile(r"^(error\b|Traceback|[\w.]+(Error|Exception)\b|slurmstepd.*error|.*\bKilled\b)", re.I)
_LOG_BYTES = 200_000  # the end of each log: where a dying process writes


@dataclass(slots=True)
class Explanation:
    run_dir: str
    task: int
    state: str | None
    exit_code: int | None
    diagnosis: dict[str, Any] | None  # the newest record (or one read from the logs: source "logs")
    source: str  # "record", "logs" or "none"
    failures: int  # diagnosis records of the task (one per failed attempt)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    stack_files: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _state(tp: TaskPaths) -> dict[str, Any]:
    try:
        doc = json.loads(tp.state.read_text())
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _logs(paths: RunPaths, tp: TaskPaths) -> list[Path]:
    found = [p for d in (tp.logs, paths.logs) if d.is_dir() for p in sorted(d.rglob("*")) if p.is_file()]
    return [p for p in found if p.suffix in (".out", ".err", ".log", ".txt")]


def _tail(p: Path) -> str:
    try:
        with p.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - _LOG_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def from_logs(logs: list[Path], root: Path, exit_code: int | None) -> dict[str, Any] | None:
    """A diagnosis read from the logs' error lines when the run wrote no record."""
    lines: list[str] = []
    for p in logs:
        lines += [f"{p.relative_to(root)}: {ln.strip()}" for ln in _tail(p).splitlines() if _ERROR_LINE.search(ln)]
    if not lines:
        return None
    text = "\n".join(lines)
    named = name_cause([], text, exit_code if exit_code is not None else 1)
    d = Diagnosis(
        cause=named.cause.key,
        title=named.cause.title,
        fix=named.cause.fix,
        exit_code=exit_code if exit_code is not None else 1,
        frame=named.frame,
        evidence=named.evidence,
        message=lines[-1][:2000],
    )
    import msgspec

    return msgspec.to_builtins(d)


def explain(paths: RunPaths, task: int = 0) -> Explanation:
    import msgspec

    tp = paths.task(task)
    st = _state(tp)
    records = read(tp)
    logs = _logs(paths, tp)
    diagnosis, source = None, "none"
    if records:
        diagnosis, source = msgspec.to_builtins(records[-1]), "record"
    elif st.get("state") not in ("succeeded", "running", "pending", None) or st.get("exit_code"):
        diagnosis = from_logs(logs, paths.root, st.get("exit_code"))
        source = "logs" if diagnosis else "none"
    stacks = []
    if diagnosis and diagnosis.get("stacks"):
        d = paths.root / diagnosis["stacks"]
        stacks = sorted(str(p.relative_to(paths.root)) for p in d.glob("*.txt")) if d.is_dir() else []
    return Explanation(
        run_dir=str(paths.root),
        task=task,
        state=st.get("state"),
        exit_code=st.get("exit_code"),
        diagnosis=diagnosis,
        source=source,
        failures=len(records),
        restarts=read_jsonl(tp.restarts),
        stack_files=stacks,
        logs=[str(p.relative_to(paths.root)) for p in logs],
    )
