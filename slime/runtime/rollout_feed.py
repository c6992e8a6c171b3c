"""The rollouts the loop trains on, in order: generated when asked (synchronous) or one ahead (async).

:class:`RolloutFeed` sits between the driver and the rollout manager: :meth:`~RolloutFeed.take`
returns rollout ``r``, :meth:`~RolloutFeed.prefetch` (``train.async``) starts ``r + 1`` with the
weights served now, :meth:`~RolloutFeed.settle` waits for it before a weight sync, so one rollout
has one weight version and async rollouts are one update stale. Guaranteed: checkpoints stay exact
(an async checkpoint saves the prefetched rollout and a resume replays it). Not guaranteed: a
prefetch in flight when the run fails is lost. :class:`StreamFeed` (``train.async`` mode fully) takes
from the manager's continuous stream instead. Details: docs/design-notes.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slime.rl.sample import Sample
from slime.runtime.rollout import RolloutBatch

__all__ = ["PREFETCH_FILE", "RolloutFeed", "StreamFeed", "Taken", "make_feed"]

PREFETCH_FILE = "prefetched_rollout.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class Taken:
    """One rollout handed to the loop."""

    rollout_id: int
    samples: list[Sample]
    metrics: dict[str, Any]  # the generation's own counts (rollout/groups_*, rollout/rounds)
    version: int  # the weight version the engines served when its generation started
    generate_s: float  # the manager's time generating and scoring it
    wait_s: float  # the loop's wait for it in take()


def _taken(rollout_id: int, batch: RolloutBatch, version: int, seconds: float, *, since: float) -> Taken:
    """``batch`` handed to the loop, waited for since ``since`` (``time.monotonic``)."""
    return Taken(
        rollout_id=rollout_id,
        samples=batch.samples,
        metrics=batch.metrics,
        version=version,
        generate_s=seconds,
        wait_s=time.monotonic() - since,
    )


class RolloutFeed:
    def __init__(self, manager: Any, *, ahead: bool, total: int) -> None:
        self.manager, self.ahead, self.total = manager, ahead, total
        self._pending: tuple[int, int, Any] | None = None  # (rollout id, version, ref to (RolloutBatch, seconds))
        self.settle_wait_s = 0.0  # the loop's wait in settle() since the last take()

    @property
    def pending_id(self) -> int | None:
        """The rollout generated (or being generated) ahead, if any."""
        return None if self._pending is None else self._pending[0]

    def take(self, rollout_id: int, version: int) -> Taken:
        """Rollout ``rollout_id``: the prefetched one, or generated now with the engines' ``version``."""
        import ray

        t = time.monotonic()
        if self._pending is None or self._pending[0] != rollout_id:
            self._pending = (rollout_id, version, self.manager.generate_timed.remote(rollout_id, version))
        _, used, ref = self._pending
        self._pending = None
        batch, seconds = ray.get(ref)
        self.settle_wait_s = 0.0
        return _taken(rollout_id, batch, used, seconds, since=t)

    def prefetch(self, rollout_id: int, version: int) -> None:
        """Async only: start generating ``rollout_id`` (if the run has it) with the engines' ``version``."""
        if self.ahead and rollout_id < self.total and self._pending is None:
            self._pending = (rollout_id, version, self.manager.generate_timed.remote(rollout_id, version))

    def settle(self) -> None:
        """Wait until the rollout generated ahead is complete (before the engines' weights change)."""
        import ray

        if self._pending is not None:
            t = time.monotonic()
            ray.wait([self._pending[2]], num_returns=1, fetch_local=False)
            self.settle_wait_s += time.monotonic() - t

    def start(self) -> None:
        """Generation that runs on its own (fully-async) starts; here nothing does."""

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Around a weight update or a checkpoint: generation that runs on its own pauses; here none does."""
        yield

    def checkpoint_files(self) -> dict[str, str]:
        """``{PREFETCH_FILE: json}`` when a rollout was generated ahead (call after :meth:`settle`)."""
        import ray

        if self._pending is None:
            return {}
        rollout_id, version, ref = self._pending
        batch, seconds = ray.get(ref)
        doc = {
            "rollout_id": rollout_id,
            "version": version,
            "generate_s": seconds,
            "metrics": batch.metrics,
            "samples": [s.to_dict() for s in batch.samples],
        }
        return {PREFETCH_FILE: json.dumps(doc)}

    def restore(self, checkpoint: Path, rollout_id: int) -> None:
        """Put back rollout ``rollout_id`` saved in ``checkpoint`` by :meth:`checkpoint_files`."""
        import ray

        from slime.core.errors import CheckpointError

        path = Path(checkpoint) / PREFETCH_FILE
        try:
            doc = json.loads(path.read_text())
            batch = RolloutBatch([Sample.from_dict(d) for d in doc["samples"]], dict(doc.get("metrics", {})))
            if doc["rollout_id"] != rollout_id:
                raise ValueError(f"it holds rollout {doc['rollout_id']}, state.json says {rollout_id}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"checkpoint {checkpoint}: cannot read the rollout an async run generated ahead "
                f"({PREFETCH_FILE}: {exc}); move this checkpoint aside to resume from an older one"
            ) from None
        self._pending = (rollout_id, int(doc["version"]), ray.put((batch, float(doc["generate_s"]))))


class StreamFeed(RolloutFeed):
    """``train.async`` mode fully: each rollout is ``rollout.batch_size`` groups the manager's stream has
    ready; the stream pauses (between groups) while the weights change or a checkpoint is taken, whose
    manager state then holds the ready groups (nothing is generated ahead in this feed's own sense)."""

    def __init__(self, manager: Any, *, total: int) -> None:
        super().__init__(manager, ahead=False, total=total)
        self.started = False  # weight syncs before the RL loop (SFT warm-up, resume) have no stream to pause

    def take(self, rollout_id: int, version: int) -> Taken:
        import ray

        t = time.monotonic()
        batch, seconds = ray.get(self.manager.stream_take.remote(rollout_id, version))
        return _taken(rollout_id, batch, version, seconds, since=t)

    def start(self) -> None:
        import ray

        ray.get(self.manager.stream_start.remote())
        self.started = True

    @contextmanager
    def hold(self) -> Iterator[None]:
        import ray

        if not self.started:
            yield
            return
        ray.get(self.manager.stream_pause.remote())
        yield
        ray.get(self.manager.stream_start.remote())


def make_feed(manager: Any, spec: Any) -> RolloutFeed:
    """The feed ``train.async`` asks for."""
    total, mode = spec.rollout.num_rollouts or 0, spec.train.async_mode
    if mode == "fully":
        return StreamFeed(manager, total=total)
    return RolloutFeed(manager, ahead=mode == "one_step", total=total)
