"""``RunPaths``: the one owner of the on-disk run layout.

A run dir is ``<logging.dir>/<name>-<YYYYmmdd-HHMMSS>-<hash6>/`` with ``spec.yaml``,
``resolved.json``, ``tasks/<i>/`` (per-task resolved spec, metrics, checkpoints, logs...),
``lock.json``, the batch script, ``jobs.json`` and the preflight report; nothing else builds these
paths by hand. Guaranteed: ``create`` is atomic (written into a hidden temp sibling, then renamed),
so a failure never leaves a half-written run dir. Full layout: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RunPaths", "TaskPaths", "atomic_write", "new_run_name", "read_jsonl"]


def new_run_name(name: str, spec_text: str, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now if now is not None else time.time()))
    digest = hashlib.sha256(spec_text.encode()).hexdigest()[:6]
    return f"{name}-{stamp}-{digest}"


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write then rename, so readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_jsonl(path: Path) -> list[dict]:
    """The object lines of a JSON-lines file; a torn line (a writer killed while appending) is skipped."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _json_kind(v: object) -> str:
    return {
        dict: "an object",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        type(None): "null",
        int: "a number",
        float: "a number",
    }.get(type(v), type(v).__name__)


#: top-level jobs.json entries the job managers index into, and the type they need
_JOBS_TYPES = {"launcher": str, "job_ids": list, "arrays": list, "local": dict, "cancelled": dict}


def _jobs_shape_problem(doc: object) -> str | None:
    """What in a parsed jobs.json is not the shape its readers index into (None: usable)."""
    if not isinstance(doc, dict):
        return f"holds {_json_kind(doc)}, not an object"
    for key, kind in _JOBS_TYPES.items():
        if key in doc and not isinstance(doc[key], kind):
            return f'has "{key}": {_json_kind(doc[key])}, not {_json_kind(kind())}'
    for a in doc.get("arrays") or []:
        if not (
            isinstance(a, dict)
            and isinstance(a.get("job_id"), (str, int))
            and all(isinstance(a.get(k), int) and not isinstance(a.get(k), bool) for k in ("first_task", "last_task"))
        ):
            return 'has an "arrays" entry that is not {"job_id", "first_task", "last_task"}'
    tasks = (doc.get("local") or {}).get("tasks")
    if tasks is not None and not (isinstance(tasks, dict) and all(isinstance(r, dict) for r in tasks.values())):
        return 'has "local.tasks" that is not an object of per-task objects'
    for key, kind in (("tasks", int), ("targets", str)):
        v = (doc.get("cancelled") or {}).get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, kind) for x in v)):
            return f'has "cancelled.{key}" that is not an array of {"task numbers" if kind is int else "job ids"}'
    return None


