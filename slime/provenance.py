"""Provenance: the run dir's ``lock.json`` (what exactly was submitted), duplicate refusal, rerun.

:func:`write_lock` records, at submit, the resolved spec and its SHA-256, the written files' hashes,
package versions (read from metadata, never imported), git state, container, patches, script and
options; :func:`update_lock_from_preflight` merges in the hosts. :func:`refuse_duplicate` refuses
a submit whose spec hash matches a pending/running run of the same launcher (``--force`` overrides).
Guaranteed: secrets never enter the lock (references only, known values and secret-like names
redacted). Not guaranteed: short values (under 6 characters) are not scrubbed.
"""

from __future__ import annotations

import getpass
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slime.core.errors import InfraError
from slime.core.paths import RunPaths, TaskPaths, atomic_write
from slime.spec.errors import Problem, SpecError

__all__ = [
    "LOCK_FORMAT",
    "TRACKED_PACKAGES",
    "DuplicateRun",
    "build_lock",
    "git_info",
    "loaded_from_run",
    "package_versions",
    "read_lock",
    "redact",
    "redact_spec",
    "refuse_duplicate",
    "rerun_extra",
    "same_spec_runs",
    "secret_like",
    "secret_values",
    "spec_sha256",
    "update_lock_from_preflight",
    "write_lock",
]

LOCK_FORMAT = 1
TRACKED_PACKAGES = ("torch", "ray", "transformers", "megatron-core", "sglang")
REDACTED = "<redacted>"
MIN_SECRET_LEN = 6
_SECRET_PART = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$")
# NAME=value (optionally after `export`, or inside a quoted word / dotted --set path)
_ASSIGN = re.compile(
    r"(?P<pre>(?:^|[\s;'\".])(?:export\s+)?)(?P<name>[A-Za-z_][A-Za-z0-9_]*)="
    r"(?P<value>'[^'\n]*'|\"[^\"\n]*\"|[^\s;]*)",
    re.M,
)


def spec_sha256(resolved_text: str | bytes) -> str:
    data = resolved_text.encode() if isinstance(resolved_text, str) else resolved_text
    return hashlib.sha256(data).hexdigest()


def secret_like(name: str) -> bool:
    """``WANDB_API_KEY``, ``HF_TOKEN``, ``DB_PASSWORD``, ``apikey`` → True; ``PWD``, ``KEYBOARD`` → False."""
    return any(_SECRET_PART.search(part) for part in re.split(r"[_\-.]", name.upper()) if part)


def _first_line(path: str) -> str | None:
    try:
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as fh:
            return fh.readline(1 << 16).strip() or None
    except OSError:
        return None


