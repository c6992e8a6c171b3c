"""The launcher interface: compile (pure) → render (pure) → submit (the one side effect).

A launcher turns a loaded, resolved spec into a :class:`Request`: the files of
the run dir and the command that starts the job. ``Request.render()`` has no
side effects (``--dry-run`` prints it); ``Launcher.submit`` creates the run dir
atomically and starts the job, returning a :class:`Submission`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import msgspec

from slime.core.errors import InfraError
from slime.core.paths import RunPaths, TaskPaths, new_run_name
from slime.spec import LoadedSpec

__all__ = ["InfraError", "Launcher", "Request", "Submission", "SubmitOptions", "run_files", "task_spec_json"]


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitOptions:
    """Command-line options that change what is compiled (not the spec)."""

    preflight_only: bool = False
    force: bool = False
    run_name: str | None = None  # fixed name (tests, rerun); default: <name>-<time>-<hash>
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """What a launcher would do: write ``files`` into ``run_dir`` and run ``command``."""

    launcher: str
    run_dir: Path
    files: tuple[tuple[str, str, int], ...]  # (path relative to run_dir, content, mode)
    command: tuple[str, ...]
    notes: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()  # the spec's --set overrides (spec.yaml is the file as given)

    def file(self, rel: str) -> str:
        for path, content, _ in self.files:
            if path == rel:
                return content
        raise KeyError(rel)

    def render(self) -> str:
        """Human-readable dry run: every file with its content, then the command."""
        out = [f"# launcher: {self.launcher}", f"# run dir: {self.run_dir}"]
        if self.overrides:
            out.append("# overrides: " + " ".join(f"--set {o}" for o in self.overrides))
        for note in self.notes:
            out.append(f"# {note}")
        for path, content, _ in self.files:
            out.append(f"\n# ---- {path} ----")
            out.append(content.rstrip("\n"))
        out.append("\n# ---- command ----")
        import shlex

        out.append(" ".join(shlex.quote(c) for c in self.command))
        return "\n".join(out) + "\n"


@dataclass(frozen=True, kw_only=True, slots=True)
class Submission:
    run_dir: Path
    job_ids: tuple[str, ...] = ()
    returncode: int = 0
    final_metrics: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"run_dir": str(self.run_dir), "job_ids": list(self.job_ids)}
        if self.final_metrics is not None:
            out["final_metrics"] = self.final_metrics
        return out


class Launcher(Protocol):
    name: str

    def compile(self, loaded: LoadedSpec, options: SubmitOptions) -> Request: ...

    def submit(self, request: Request, options: SubmitOptions) -> Submission: ...


def task_spec_json(loaded: LoadedSpec, run_dir: Path, index: int) -> str:
    """The resolved spec of task ``index`` with run-dir derived values filled in."""
    from msgspec.structs import replace

    spec = loaded.tasks[index].spec
    tp = TaskPaths(run_dir, index)
    if spec.train.checkpoint.dir is None:
        spec = replace(
            spec, train=replace(spec.train, checkpoint=replace(spec.train.checkpoint, dir=str(tp.checkpoints)))
        )
    doc = {"task": index, "overrides": loaded.tasks[index].overrides, "spec": msgspec.to_builtins(spec)}
    return json.dumps(doc, indent=2) + "\n"


def run_files(loaded: LoadedSpec, run_dir: Path) -> list[tuple[str, str, int]]:
    """The files every launcher writes: the spec as given, the resolved base, one resolved spec per task."""
    files = [
        ("spec.yaml", loaded.text, 0o644),
        ("resolved.json", json.dumps(msgspec.to_builtins(loaded.spec), indent=2) + "\n", 0o644),
    ]
    for task in loaded.tasks:
        rel = TaskPaths(Path("."), task.index).resolved.as_posix()
        files.append((rel, task_spec_json(loaded, run_dir, task.index), 0o644))
    return files


def default_run_dir(loaded: LoadedSpec, options: SubmitOptions) -> Path:
    # The hash is of the resolved spec, --set overrides included: one file submitted with different
    # overrides in the same second (a `for lr in ...` loop) gets one run dir per submit.
    resolved = json.dumps(msgspec.to_builtins(loaded.spec), sort_keys=True)
    name = options.run_name or new_run_name(loaded.spec.name, resolved)
    return Path(loaded.spec.logging.dir) / name


def create_run_dir(request: Request) -> RunPaths:
    try:
        return RunPaths.create(request.run_dir.parent, request.run_dir.name, request.files)
    except FileExistsError:
        raise InfraError(
            f"run dir {request.run_dir} already exists: the same resolved spec was submitted "
            "twice within one second (--force); submit again"
        ) from None
