"""The fully-async buffer and stream (``slime.runtime.rollout.stream``): staleness bound, draw order, pause.

The stream runs its real thread and event loop; generation is an in-process coroutine standing in for the
engines (what the engine returns is not under test here: the e2e run in test_runtime_fully_async covers it).
"""

from __future__ import annotations

import asyncio
import threading

from slime.rl.sample import Sample, SampleStatus
from slime.runtime.rollout.source import Group
from slime.runtime.rollout.stream import GroupStream, ReadyBuffer, group_version


def group(draw: int, version: int = 0, n: int = 2) -> Group:
    return Group([Sample(prompt="p", tokens=[1], weight_version=version) for _ in range(n)], draw, 0)


def test_group_version_is_the_oldest_sample_version():
    g = group(0)
    g.samples[0].weight_version, g.samples[1].weight_version = 3, 5
    assert group_version(g) == 3


def test_take_drops_groups_beyond_the_bound_and_hands_out_the_oldest_draws():
    buf = ReadyBuffer(max_staleness=1)
    for draw, version in ((4, 3), (1, 2), (0, 1), (3, 3), (2, 2)):
        buf.add(group(draw), version)
    assert buf.drop_stale(3)[0].group.draw == 0  # 3 - 1 > 1
    assert buf.take(5) is None and len(buf) == 4  # too few: nothing removed
    assert [x.group.draw for x in buf.take(3)] == [1, 2, 3]
    assert buf.drop_stale(4) == [] and len(buf) == 1  # version 3 is within 1 of 4
    assert [x.group.draw for x in buf.drop_stale(5)] == [4]


def test_ready_buffer_round_trips_through_its_dict():
    buf = ReadyBuffer(max_staleness=2)
    buf.add(group(7, 2), 2)
    again = ReadyBuffer(max_staleness=2)
    again.load(buf.to_dict())
    assert [(x.group.draw, x.version, x.group.samples[0].weight_version) for x in again.items] == [(7, 2, 2)]


class Engine:
    """Stands in for the engines: a group finishes when released (or aborted), with the version served."""

    def __init__(self) -> None:
        self.version, self.draws, self.put_back = 0, 0, []
        self.release = asyncio.Event()
        self.lock = threading.Lock()

    def draw(self) -> Group:
        if self.put_back:
            return self.put_back.pop(0)
        self.draws += 1
        return group(self.draws - 1, version=-1)

    async def run(self, g: Group) -> bool:
        if self.release.is_set():
            for s in g.samples:
                if s.status != SampleStatus.ABORTED:  # a continued sample keeps its first version
                    s.weight_version = self.version
                s.status = SampleStatus.COMPLETED
            return True
        await self.aborted.wait()
        for s in g.samples:
            s.weight_version, s.status = self.version, SampleStatus.ABORTED
        return False

    async def abort(self) -> None:
        self.aborted.set()


def make_stream(capacity: int = 4, max_staleness: int = 1) -> tuple[GroupStream, Engine]:
    eng = Engine()
    stream = GroupStream(
        draw=eng.draw,
        run=eng.run,
        abort=eng.abort,
        put_back=lambda gs: eng.put_back.extend(gs),
        capacity=capacity,
        max_staleness=max_staleness,
    )
    asyncio.run_coroutine_threadsafe(_events(eng), stream._loop).result()
    return stream, eng


async def _events(eng: Engine) -> None:
    eng.release, eng.aborted = asyncio.Event(), asyncio.Event()


def test_a_pause_aborts_groups_in_flight_and_they_are_continued_first_after_it():
    stream, eng = make_stream(capacity=4)
    try:
        stream.resume()  # 4 groups start and hang until released
        stream.pause()  # they are aborted (partial: version 0) and put back in draw order
        assert [g.draw for g in eng.put_back] == [0, 1, 2, 3] and len(stream.ready) == 0
        eng.version = 1
        stream._loop.call_soon_threadsafe(eng.release.set)
        stream.resume()
        got, dropped, _ = stream.take(2, current=1)
        # the continued groups come first, with their first tokens' version (0): staleness 1, inside the bound
        assert [x.group.draw for x in got] == [0, 1] and [x.version for x in got] == [0, 0] and dropped == []
        got, dropped, _ = stream.take(2, current=2)  # 2 and 3 began at version 0: too old for version 2
        assert [x.group.draw for x in dropped] == [2, 3]
        assert [x.group.draw for x in got] == [4, 5] and {x.version for x in got} == {1}
    finally:
        stream.close()


def test_the_stream_never_holds_more_than_its_capacity_and_a_failure_reaches_take():
    stream, eng = make_stream(capacity=3)
    try:
        stream._loop.call_soon_threadsafe(eng.release.set)
        stream.resume()
        got, _, _ = stream.take(3, current=0)
        assert [x.group.draw for x in got] == [0, 1, 2]
        stream.pause()
        assert eng.draws == 6 and len(stream.ready) == 3  # refilled to capacity, no further

        async def boom(g: Group) -> bool:
            raise ValueError("engine gone")

        stream._run = boom
        stream.ready.items.clear()
        stream.resume()
        try:
            stream.take(1, current=0)
        except RuntimeError as exc:
            assert "engine gone" in str(exc)
        else:
            raise AssertionError("take() returned after the generation failed")
    finally:
        stream.close()
