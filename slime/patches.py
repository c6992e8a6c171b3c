"""Pinned upstream engines and our patches to them: check, apply, and record for provenance.

``patches/pins.toml`` pins each engine's version and artifact SHA-256s; ``patches/<engine>/<version>/*.patch``
are ``-p1`` unified diffs against the installed package root, applied in file-name order.
:func:`check` downloads and verifies the pinned artifact and dry-runs every patch; :func:`apply`
patches the installed package (all or nothing, only at the pinned version) and records it;
:func:`applied_patches` reads those records for provenance.
Guaranteed: nothing is applied unless every patch applies. Network: only pip's configured index.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from slime.core.errors import InfraError

__all__ = [
    "CheckResult",
    "PatchError",
    "Pin",
    "applied_patches",
    "apply",
    "check",
    "load_pins",
    "patch_files",
    "patches_dir",
]


class PatchError(RuntimeError):
    """A patch does not apply, or the pinned artifact does not match its hash."""


@dataclass(frozen=True, slots=True)
class Pin:
    engine: str
    version: str
    import_name: str
    sha256: dict[str, str]
    why: str = ""


@dataclass
class CheckResult:
    engine: str
    version: str
    artifact: str
    sha256: str
    patches: list[dict] = field(default_factory=list)  # {name, ok, output}

    @property
    def ok(self) -> bool:
        return all(p["ok"] for p in self.patches)

    def summary(self) -> str:
        n = len(self.patches)
        bad = [p["name"] for p in self.patches if not p["ok"]]
        state = "all apply cleanly" if not bad else f"FAILED: {', '.join(bad)}"
        if n == 0:
            state = (
                "pinned wheel fetched + verified"
                if self.artifact.endswith(".whl")
                else "pinned sdist fetched + verified"
            )
        return f"{self.engine} {self.version}: {n} patch{'es' if n != 1 else ''}, {state} ({self.artifact})"


def patches_dir() -> Path:
    return Path(os.environ.get("SLIME_PATCHES_DIR") or Path(__file__).resolve().parents[1] / "patches")


def load_pins(root: Path | None = None) -> dict[str, Pin]:
    path = (root or patches_dir()) / "pins.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PatchError(f"cannot read the pins file {path}: {exc}") from None
    pins = {}
    for engine, entry in data.items():
        if not isinstance(entry, dict) or "version" not in entry or "sha256" not in entry:
            raise PatchError(f"{path}: [{engine}] needs 'version' and a [{engine}.sha256] table")
        pins[engine] = Pin(
            engine=engine,
            version=str(entry["version"]),
            import_name=entry.get("import", engine),
            sha256=dict(entry["sha256"]),
            why=entry.get("why", ""),
        )
    return pins


def _pin(engine: str, version: str | None, root: Path | None) -> Pin:
    pins = load_pins(root)
    if engine not in pins:
        raise PatchError(f"unknown engine {engine!r}; pinned engines: {', '.join(sorted(pins))}")
    pin = pins[engine]
    if version is not None and version != pin.version:
        raise PatchError(f"{engine} is pinned to {pin.version}, not {version}; change patches/pins.toml to move it")
    return pin


def patch_files(engine: str, version: str, root: Path | None = None) -> list[Path]:
    return sorted(((root or patches_dir()) / engine / version).glob("*.patch"))


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(pin: Pin, dest: Path) -> tuple[Path, str]:
    """Download the pinned artifact for this interpreter/platform and verify its SHA-256."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "--quiet",
        "-d",
        str(dest),
        f"{pin.engine}=={pin.version}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise InfraError(
            f"pip download {pin.engine}=={pin.version} failed (is the package index reachable?):\n"
            f"{proc.stderr.strip()[-2000:]}"
        )
    files = [p for p in dest.iterdir() if p.suffix in (".whl", ".gz", ".zip")]
    if len(files) != 1:
        raise PatchError(f"expected one downloaded artifact for {pin.engine}=={pin.version}, got {files}")
    artifact = files[0]
    digest = _sha_file(artifact)
    expected = pin.sha256.get(artifact.name)
    if expected is None:
        raise PatchError(
            f"{artifact.name} is not listed under [{pin.engine}.sha256] in pins.toml; add its PyPI "
            f"SHA-256 (downloaded file hashes to {digest})"
        )
    if digest != expected:
        raise PatchError(
            f"{artifact.name}: SHA-256 {digest} does not match the pin {expected} (tampered or "
            f"re-uploaded artifact); refusing to use it"
        )
    return artifact, digest


