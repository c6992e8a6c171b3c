"""Moving the actor's weights into the engines, and (colocated) engine memory in and out around it.

:meth:`WeightSync.sync` makes every engine serve the actor's weights as a given version: over a
collective from trainer rank 0 (``nccl``), or through an HF export the backend loads (``disk`` /
``delta``; one export on disk between syncs). Colocated, :meth:`~WeightSync.release` frees the
engines' memory and the next ``sync`` resumes it in the order SGLang needs. Without engines or a
policy (debug modes) both do nothing. Guaranteed: after ``sync`` returns every engine acknowledged
the version (or it raised). Not guaranteed: the engines' memory state after a failed sync.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slime.backends.base import RolloutBackend, WeightSender
    from slime.spec.types import Spec

__all__ = ["Policy", "WeightSync", "write_dir"]


class Policy(Protocol):
    """The actor's side of a sync (``TrainerGroup``): every rank takes part in both calls."""

    def export(self, out_dir: Path) -> None: ...

    def push_weights(self, version: int, sender: WeightSender) -> None: ...


def write_dir(dest: Path, fill: Callable[[Path], object]) -> None:
    """``dest`` filled by ``fill(tmp)`` in a hidden sibling, then renamed into place: complete or absent."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    fill(tmp)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)


class WeightSync:
    def __init__(
        self,
        spec: Spec,
        policy: Policy | None,
        engines: RolloutBackend | None,
        exports: Path,
        *,
        say: Callable[[str], None],
    ) -> None:
        self.mode, self.colocate = spec.rollout.weight_sync, spec.rollout.colocate
        self.policy, self.engines, self.exports, self.say = policy, engines, Path(exports), say
        self.released = False  # colocated: the engines' memory is handed to the trainer
        self.last_export: Path | None = None  # disk/delta: the export the engines serve
        self._sender: WeightSender | None = None  # nccl: made on the first sync, kept by trainer rank 0
        self._said = False

    def release(self) -> None:
        """Colocated runs: the engines free their memory for the trainer until the next :meth:`sync`."""
        if not self.colocate or self.released or self.engines is None:
            return
        replies = self.engines.release_memory()
        if not self._said:  # once, with what was freed
            self._said = True
            self.say(
                "colocated: engine memory released for training: "
                + "; ".join(str(r.get("message", r)) for r in replies or [])
            )
        self.released = True

    def sync(self, version: int, hold: Callable[[], AbstractContextManager[object]] = nullcontext) -> float:
        """Every engine serves the actor's current weights as ``version``; returns the seconds taken.
        ``hold()`` is entered around the engines' update only (fully-async: generation pauses there, not
        while the weights are exported). Without engines (``train_only``) or a policy (``rollout_only``)
        there is nothing to move."""
        t = time.monotonic()
        if self.engines is None or self.policy is None:
            return 0.0
        if self.released:
            self.engines.resume_memory(["weights"])
        if self.mode == "nccl":
            if self._sender is None:
                self._sender = self.engines.weight_sender()
            with hold():
                self.policy.push_weights(version, self._sender)
        else:
            self._sync_from_disk(version, hold)
        if self.released:
            self.engines.resume_memory(["kv_cache", "cuda_graph"])
            self.released = False
        return time.monotonic() - t

    def _sync_from_disk(self, version: int, hold: Callable[[], AbstractContextManager[object]]) -> None:
        out = self.exports / f"v{version}"
        if out.exists():
            shutil.rmtree(out)
        self.policy.export(out)
        with hold():
            self.engines.update_weights(out, version)
        if self.last_export is not None and self.last_export != out:
            shutil.rmtree(self.last_export, ignore_errors=True)
        self.last_export = out

    def write_final_model(self, dest: Path) -> None:
        """The policy the engines serve (the actor's, without engines), as an HF dir at ``dest`` (complete
        or absent); ``ValueError`` without a policy (``rollout_only``: the caller copies the model)."""
        if self.policy is None:
            raise ValueError("no trained policy to write (debug.mode rollout_only)")
        if self.mode == "nccl" or self.last_export is None:  # no export on disk to copy: write one now
            write_dir(dest, self.policy.export)
        else:
            last = self.last_export
            write_dir(dest, lambda tmp: shutil.copytree(last, tmp))