def secret_values(spec_doc: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """Values to scrub: the spec's secret references as far as they resolve here, ``cluster.env``
    values and environment values with secret-like names; longest first, each at least 6 chars."""
    env = os.environ if environ is None else environ
    cluster = (spec_doc or {}).get("cluster") or {}
    values: set[str] = set()
    for ref in (cluster.get("secrets") or {}).values():
        ref = ref or {}
        if ref.get("env"):
            values.add(env.get(ref["env"], ""))
        elif ref.get("file"):
            values.add(_first_line(ref["file"]) or "")
    for name, value in list((cluster.get("env") or {}).items()) + list(env.items()):
        if secret_like(name) and isinstance(value, str):
            values.add(value)
    return sorted((v for v in values if len(v) >= MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, values: Iterable[str] = ()) -> str:
    """``text`` with ``values`` and the values of secret-like ``NAME=value`` assignments replaced."""
    for v in values:
        text = text.replace(v, REDACTED)

    def sub(m: re.Match) -> str:
        if not secret_like(m.group("name")) or not m.group("value") or REDACTED in m.group("value"):
            return m.group(0)
        return f"{m.group('pre')}{m.group('name')}={REDACTED}"

    return _ASSIGN.sub(sub, text)


def redact_spec(doc: dict[str, Any], values: Iterable[str] = ()) -> dict[str, Any]:
    """A copy of a resolved spec with secret-like ``cluster.env`` values (and ``values``) redacted."""
    text = json.dumps(doc)
    for v in values:
        text = text.replace(json.dumps(v)[1:-1], REDACTED)
    out = json.loads(text)
    env = (out.get("cluster") or {}).get("env") or {}
    for name in env:
        if secret_like(name):
            env[name] = REDACTED
    return out


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata; nothing is imported."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None


def git_info(spec_path: Path | None) -> dict[str, Any] | None:
    """Commit and uncommitted-diff hash of the git work tree holding ``spec_path`` (None if none)."""
    if spec_path is None:
        return None
    where = Path(spec_path).resolve().parent
    head = _git(where, "rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return None
    top = _git(where, "rev-parse", "--show-toplevel")
    root = Path(top.stdout.decode().strip()) if top is not None and top.returncode == 0 else where
    diff = _git(root, "diff", "HEAD", "--no-color", "--no-ext-diff")
    untracked = _git(root, "ls-files", "--others", "--exclude-standard")
    diff_bytes = diff.stdout if diff is not None and diff.returncode == 0 else b""
    return {
        "repo": str(root),
        "sha": head.stdout.decode().strip(),
        "dirty": bool(diff_bytes),
        "diff_sha256": hashlib.sha256(diff_bytes).hexdigest() if diff_bytes else None,
        "diff_bytes": len(diff_bytes),
        "untracked_files": len(untracked.stdout.splitlines()) if untracked is not None else None,
    }


def _applied_patches() -> list[dict] | None:
    try:
        from slime.patches import applied_patches
    except ImportError:
        return None
    try:
        return applied_patches()
    except Exception as exc:  # noqa: BLE001 - provenance must not break a submit
        return [{"error": f"could not read the patch records: {exc}"}]


def _slime_version() -> str:
    try:
        return importlib.metadata.version("slime-submit")
    except importlib.metadata.PackageNotFoundError:
        from slime import __version__

        return __version__


def _script_entry(request: Any, secrets: Any) -> dict[str, Any] | None:
    """The batch script the launcher wrote, if any: its path, hash and (redacted) text."""
    rel = RunPaths(Path(".")).script.as_posix()
    script = next((c for path, c, _ in request.files if path == rel), None)
    if script is None:
        return None
    return {"path": rel, "sha256": spec_sha256(script), "text": redact(script, secrets)}


def _container(resolved: dict[str, Any]) -> Any:
    """The container of the launcher's section (``cluster.<launcher>.container``), if any, with what pins
    its image (``image_identity``)."""
    sections = (resolved.get("cluster") or {}).values()
    found = next((v["container"] for v in sections if isinstance(v, dict) and v.get("container")), None)
    if isinstance(found, dict) and isinstance(found.get("image"), str):
        return {**found, **image_identity(found["image"])}
    return found


def image_identity(image: str) -> dict[str, Any]:
    """What pins an image: the ``@sha256:`` digest of a reference, or the SHA-256 of a local file
    (a .sif or .sqsh: read in full, once per submit); a tag alone pins nothing (``pinned: false``)."""
    if "@sha256:" in image:
        return {"pinned": True, "digest": "sha256:" + image.rsplit("@sha256:", 1)[1]}
    path = Path(os.path.expanduser(image))
    if path.is_file():
        h = hashlib.sha256()
        try:
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
        except OSError as exc:
            return {"pinned": False, "note": f"cannot read the image file: {exc}"}
        return {"pinned": True, "file_sha256": h.hexdigest(), "file_bytes": path.stat().st_size}
    return {"pinned": False, "note": "a tag or a path not readable at submit: record its digest with IMAGE@sha256:..."}


def build_lock(request: Any, options: Any, *, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The lock document of a launcher ``Request`` (``launchers.base.Request``; see the module doc)."""
    import msgspec

    env = os.environ if environ is None else environ
    resolved_text = request.file("resolved.json")
    resolved = msgspec.to_builtins(request.spec)
    spec_path = request.source if Path(request.source).is_file() else None  # None: text, not a file ("<spec>")
    secrets = secret_values(resolved, env)
    files = {rel: spec_sha256(content) for rel, content, _ in request.files}
    extra = dict(getattr(options, "extra", {}) or {})
    doc: dict[str, Any] = {
        "format": LOCK_FORMAT,
        "spec_sha256": spec_sha256(resolved_text),
        "launcher": request.launcher,
        "name": resolved.get("name"),
        "run_dir": str(request.run_dir),
        "created_at": time.time(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "spec": {
            "api_version": resolved.get("apiVersion"),
            "written_version": request.loaded.written_version,  # older files are upgraded in memory
            "path": str(Path(spec_path).resolve()) if spec_path else None,
            "files": files,
            "overrides": [redact(o, secrets) for o in getattr(request, "overrides", ())],
            "tasks": request.n_tasks,
            "resolved": redact_spec(resolved, secrets),
        },
        "slime_submit": {"version": _slime_version(), "path": str(Path(__file__).resolve().parents[1])},
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "packages": package_versions(),
        "git": git_info(spec_path),
        "container": _container(resolved),
        "cluster_profile": request.loaded.site.to_json(request.spec) if request.loaded.site is not None else None,
        "patches": _applied_patches(),
        "options": {
            "preflight_only": bool(getattr(options, "preflight_only", False)),
            "driver": extra.get("driver"),
            "driver_env": env.get("SLIME_DRIVER"),
            "python": extra.get("python"),
            "fit_check": env.get("SLIME_NO_FIT_CHECK", "") in ("", "0"),
        },
        "script": _script_entry(request, secrets),
        "command": [redact(c, secrets) for c in request.command],
        "submitted_by": {
            "user": _user(),
            "host": socket.gethostname(),
            "cwd": os.getcwd(),
            "argv": [redact(a, secrets) for a in sys.argv],
        },
        "hosts": None,
        "rerun_of": extra.get("rerun_of"),
    }
    return doc


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def write_lock(paths: RunPaths, request: Any, options: Any) -> dict[str, Any]:
    """Build and write ``lock.json`` into the (just created) run dir; returns the document."""
    doc = build_lock(request, options)
    atomic_write(paths.lock, json.dumps(doc, indent=1) + "\n")
    return doc


def read_lock(run_dir: Path) -> dict[str, Any]:
    path = RunPaths(Path(run_dir)).lock
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise InfraError(
            f"{run_dir} has no lock.json (a run submitted before provenance was recorded, or not a "
            "run dir); submit its spec.yaml again instead, with the --set overrides it had (its "
            "resolved.json holds the values that ran)"
        ) from None
    except (OSError, ValueError) as exc:
        raise InfraError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != LOCK_FORMAT:
        raise InfraError(
            f"{path} is not a lock file of format {LOCK_FORMAT} (written by another slime-submit version?)"
        )
    return doc


def update_lock_from_preflight(run_dir: Path) -> dict[str, Any] | None:
    """Merge hosts/GPUs of every task's ``preflight.json`` into ``lock.json`` (None: no lock).

    Idempotent and cheap when nothing changed (the lock keeps each report's ``created`` time);
    best effort: a run dir this user cannot write keeps its lock as it was."""
    paths = RunPaths(Path(run_dir))
    try:
        doc = json.loads(paths.lock.read_text())
    except (OSError, ValueError):
        return None
    hosts = dict(doc.get("hosts") or {})
    changed = False
    for i in paths.task_indices():
        tp = TaskPaths(paths.root, i)
        try:
            pre = json.loads(tp.preflight_json.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(pre, dict) or (hosts.get(str(i)) or {}).get("created") == pre.get("created"):
            continue
        hosts[str(i)] = {
            "created": pre.get("created"),
            "ok": pre.get("ok"),
            "job_id": pre.get("job_id"),
            "nodes": [
                {
                    k: n.get(k)
                    for k in (
                        "rank",
                        "host",
                        "ip",
                        "gpus",
                        "cuda_visible_devices",
                        "slurm_gpus",
                        "nvidia_smi",
                        "torch_cuda",
                    )
                }
                for n in pre.get("nodes") or []
                if isinstance(n, dict)
            ],
        }
        changed = True
    if changed:
        doc["hosts"] = hosts
        try:
            atomic_write(paths.lock, json.dumps(doc, indent=1) + "\n")
        except OSError:
            pass  # best effort: someone else's read-only run dir still gets its status shown
    return doc


# ----------------------------------------------------------------------------- duplicates
class DuplicateRun(SpecError):
    """The same resolved spec is already pending/running (exit code 2 unless ``--force``)."""

    def __init__(self, run_dir: Path, job_ids: list[str], state: str) -> None:
        self.run_dir, self.job_ids, self.state = run_dir, job_ids, state
        jobs = f" as job {', '.join(job_ids)}" if job_ids else ""
        super().__init__(
            [
                Problem(
                    path="",
                    message=f"this exact spec (same resolved spec) is already {state}{jobs}, run dir {run_dir}; "
                    "refusing to submit a duplicate",
                    hint=f"watch it with `slime-submit status {shlex.quote(str(run_dir))}`, stop it with "
                    f"`slime-submit cancel {shlex.quote(str(run_dir))}`, "
                    "or pass --force to submit another copy",
                )
            ]
        )


def same_spec_runs(parent: Path, sha: str, launcher: str | None = None, *, limit: int = 50) -> list[RunPaths]:
    """Run dirs directly under ``parent`` whose ``resolved.json`` hashes to ``sha`` (newest first)."""
    try:
        children = [p for p in Path(parent).iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    runs = []
    for d in sorted(children, key=lambda p: p.stat().st_mtime, reverse=True):
        paths = RunPaths(d)
        try:
            if spec_sha256(paths.resolved.read_bytes()) != sha:
                continue
        except OSError:
            continue
        jobs = paths.read_jobs()
        if jobs.get("preflight_only") or (launcher is not None and jobs.get("launcher", launcher) != launcher):
            continue
        runs.append(paths)
        if len(runs) >= limit:
            break
    return runs


def refuse_duplicate(request: Any, options: Any, status: Callable[[RunPaths], Any]) -> None:
    """Raise :class:`DuplicateRun` when ``request``'s spec is already active (see the module doc).

    ``status(paths)`` is the launcher's ``status``: it returns an object with ``state`` (a
    ``slime.core.states.RunState``) and ``job_ids``."""
    if getattr(options, "force", False) or getattr(options, "preflight_only", False):
        return
    sha = spec_sha256(request.file("resolved.json"))
    for paths in same_spec_runs(Path(request.run_dir).parent, sha, request.launcher):
        st = status(paths)
        if st.state.is_active:
            raise DuplicateRun(paths.root, list(st.job_ids), st.state)


# ----------------------------------------------------------------------------- rerun
def loaded_from_run(paths: RunPaths, lock: dict[str, Any]):
    """A ``LoadedSpec`` of exactly the run's recorded resolved specs (base and per task), with the
    run-dir-derived checkpoint dir cleared so the rerun gets its own."""
    import msgspec
    from msgspec.structs import replace

    from slime.spec.load import LoadedSpec, Task
    from slime.spec.types import Spec

    try:
        base = msgspec.json.decode(paths.resolved.read_bytes(), type=Spec)
        text = paths.spec.read_text()
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InfraError(f"cannot read the recorded spec of {paths.root}: {exc}") from None
    if spec_sha256(paths.resolved.read_bytes()) != lock.get("spec_sha256"):
        raise InfraError(
            f"{paths.resolved} no longer matches the lock's spec_sha256: the run dir was edited; "
            "refusing to rerun something other than what ran"
        )
    old_roots = {str(paths.root), str(lock.get("run_dir"))}
    tasks = []
    for i in range(int(lock.get("spec", {}).get("tasks") or len(paths.task_indices()) or 1)):
        tp = paths.task(i)
        try:
            doc = json.loads(tp.resolved.read_text())
            spec = msgspec.convert(doc["spec"], type=Spec)
        except (OSError, ValueError, KeyError, msgspec.ValidationError) as exc:
            raise InfraError(f"cannot read {tp.resolved}: {exc}") from None
        ckpt = spec.train.checkpoint.dir
        if ckpt is not None and any(ckpt == str(TaskPaths(Path(r), i).checkpoints) for r in old_roots):
            spec = replace(spec, train=replace(spec.train, checkpoint=replace(spec.train.checkpoint, dir=None)))
        tasks.append(Task(index=i, overrides=doc.get("overrides") or {}, spec=spec))
    source = Path(lock["spec"]["path"]) if (lock.get("spec") or {}).get("path") else paths.spec
    site = None
    if isinstance(lock.get("cluster_profile"), dict):  # the values are in the resolved spec; keep their sources
        from slime.spec.clusters import SiteRecord

        site = SiteRecord.from_json(lock["cluster_profile"])
    return LoadedSpec(
        source=source,
        text=text,
        spec=base,
        tasks=tuple(tasks),
        overrides=tuple((lock.get("spec") or {}).get("overrides") or ()),
        site=site,
    )


def rerun_extra(paths: RunPaths, lock: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(``SubmitOptions.extra``, environment to set) that reproduce the original submit's options."""
    opts = lock.get("options") or {}
    extra: dict[str, Any] = {
        "rerun_of": {
            "run_dir": str(paths.root),
            "spec_sha256": lock.get("spec_sha256"),
            "lock_sha256": spec_sha256(paths.lock.read_bytes()),
        }
    }
    if opts.get("driver"):
        extra["driver"] = opts["driver"]
    python = opts.get("python") or ((lock.get("python") or {}).get("executable") if not lock.get("container") else None)
    if python and (opts.get("python") or Path(python).exists()):
        extra["python"] = python
    env = {"SLIME_DRIVER": opts["driver_env"]} if opts.get("driver_env") else {}
    return extra, env
