"""Fully-async generation (``train.async: {mode: fully}``): groups generated continuously, trained when ready.

:class:`GroupStream` runs its own thread and event loop in the rollout manager, keeping up to
``capacity`` groups ready or in flight; :meth:`GroupStream.take` hands out the oldest ready groups
(by draw) within ``max_staleness`` versions of the trainer's and drops older ones (:class:`ReadyBuffer`).
:meth:`GroupStream.pause` (a weight update, a checkpoint) aborts the requests in flight and puts their
groups back, partial responses kept, to be continued first after :meth:`GroupStream.resume`.
Guaranteed: a group is trained or dropped once; ``state`` is taken paused. Not: which version a group
gets (timing decides). Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slime.runtime.rollout.source import Group

__all__ = ["GroupStream", "Ready", "ReadyBuffer", "group_version"]


def group_version(group: Group) -> int:
    """The oldest weight version among the group's tokens (a continued sample began with an older one)."""
    return min((s.weight_version for s in group.samples), default=0)


@dataclass
class Ready:
    group: Group
    version: int  # group_version when it finished


class ReadyBuffer:
    """Finished groups waiting for a train step, oldest draw first; staleness bound ``max_staleness``."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness, self.items = max_staleness, []  # type: list[Ready]

    def __len__(self) -> int:
        return len(self.items)

    def add(self, group: Group, version: int) -> None:
        self.items.append(Ready(group, version))
        self.items.sort(key=lambda x: x.group.draw)

    def drop_stale(self, current: int) -> list[Ready]:
        """Remove and return the groups more than ``max_staleness`` versions behind ``current``."""
        stale = [x for x in self.items if current - x.version > self.max_staleness]
        self.items = [x for x in self.items if current - x.version <= self.max_staleness]
        return stale

    def take(self, n: int) -> list[Ready] | None:
        """The ``n`` oldest groups, or None (nothing removed) while fewer are ready."""
        if len(self.items) < n:
            return None
        out, self.items = self.items[:n], self.items[n:]
        return out

    def to_dict(self) -> list[dict[str, Any]]:
        return [{"version": x.version, "group": x.group.to_dict()} for x in self.items]

    def load(self, items: list[dict[str, Any]]) -> None:
        self.items = [Ready(Group.from_dict(d["group"]), int(d["version"])) for d in items]


class GroupStream:
    """``draw()`` → the next group; ``run(group)`` generates and scores it, False if a pause aborted it;
    ``abort()`` aborts what runs; ``put_back(groups)`` returns aborted groups to be drawn first."""

    def __init__(
        self,
        *,
        draw: Callable[[], Group],
        run: Callable[[Group], Awaitable[bool]],
        abort: Callable[[], Awaitable[Any]],
        put_back: Callable[[list[Group]], None],
        capacity: int,
        max_staleness: int,
    ) -> None:
        self._draw, self._run, self._abort, self._put_back = draw, run, abort, put_back
        self.capacity, self.ready = capacity, ReadyBuffer(max_staleness)
        self._cond = threading.Condition()
        self._in_flight: dict[int, asyncio.Task] = {}
        self._aborted: list[Group] = []
        self._paused, self._closed = True, False
        self.error: BaseException | None = None
        self._busy_s, self._since = 0.0, None  # generating time (not paused) since the last take
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="group-stream", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the caller's thread
    def resume(self) -> None:
        """Generate (again): after :meth:`pause`, with whatever weights the engines serve now."""
        if not self._closed:
            self._call(self._resume())

    def pause(self) -> None:
        """Stop between groups: abort the requests in flight, wait for them, put their groups back."""
        if not self._closed:
            self._call(self._pause())

    def take(self, n: int, current: int) -> tuple[list[Ready], list[Ready], float]:
        """(the ``n`` oldest ready groups within the bound of version ``current``, the stale ones dropped,
        generating seconds since the last take); waits while fewer are ready."""
        dropped: list[Ready] = []
        with self._cond:
            while True:
                if self.error is not None:
                    raise RuntimeError(f"fully-async generation failed: {self.error}") from self.error
                dropped += self.ready.drop_stale(current)
                got = self.ready.take(n)
                if got is not None:
                    break
                self._loop.call_soon_threadsafe(self._fill)  # what the drops freed
                self._cond.wait(timeout=1.0)
        self._loop.call_soon_threadsafe(self._fill)
        return got, dropped, self._lap()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._call(self._pause())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)

    def _call(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _lap(self) -> float:
        now = time.monotonic()
        busy = self._busy_s + (now - self._since if self._since is not None else 0.0)
        self._busy_s, self._since = 0.0, (now if self._since is not None else None)
        return busy

    # ------------------------------------------------------------ the stream's loop
    async def _resume(self) -> None:
        self._paused, self._since = False, time.monotonic()
        self._fill()

    async def _pause(self) -> None:
        self._paused = True
        if self._since is not None:
            self._busy_s += time.monotonic() - self._since
            self._since = None
        if self._in_flight:
            await self._abort()
            await asyncio.gather(*self._in_flight.values(), return_exceptions=True)
        if self._aborted:
            self._put_back(sorted(self._aborted, key=lambda g: g.draw))
            self._aborted = []

    def _fill(self) -> None:
        with self._cond:
            room = self.capacity - len(self._in_flight) - len(self.ready)
        while room > 0 and not self._paused and self.error is None:
            group = self._draw()
            self._in_flight[group.draw] = asyncio.ensure_future(self._one(group))
            room -= 1

    async def _one(self, group: Group) -> None:
        try:
            done = await self._run(group)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's next take
            with self._cond:
                self.error = exc
                self._cond.notify_all()
            return
        finally:
            self._in_flight.pop(group.draw, None)
        if not done:
            self._aborted.append(group)
            return
        with self._cond:
            self.ready.add(group, group_version(group))
            self._cond.notify_all()
        self._fill()
