"""The launcher interface: one object per launcher, modelled on torchx's ``Scheduler``.

``dryrun`` (torchx's ``submit_dryrun``) compiles a resolved spec into a :class:`DryRun` (the
:class:`Request` and its options; ``render()``/``to_json()`` are what ``--dry-run`` prints);
``submit`` (torchx's ``schedule``) creates the run dir atomically and starts the job. Job commands:
``status``/``statuses``, ``cancel``, ``log_files``, ``find_run``.
Guaranteed: ``dryrun`` reads and writes no file (the run dir's name comes from the spec and the
time); a :class:`Request` holds the typed specs it came from, so nothing re-parses what it renders.
"""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import msgspec

from launchers.status import CancelResult, RunStatus
from slime.core.errors import InfraError
from slime.core.paths import RunPaths, TaskPaths, new_run_name
from slime.spec import LoadedSpec
from slime.spec.types import Spec

__all__ = [
    "DryRun",
    "InfraError",
    "Launcher",
    "Request",
    "RunFile",
    "Submission",
    "SubmitOptions",
    "run_files",
    "task_spec_json",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class SubmitOptions:
    """Command-line options that change what is compiled (not the spec)."""

    preflight_only: bool = False
    force: bool = False
    run_name: str | None = None  # fixed name (tests, rerun); default: <name>-<time>-<hash>
    extra: dict[str, Any] = field(default_factory=dict)


class RunFile(NamedTuple):
    """One file of the run dir: path relative to it, content, mode."""

    path: str
    content: str
    mode: int


def site_table(site, spec: Spec) -> list[str]:
    """``# cluster settings`` lines: each ``cluster.*`` value and where it came from (spec > profile > defaults)."""
    rows = [(p, json.dumps(v), src) for p, v, src in site.fields(spec)]
    w1, w2 = (max(len(r[i]) for r in rows) for i in (0, 1))
    out = [f"# ---- cluster settings: spec > cluster profile {site.name!r} ({site.file}) > defaults ----"]
    return out + [f"# {p:<{w1}}  {v:<{w2}}  {src}" for p, v, src in rows]


@dataclass(frozen=True, kw_only=True, slots=True)
class Request:
    """What a launcher would do: write ``files`` into ``run_dir`` and run ``command``, for ``loaded``."""

    launcher: str
    run_dir: Path
    loaded: LoadedSpec  # the resolved base spec, one resolved spec per task, the spec file, its --set overrides
    files: tuple[RunFile, ...]
    command: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def spec(self) -> Spec:
        """The resolved base spec (``resolved.json``)."""
        return self.loaded.spec

    @property
    def n_tasks(self) -> int:
        return len(self.loaded.tasks)

    @property
    def source(self) -> Path:
        """The spec file as given (git provenance is read next to it)."""
        return self.loaded.source

    @property
    def overrides(self) -> tuple[str, ...]:
        """The spec's ``--set`` overrides (``spec.yaml`` is the file as given)."""
        return self.loaded.overrides

    def file(self, rel: str) -> str:
        for f in self.files:
            if f.path == rel:
                return f.content
        raise KeyError(rel)

    def render(self) -> str:
        """Human-readable: every file with its content, then the command."""
        out = [f"# launcher: {self.launcher}", f"# run dir: {self.run_dir}"]
        if self.overrides:
            out.append("# overrides: " + " ".join(f"--set {o}" for o in self.overrides))
        out += [f"# {note}" for note in self.notes]
        if self.loaded.site is not None:
            out += ["", *site_table(self.loaded.site, self.spec)]
        for f in self.files:
            out += [f"\n# ---- {f.path} ----", f.content.rstrip("\n")]
        out += ["\n# ---- command ----", " ".join(shlex.quote(c) for c in self.command)]
        return "\n".join(out) + "\n"


@dataclass(frozen=True, kw_only=True, slots=True)
class DryRun:
    """What ``submit`` would do (torchx's ``AppDryRunInfo``): the request, the options it was compiled
    with, and ``engines``: what the GPU engines would be started with, as (title, text) previews
    (filled in by the caller: launchers never import the engines' code)."""

    request: Request
    options: SubmitOptions
    engines: tuple[tuple[str, str], ...] = ()

    def with_engines(self, engines: Mapping[str, str]) -> DryRun:
        return replace(self, engines=tuple(engines.items()))

    def render(self) -> str:
        text = self.request.render()
        for title, preview in self.engines:
            text += f"\n# ---- {title} ----\n{preview.rstrip()}\n"
        return text

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {
            "launcher": r.launcher,
            "run_dir": str(r.run_dir),
            "files": {f.path: f.content for f in r.files},
            "command": list(r.command),
            "engines": dict(self.engines),
            "cluster_profile": r.loaded.site.to_json(r.spec) if r.loaded.site is not None else None,
        }


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


class Launcher(ABC):
    """One launcher: compile and submit a spec, then follow, cancel and find its runs."""

    name: ClassVar[str]

    @abstractmethod
    def dryrun(self, loaded: LoadedSpec, options: SubmitOptions) -> DryRun:
        """Compile ``loaded`` (pure: nothing is read or written)."""

    @abstractmethod
    def submit(self, dryrun: DryRun) -> Submission:
        """Create the run dir and start the job (refusing a duplicate of an active run unless ``--force``)."""

    @abstractmethod
    def status(self, paths: RunPaths) -> RunStatus:
        """Every task's state (the run dir's records fill in what the scheduler no longer knows)."""

    def statuses(self, runs: Sequence[RunPaths]) -> dict[Path, RunStatus]:
        """Status of many runs of this launcher (``list``); a launcher may ask its scheduler once for all."""
        return {p.root: self.status(p) for p in runs}

    @abstractmethod
    def cancel(self, paths: RunPaths, task: int | None = None) -> CancelResult:
        """Stop the run (every task) or one task; an ended one is not an error (``message`` says so)."""

    @abstractmethod
    def log_files(self, paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
        """The files ``logs`` prints for ``task`` (``node``: that node's bootstrap log); some may not exist yet."""

    def find_run(self, job_id: str, runs: Sequence[RunPaths]) -> tuple[RunPaths, int | None] | None:
        """The run (and task, when ``job_id`` names one) of scheduler job ``job_id``, among ``runs``
        (newest first), or None. This default looks for the id in each run's ``jobs.json``."""
        for paths in runs:
            doc = paths.read_jobs()
            ids = {str(j) for j in doc.get("job_ids", [])} | {str(a.get("job_id")) for a in doc.get("arrays") or []}
            if job_id in ids:
                return paths, None
        return None


def task_spec_json(loaded: LoadedSpec, run_dir: Path, index: int) -> str:
    """The resolved spec of task ``index`` with run-dir derived values filled in."""
    from msgspec.structs import replace as replace_struct

    spec = loaded.tasks[index].spec
    tp = TaskPaths(run_dir, index)
    if spec.train.checkpoint.dir is None:
        ck = replace_struct(spec.train.checkpoint, dir=str(tp.checkpoints))
        spec = replace_struct(spec, train=replace_struct(spec.train, checkpoint=ck))
    doc = {"task": index, "overrides": loaded.tasks[index].overrides, "spec": msgspec.to_builtins(spec)}
    return json.dumps(doc, indent=2) + "\n"


def run_files(loaded: LoadedSpec, run_dir: Path) -> list[RunFile]:
    """The files every launcher writes: the spec as given, the resolved base, one resolved spec per task."""
    files = [
        RunFile("spec.yaml", loaded.text, 0o644),
        RunFile("resolved.json", json.dumps(msgspec.to_builtins(loaded.spec), indent=2) + "\n", 0o644),
    ]
    for task in loaded.tasks:
        rel = TaskPaths(Path("."), task.index).resolved.as_posix()
        files.append(RunFile(rel, task_spec_json(loaded, run_dir, task.index), 0o644))
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
