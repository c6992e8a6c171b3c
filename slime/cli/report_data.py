"""What ``slime-submit report`` reads of a run dir: spec, lock, metrics, preflight, restarts, state, summary.

Every file is read as the launchers and the runtime wrote it (``slime.core.paths`` names them); a file
that is missing or damaged reads as absent, never as an error, so a report can be made of a run that
is still running, failed, or was copied without some of its files. Also here: the field-by-field diff
of resolved specs (:func:`spec_diff`) and the failure diagnosis (:func:`diagnosis`). Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.cli.runids import short_id
from slime.core.paths import RunPaths, TaskPaths, read_jsonl

__all__ = ["RunView", "TaskView", "diagnosis", "flatten", "load_run", "lock_summary", "spec_diff"]

LOG_TAIL_LINES = 40  # of a failed task's log, in its diagnosis


@dataclass
class TaskView:
    """One task (sweep point) of a run, as its files record it."""

    index: int
    paths: TaskPaths
    spec: dict[str, Any] = field(default_factory=dict)  # the task's resolved spec
    overrides: dict[str, Any] = field(default_factory=dict)  # the sweep point's fields
    metrics: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    preflight: dict[str, Any] | None = None
    restarts: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] | None = None

    @property
    def rollouts_dir(self) -> Path:
        return self.paths.rollouts


@dataclass
class RunView:
    """One run dir: its run-level records and its tasks."""

    paths: RunPaths
    resolved: dict[str, Any]
    lock: dict[str, Any]
    jobs: dict[str, Any]
    tasks: list[TaskView]

    @property
    def root(self) -> Path:
        return self.paths.root

    @property
    def name(self) -> str:
        name = self.resolved.get("name")
        return name if isinstance(name, str) else self.root.name

    @property
    def label(self) -> str:
        """``name (short id)``: what legends and columns call the run."""
        sid = short_id(self.root.name)
        return f"{self.name} ({sid})" if sid != self.root.name else self.root.name


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def load_task(paths: RunPaths, index: int) -> TaskView:
    tp = paths.task(index)
    resolved = _dict(read_json(tp.resolved))
    preflight = read_json(tp.preflight_json)
    if not isinstance(preflight, dict):  # older runs: the preflight at the run's top level
        preflight = read_json(paths.preflight_json)
    summary = read_json(tp.summary)
    state = read_json(tp.state)
    return TaskView(
        index=index,
        paths=tp,
        spec=_dict(resolved.get("spec")),
        overrides=_dict(resolved.get("overrides")),
        metrics=read_jsonl(tp.metrics),
        summary=summary if isinstance(summary, dict) else None,
        preflight=preflight if isinstance(preflight, dict) else None,
        restarts=read_jsonl(tp.restarts),
        state=state if isinstance(state, dict) else None,
    )


def load_run(root: Path) -> RunView:
    """A run dir's records (see the module doc)."""
    paths = RunPaths(Path(root).resolve())
    lock = _dict(read_json(paths.lock))
    resolved = _dict(read_json(paths.resolved)) or _dict(_dict(lock.get("spec")).get("resolved"))
    indices = paths.task_indices() or [0]
    return RunView(
        paths=paths,
        resolved=resolved,
        lock=lock,
        jobs=paths.read_jobs(),
        tasks=[load_task(paths, i) for i in indices],
    )


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted.path: leaf}`` of a resolved spec, list items as ``path[i]`` (the ``--set`` syntax)."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


_ABSENT = object()


def spec_diff(specs: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    """The fields whose values are not the same in every spec: ``(path, [value per spec])``, in the
    first spec's field order (then the others'); a field a spec lacks is ``None`` there."""
    flats = [flatten(s) for s in specs]
    order: dict[str, None] = {}
    for f in flats:
        order.update(dict.fromkeys(f))
    out = []
    for path in order:
        values = [f.get(path, _ABSENT) for f in flats]
        if any(v != values[0] for v in values[1:]):
            out.append((path, [None if v is _ABSENT else v for v in values]))
    return out


def lock_summary(lock: dict[str, Any]) -> list[tuple[str, str]]:
    """The lock.json fields a reader compares runs by, as (label, text) rows."""
    spec, git = _dict(lock.get("spec")), _dict(lock.get("git"))
    py, tool, by = _dict(lock.get("python")), _dict(lock.get("slime_submit")), _dict(lock.get("submitted_by"))
    packages = _dict(lock.get("packages"))
    rows = [
        ("created", lock.get("created")),
        ("launcher", lock.get("launcher")),
        ("spec", spec.get("path")),
        ("spec sha256", (lock.get("spec_sha256") or "")[:16] or None),
        ("overrides", " ".join(map(str, spec.get("overrides") or [])) or None),
        ("tasks", spec.get("tasks")),
        ("slime-submit", " ".join(str(tool[k]) for k in ("version", "path") if tool.get(k)) or None),
        ("git", _git_text(git)),
        ("python", " ".join(str(py[k]) for k in ("version", "implementation") if py.get(k)) or None),
        ("packages", ", ".join(f"{k} {v}" for k, v in packages.items() if v) or None),
        ("container", json.dumps(lock["container"]) if lock.get("container") else None),
        ("patches", ", ".join(map(str, lock.get("patches") or [])) or None),
        ("submitted by", f"{by.get('user')}@{by.get('host')}" if by else None),
        ("hosts", json.dumps(lock["hosts"]) if lock.get("hosts") else None),
        ("rerun of", lock.get("rerun_of")),
    ]
    return [(k, str(v)) for k, v in rows if v not in (None, "")]


def _git_text(git: dict[str, Any]) -> str | None:
    if not git.get("sha"):
        return None
    dirty = f" dirty ({git.get('diff_bytes', 0)} bytes of diff)" if git.get("dirty") else ""
    return f"{str(git['sha'])[:12]}{dirty}"


def _log_tail(task: TaskView) -> list[str]:
    logs = sorted(task.paths.logs.glob("*.out")) + sorted(task.paths.root.joinpath("logs").glob("*.out"))
    for log in logs:
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if lines:
            return [f"{log.name}:", *lines[-LOG_TAIL_LINES:]]
    return []


def diagnosis(task: TaskView) -> list[tuple[str, str]]:
    """Why the task failed or restarted, as (what, detail) rows; empty when nothing went wrong."""
    out: list[tuple[str, str]] = []
    st = task.state or {}
    if st.get("state") == "failed" or st.get("error"):
        out.append(("state.json", f"{st.get('state')} (exit code {st.get('exit_code')}): {st.get('error') or ''}"))
    pf = task.preflight or {}
    if pf and pf.get("ok") is False:
        for c in pf.get("checks") or []:
            if isinstance(c, dict) and c.get("ok") is False:
                fix = f" (fix: {c['fix']})" if c.get("fix") else ""
                where = f" [{c['node']}]" if c.get("node") else ""
                out.append((f"preflight {c.get('name')}{where}", f"{c.get('message')}{fix}"))
        if pf.get("bad_nodes"):
            out.append(("preflight bad nodes", ", ".join(map(str, pf["bad_nodes"]))))
    for r in task.restarts:
        if r.get("budget") == "failures" or r.get("bad_nodes"):
            bad = f" on {', '.join(map(str, r['bad_nodes']))}" if r.get("bad_nodes") else ""
            out.append((f"restart {r.get('restart')}: {r.get('cause')}{bad}", str(r.get("detail") or "")))
    if out and st.get("state") == "failed":
        tail = _log_tail(task)
        if tail:
            out.append(("log tail", "\n".join(tail)))
    return out