def _extract(artifact: Path, dest: Path) -> Path:
    if artifact.suffix == ".whl":
        with zipfile.ZipFile(artifact) as z:
            z.extractall(dest)
        return dest
    with tarfile.open(artifact) as t:
        t.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else dest


def _run_patch(patch: Path, root: Path, *, dry_run: bool) -> tuple[bool, str]:
    if shutil.which("git"):
        # Ceiling dirs: never let git discover an enclosing repository (site-packages may sit in one).
        env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(root.resolve().parent)}
        cmd = ["git", "apply", "-p1", *(["--check"] if dry_run else []), str(patch.resolve())]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
    else:
        cmd = ["patch", "-p1", "--batch", "--forward", *(["--dry-run"] if dry_run else []), "-i", str(patch.resolve())]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()


def check(engine: str, version: str | None = None, *, root: Path | None = None) -> CheckResult:
    """Fetch + verify the pinned artifact and dry-run every patch against it."""
    pin = _pin(engine, version, root)
    with tempfile.TemporaryDirectory(prefix=f"slime-patches-{engine}-") as tmp:
        artifact, digest = fetch(pin, Path(tmp) / "dl")
        tree = _extract(artifact, Path(tmp) / "src")
        result = CheckResult(engine=engine, version=pin.version, artifact=artifact.name, sha256=digest)
        for patch in patch_files(engine, pin.version, root):
            ok, output = _run_patch(patch, tree, dry_run=True)
            result.patches.append({"name": patch.name, "ok": ok, "output": output[-2000:]})
    return result


def _installed_root(pin: Pin) -> Path:
    spec = importlib.util.find_spec(pin.import_name.split(".")[0])
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(f"{pin.engine} is not installed here (cannot import {pin.import_name!r})")
    return Path(list(spec.submodule_search_locations)[0]).parent


def _record_path(pin: Pin, target: Path) -> Path:
    return target / f".slime-patches-{pin.engine}.json"


def apply(
    engine: str, version: str | None = None, *, target: Path | None = None, root: Path | None = None
) -> list[dict]:
    """Apply every patch to the installed (or ``target``) package; return what was recorded."""
    pin = _pin(engine, version, root)
    if target is None:
        try:
            installed = importlib.metadata.version(pin.engine)
        except importlib.metadata.PackageNotFoundError:
            raise PatchError(
                f"{pin.engine} is not installed here; install {pin.engine}=={pin.version} "
                "(then apply the patches), or pass a target directory"
            ) from None
        if installed != pin.version:
            raise PatchError(
                f"installed {pin.engine} is {installed}, but the patches are for the pinned "
                f"{pin.version}; install {pin.engine}=={pin.version}"
            )
        target = _installed_root(pin)
    record_path = _record_path(pin, target)
    done = {r["patch"] for r in _read_record(record_path)}
    todo = [p for p in patch_files(engine, pin.version, root) if p.name not in done]
    for patch in todo:  # all or nothing
        ok, output = _run_patch(patch, target, dry_run=True)
        if not ok:
            raise PatchError(f"{patch} does not apply to {target}:\n{output[-2000:]}")
    records = _read_record(record_path)
    for patch in todo:
        ok, output = _run_patch(patch, target, dry_run=False)
        if not ok:
            raise PatchError(f"{patch} failed while applying to {target}:\n{output[-2000:]}")
        records.append(
            {
                "engine": engine,
                "version": pin.version,
                "patch": patch.name,
                "sha256": _sha_file(patch),
                "applied_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
    if todo:
        record_path.write_text(json.dumps(records, indent=1) + "\n")
    return records


def _read_record(path: Path) -> list[dict]:
    try:
        return list(json.loads(path.read_text()))
    except (OSError, ValueError):
        return []


def applied_patches(root: Path | None = None) -> list[dict]:
    """Every patch recorded as applied to the installed pinned engines (for a run's provenance)."""
    out: list[dict] = []
    try:
        pins = load_pins(root)
    except PatchError:
        return out
    for pin in pins.values():
        try:
            target = _installed_root(pin)
        except PatchError:
            continue
        out += _read_record(_record_path(pin, target))
    return out