@dataclass(frozen=True, slots=True)
class TaskPaths:
    """Paths of one task (one sweep point; task 0 when there is no sweep)."""

    root: Path
    index: int

    @property
    def dir(self) -> Path:
        return self.root / "tasks" / str(self.index)

    @property
    def resolved(self) -> Path:
        return self.dir / "resolved.json"

    @property
    def metrics(self) -> Path:
        return self.dir / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def plots(self) -> Path:
        return self.dir / "plots"

    @property
    def wandb(self) -> Path:
        return self.dir / "wandb"

    @property
    def tensorboard(self) -> Path:
        return self.dir / "tensorboard"

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"

    @property
    def restarts(self) -> Path:
        return self.dir / "restarts.jsonl"

    @property
    def preflight_json(self) -> Path:
        return self.dir / "preflight.json"

    @property
    def preflight_txt(self) -> Path:
        return self.dir / "preflight.txt"

    @property
    def state(self) -> Path:
        """The task's own record of its state (running/succeeded/failed, step), written by the runtime."""
        return self.dir / "state.json"

    @property
    def model_cache(self) -> Path:
        return self.dir / "model"

    @property
    def rendezvous(self) -> Path:
        """Files the per-job Ray bootstrap uses to meet: head address, node states, done marker."""
        return self.dir / "rendezvous"

    @property
    def auth(self) -> Path:
        """The job's secret, one file per instance (``slime.core.auth``): dir 0700, file 0600."""
        return self.dir / "auth"

    @property
    def driver_probe(self) -> Path:
        """What the bootstrap's test driver (tests.fixtures.tinydriver) saw of the Ray cluster."""
        return self.dir / "driver-probe.json"

    @property
    def weights(self) -> Path:
        """HF exports of the policy, one ``v<version>`` dir per weight sync (the runtime keeps the newest)."""
        return self.dir / "weights"

    @property
    def ref_model(self) -> Path:
        """The frozen reference policy when ``model.ref_path: initial`` follows an SFT warm-up."""
        return self.dir / "ref_model"

    @property
    def final_model(self) -> Path:
        """HF copy of the final policy (``train.checkpoint.save_hf``)."""
        return self.dir / "final_model"

    @property
    def rollouts(self) -> Path:
        """Saved rollouts (``debug.save_rollouts``): ``rollout_<id>.parquet``, one per rollout."""
        return self.dir / "rollouts"

    @property
    def chain_inputs(self) -> Path:
        """What the node found at each ``${runs...}`` path of a chain step (``launchers.node.chain_inputs``)."""
        return self.dir / "chain_inputs.json"

    @property
    def wandb_id(self) -> Path:
        """The task's W&B run id, reused on resume so a requeued job continues the same W&B run."""
        return self.dir / "wandb_run_id"

    @property
    def diagnosis(self) -> Path:
        """One record per failure of the task (``slime.diagnosis.record``), read by ``status`` and ``why``."""
        return self.dir / "diagnosis.json"

    @property
    def stacks(self) -> Path:
        """Stack dumps of the run's processes, one folder per stall (``diagnosis/<time>/``)."""
        return self.dir / "diagnosis"

    def node_log(self, node: str, stream: str = "out") -> Path:
        return self.logs / f"{node}.{stream}"


@dataclass(frozen=True, slots=True)
class RunPaths:
    """Every path of one run dir."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def resolved(self) -> Path:
        return self.root / "resolved.json"

    @property
    def lock(self) -> Path:
        return self.root / "lock.json"

    @property
    def script(self) -> Path:
        return self.root / "job.sbatch"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def chain(self) -> Path:
        """The job chain this run is a step of (``launchers.chain``): steps, dependency, resolved references."""
        return self.root / "chain.json"

    @property
    def chain_refs(self) -> Path:
        """A chain step's ``${runs...}`` references and the paths they were filled with (written once, at submit)."""
        return self.root / "chain_refs.json"

    @property
    def preflight_json(self) -> Path:
        return self.root / "preflight.json"

    @property
    def preflight_txt(self) -> Path:
        return self.root / "preflight.txt"

    def task(self, index: int) -> TaskPaths:
        return TaskPaths(self.root, index)

    def task_indices(self) -> list[int]:
        d = self.root / "tasks"
        if not d.is_dir():
            return []
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())

    def read_jobs(self) -> dict:
        """``jobs.json``; ``{}`` when it is absent, unreadable or not the shape the job managers
        index into (:meth:`jobs_problem` says which), so a damaged record reads as a missing one."""
        return self._load_jobs()[0]

    def jobs_problem(self) -> str | None:
        """Why ``jobs.json`` is ignored ("... is not valid JSON ..."), or None (fine, or absent)."""
        return self._load_jobs()[1]

    def _load_jobs(self) -> tuple[dict, str | None]:
        try:
            text = self.jobs.read_text()
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            return {}, f"cannot be read ({exc.strerror or exc})"
        try:
            doc = json.loads(text)
        except ValueError as exc:
            return {}, f"is not valid JSON ({exc})"
        problem = _jobs_shape_problem(doc)
        return ({}, problem) if problem else (doc, None)

    def write_jobs(self, data: dict) -> None:
        atomic_write(self.jobs, json.dumps(data, indent=2, sort_keys=True) + "\n")

    @classmethod
    def create(cls, parent: Path, name: str, files: Iterable[tuple[str, str | bytes, int]]) -> RunPaths:
        """Create ``parent/name`` with ``files`` ((relative path, content, mode)), atomically."""
        parent.mkdir(parents=True, exist_ok=True)
        final = parent / name
        if final.exists():
            raise FileExistsError(f"run dir already exists: {final}")
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{name}.tmp-"))
        try:
            for rel, content, mode in files:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
                os.chmod(target, mode)
            os.chmod(tmp, 0o700)  # the job's secret lives in it (slime.core.auth)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return cls(final)
