"""Atomic, numbered checkpoints: ``<dir>/<rollout_id>/`` complete or absent, the newest K kept.

A save writes every rank's file, then ``state.json``, into a hidden sibling temp dir and renames
it into place, so a reader sees the previous set or the new one, never a half-written directory;
:func:`latest` ignores leftovers and the next save removes them. Not guaranteed: durability against
power loss on file systems that reorder metadata (files and the parent are fsynced, the best POSIX
offers). Test hook ``SLIME_TEST_CHECKPOINT_PAUSE=<rollout id>:<seconds>`` (tests only) pauses once
before the rename; see docs/design-notes.md.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from slime.core.errors import CheckpointError
from slime.core.paths import atomic_write

__all__ = ["STATE_FILE", "CheckpointError", "CheckpointStore", "damaged_checkpoint"]

STATE_FILE = "state.json"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".old-"


def damaged_checkpoint(ckpt: str | os.PathLike, why: str, *, from_load: bool = False) -> CheckpointError:
    """The error for a checkpoint that cannot be read, naming it and the ones next to it that can.

    No automatic fallback to an older one: silently training from an older state would surprise.
    ``from_load``: it came from ``train.checkpoint.load`` (the run has none of its own), which is then
    the thing to change; otherwise the run's own newest is damaged and moving it aside is the fix
    (``load`` does not apply while the run has checkpoints of its own)."""
    ckpt = Path(ckpt)
    others = [str(p) for _, p in CheckpointStore(ckpt.parent).usable() if p != ckpt]
    listing = ", ".join(others) if others else "none"
    if from_load:
        fix = (
            f"point train.checkpoint.load at a complete checkpoint (complete ones next to it: {listing}), "
            "or unset it to start fresh"
        )
    else:
        after = (
            f"from the newest complete one left ({others[-1]})"
            if others
            else "fresh (or from train.checkpoint.load if set): no other complete checkpoint is there"
        )
        fix = f"delete or move aside {ckpt}; the run then resumes {after}"
    return CheckpointError(f"cannot resume from checkpoint {ckpt}: it is damaged ({why}). Fix: {fix}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _test_pause(root: Path, rollout_id: int) -> None:
    """The test hook of the module doc."""
    want, _, seconds = os.environ.get("SLIME_TEST_CHECKPOINT_PAUSE", "").partition(":")
    if not want or want.strip() != str(rollout_id):
        return
    marker = root / f".test-pause-{rollout_id}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    time.sleep(float(seconds or 60))


class CheckpointStore:
    """The checkpoints of one task under ``root``."""

    def __init__(self, root: str | os.PathLike, *, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"train.checkpoint.keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    # ---------------------------------------------------------------- reading
    def complete(self) -> list[tuple[int, Path]]:
        """``(rollout_id, dir)`` of every complete checkpoint, oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            if p.name.isdigit() and (p / STATE_FILE).is_file():
                out.append((int(p.name), p))
        return sorted(out)

    def usable(self) -> list[tuple[int, Path]]:
        """The :meth:`complete` checkpoints whose ``state.json`` is a readable JSON object."""
        out = []
        for rid, p in self.complete():
            try:
                if isinstance(json.loads((p / STATE_FILE).read_text()), dict):
                    out.append((rid, p))
            except (OSError, ValueError):
                pass
        return out

    def latest(self) -> Path | None:
        """The newest complete checkpoint; one with a damaged ``state.json`` too (:meth:`read_state`
        then says so and names the usable ones), since skipping it would resume from an older state."""
        found = self.complete()
        return found[-1][1] if found else None

    def resume_point(self, load: str | os.PathLike | None) -> Path | None:
        """Where a (re)started run resumes: its own newest checkpoint, else ``load`` (a start point only:
        a requeued run that restarted from ``load`` every time would lose its progress), else None."""
        return self.latest() or (Path(load) if load else None)

    @staticmethod
    def read_state(ckpt: str | os.PathLike, *, from_load: bool = False) -> dict[str, Any]:
        path = Path(ckpt) / STATE_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise CheckpointError(
                f"{ckpt} is not a complete checkpoint (no {STATE_FILE}); "
                "point train.checkpoint.load at a directory this runtime saved"
            ) from None
        except OSError as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        try:
            state = json.loads(text)
        except ValueError as exc:
            what = "empty" if not text.strip() else f"not valid JSON: {exc}"
            raise damaged_checkpoint(ckpt, f"cannot read {STATE_FILE}: {what}", from_load=from_load) from None
        if not isinstance(state, dict):
            raise damaged_checkpoint(
                ckpt, f"{STATE_FILE} holds {type(state).__name__}, not an object", from_load=from_load
            )
        return state

    # ---------------------------------------------------------------- writing
    def check_writable(self) -> None:
        """Create the dir and write and remove a probe file, so that an unwritable dir fails at the
        start of a run rather than at its first save, after all the training before it."""
        probe = self.root / f"{_TMP_PREFIX}probe-{os.getpid()}"  # a leftover is removed like a stale temp dir
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise CheckpointError(
                f"train.checkpoint.dir {self.root} is not writable ({exc}); set "
                "train.checkpoint.dir to a directory this job can create and write to, "
                "or fix its permissions"
            ) from None

    def begin(self, rollout_id: int) -> Path:
        """A fresh temp dir to save rollout ``rollout_id`` into (stale temp dirs are removed first)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale()
        tmp = self.root / f"{_TMP_PREFIX}{rollout_id}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        return tmp

    def commit(self, tmp: Path, rollout_id: int, state: dict[str, Any]) -> Path:
        """Write ``state.json`` into ``tmp``, rename it to ``<root>/<rollout_id>``, prune old ones."""
        atomic_write(tmp / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")
        _fsync_dir(tmp)
        _test_pause(self.root, rollout_id)
        final = self.root / str(rollout_id)
        trash = None
        if final.exists():  # the same rollout saved again (e.g. a stop right after a periodic save)
            trash = self.root / f"{_TRASH_PREFIX}{rollout_id}-{time.monotonic_ns()}"
            os.rename(final, trash)
        os.rename(tmp, final)
        _fsync_dir(self.root)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        self._prune()
        return final

    def abort(self, tmp: Path) -> None:
        shutil.rmtree(tmp, ignore_errors=True)

    def _prune(self) -> None:
        found = self.complete()
        for _, path in found[: max(0, len(found) - self.keep)]:
            shutil.rmtree(path, ignore_errors=True)

    def _remove_stale(self) -> None:
        for p in self.root.iterdir():
            if p.name.startswith((_TMP_PREFIX, _TRASH_PREFIX)):
                shutil.rmtree(p, ignore_errors=True)
