"""The remote reward against a real aiohttp server on 127.0.0.1 (no fakes).

Backoff is shrunk (``backoff_s=0.001``) so retries take milliseconds; the retry
policy itself (which errors retry, how many attempts) is what is asserted.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from slime.rl.rewards import batch_rewards, make_reward_fn
from slime.rl.rewards.remote import RemoteReward, RemoteRewardError, parse_reward_reply
from slime.rl.sample import Sample

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def reward_server(routes: dict[str, Handler]) -> AsyncIterator[str]:
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_post(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def _client(url: str, **kw: float | int) -> RemoteReward:
    return RemoteReward(url, backoff_s=0.001, max_backoff_s=0.01, **kw)  # type: ignore[arg-type]


SAMPLE = Sample(prompt="2+2=", response="4", label="4")


def test_two_503s_then_success_takes_three_attempts() -> None:
    hits: list[dict[str, object]] = []

    async def flaky(request: web.Request) -> web.Response:
        hits.append(await request.json())
        if len(hits) <= 2:
            return web.Response(status=503, text="warming up")
        return web.json_response({"reward": 0.75})

    async def main() -> None:
        async with reward_server({"/score": flaky}) as base:
            async with _client(f"{base}/score", max_retries=5) as fn:
                assert await fn(SAMPLE) == 0.75
                assert fn.attempts == 3

    asyncio.run(main())
    assert len(hits) == 3
    assert hits[0] == {"prompt": "2+2=", "response": "4", "label": "4"}


def test_400_is_not_retried() -> None:
    hits = 0

    async def bad(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        return web.Response(status=400, text="missing field 'label'")

    async def main() -> None:
        async with reward_server({"/score": bad}) as base:
            async with _client(f"{base}/score", max_retries=5) as fn:
                with pytest.raises(RemoteRewardError, match="HTTP 400 \\(not retried\\): missing field"):
                    await fn(SAMPLE)

    asyncio.run(main())
    assert hits == 1


def test_retries_are_bounded_and_429_is_retried() -> None:
    hits: dict[str, int] = defaultdict(int)

    async def always_503(request: web.Request) -> web.Response:
        hits["503"] += 1
        return web.Response(status=503)

    async def limited_once(request: web.Request) -> web.Response:
        hits["429"] += 1
        if hits["429"] == 1:
            return web.Response(status=429, text="slow down")
        return web.Response(text="1")

    async def main() -> None:
        async with reward_server({"/down": always_503, "/limited": limited_once}) as base:
            async with _client(f"{base}/down", max_retries=2) as fn:
                with pytest.raises(RemoteRewardError, match="failed after 3 attempt\\(s\\): HTTP 503"):
                    await fn(SAMPLE)
            async with _client(f"{base}/limited", max_retries=2) as fn:
                assert await fn(SAMPLE) == 1.0

    asyncio.run(main())
    assert hits == {"503": 3, "429": 2}


def test_timeouts_are_retried_then_reported() -> None:
    hits = 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal hits
        hits += 1
        await asyncio.sleep(0.5)
        return web.json_response({"reward": 1})

    async def main() -> None:
        async with reward_server({"/slow": slow}) as base:
            async with _client(f"{base}/slow", timeout_s=0.1, max_retries=1) as fn:
                with pytest.raises(RemoteRewardError, match="failed after 2 attempt\\(s\\): timed out"):
                    await fn(SAMPLE)

    asyncio.run(main())
    assert hits == 2


def test_connection_refused_is_retried() -> None:
    with socket.socket() as s:  # a port that was just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with _client(f"http://127.0.0.1:{port}/score", max_retries=2) as fn:
            with pytest.raises(RemoteRewardError, match="failed after 3 attempt\\(s\\)"):
                await fn(SAMPLE)
            assert fn.attempts == 3

    asyncio.run(main())


def test_reply_formats_and_bad_replies_are_not_retried() -> None:
    hits: dict[str, int] = defaultdict(int)

    def reply(name: str, body: str, content_type: str = "application/json") -> Handler:
        async def handler(request: web.Request) -> web.Response:
            hits[name] += 1
            return web.Response(text=body, content_type=content_type)

        return handler

    routes = {
        "/obj": reply("obj", json.dumps({"reward": 2, "extra": "ignored"})),
        "/num": reply("num", "0.25"),
        "/text": reply("text", " -1.5\n", "text/plain"),
        "/wrong": reply("wrong", json.dumps({"score": 1})),
        "/nan": reply("nan", "NaN", "text/plain"),
    }

    async def main() -> None:
        async with reward_server(routes) as base:
            # via the factory, as the runtime builds it
            fn = make_reward_fn("remote", url=f"{base}/obj", timeout_s=5, max_retries=3)
            assert isinstance(fn, RemoteReward)
            samples = [Sample(index=i, response=str(i), label=None) for i in range(5)]
            assert await batch_rewards(fn, samples, concurrency=2) == [2.0] * 5
            await fn.aclose()
            for path, expected in (("/num", 0.25), ("/text", -1.5)):
                async with _client(base + path, max_retries=3) as c:
                    assert await c(SAMPLE) == expected
            for path, message in (("/wrong", "no 'reward' key"), ("/nan", "must be finite")):
                async with _client(base + path, max_retries=4) as c:
                    with pytest.raises(RemoteRewardError, match=message):
                        await c(SAMPLE)

    asyncio.run(main())
    assert hits["obj"] == 5 and hits["wrong"] == 1 and hits["nan"] == 1


def test_parse_reward_reply_and_unserialisable_label() -> None:
    assert parse_reward_reply('{"reward": 1}') == 1.0
    for bad in ("true", "[1]", "null", "high", '{"reward": "x"}'):
        with pytest.raises(ValueError):
            parse_reward_reply(bad)
    fn = RemoteReward("http://127.0.0.1:9/score", max_retries=3)
    with pytest.raises(ValueError, match="sample.label of type object cannot be sent as JSON"):
        asyncio.run(fn(Sample(label=object())))
    assert fn.attempts == 0
    with pytest.raises(ValueError, match="max_retries must be an integer >= 0"):
        RemoteReward("http://127.0.0.1:9/", max_retries=-1)


def test_reward_key_picks_the_entry_of_a_slime_style_reply() -> None:
    """slime's remote_rm returns the server's JSON body; --reward-key (reward.key) picks the reward."""

    async def dapo_like(request: web.Request) -> web.Response:
        return web.json_response({"score": -1.0, "acc": False, "pred": "41"})

    async def main() -> None:
        async with reward_server({"/score": dapo_like}) as base:
            fn = make_reward_fn("remote", url=f"{base}/score", max_retries=0, key="score")
            assert await fn(SAMPLE) == -1.0
            await fn.aclose()
            async with _client(f"{base}/score", max_retries=0) as plain:
                with pytest.raises(RemoteRewardError, match=r"reply object has no 'reward' key \(reward.key\)"):
                    await plain(SAMPLE)

    asyncio.run(main())
