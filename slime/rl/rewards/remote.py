"""The ``remote`` reward: POST ``{prompt, response, label}`` to a reward server.

The server answers ``{"reward": x}`` (``{key: x}`` with ``reward.key``) or a bare number (JSON or text).
Connection errors, timeouts, HTTP 5xx and 429 are retried with full-jitter exponential backoff, at most
``max_retries`` times after the first attempt (no default here: the spec's ``reward.max_retries``); any
other 4xx, and a reply that is not a number, fail at once. Every failure raises :class:`RemoteRewardError`
naming the URL, the attempts and the last cause. Scoring is assumed idempotent, so POSTs are safe to
repeat. ``aiohttp`` (one pooled session per event loop: call :meth:`RemoteReward.aclose` or use
``async with``) and ``tenacity`` for the retry policy.
"""

from __future__ import annotations

import asyncio
import json
import math
from types import TracebackType
from typing import Any

import aiohttp
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from slime.rl.sample import Sample

__all__ = ["RemoteReward", "RemoteRewardError", "parse_reward_reply"]


class RemoteRewardError(RuntimeError):
    """The reward server could not produce a reward for a sample."""


class _RetryableStatus(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:200]}")
        self.status = status


def _is_transient(exc: BaseException) -> bool:
    return isinstance(
        exc,
        (_RetryableStatus, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError),
    )


def parse_reward_reply(text: str, key: str | None = None) -> float:
    """``{"reward": x}`` (or ``{key: x}``), a JSON number or a plain-text number -> float; else ``ValueError``."""
    try:
        value: Any = json.loads(text)
    except json.JSONDecodeError:
        value = text.strip()
    if isinstance(value, dict):
        key = key or "reward"
        if key not in value:
            raise ValueError(f"reply object has no {key!r} key (reward.key): {text[:200]!r}")
        value = value[key]
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict)):
        raise ValueError(f"reward must be a number, got {text[:200]!r}")
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"reward must be a number, got {text[:200]!r}") from None
    if not math.isfinite(reward):
        raise ValueError(f"reward must be finite, got {reward}")
    return reward


class RemoteReward:
    """An async :class:`~slime.rl.plugins.RewardFn` backed by an HTTP reward server.

    Retry ``n`` waits a random time in ``[0, min(max_backoff_s, backoff_s * 2^n)]``. ``aiohttp`` because
    rollouts are asyncio and one pooled session serves many concurrent requests.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        headers: dict[str, str] | None = None,
        key: str | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"reward.url must be an http:// or https:// URL, got {url!r}")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        if not (isinstance(max_retries, int) and max_retries >= 0):
            raise ValueError(f"reward.max_retries must be an integer >= 0, got {max_retries!r}")
        if backoff_s < 0 or max_backoff_s < 0:
            raise ValueError("backoff_s and max_backoff_s must be >= 0")
        self.url = url
        self.timeout_s = float(timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.headers = dict(headers or {})
        self.key = key  # the reply object's entry holding the reward (default 'reward')
        self.attempts = 0  # HTTP requests sent, retries included (for metrics)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session.closed or self._loop is not loop:
            # A session is bound to the loop that made it; a new loop needs a new one.
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s), headers=self.headers
            )
            self._loop = loop
        return self._session

    async def _post_once(self, body: str) -> float:
        self.attempts += 1
        session = self._get_session()
        async with session.post(self.url, data=body, headers={"Content-Type": "application/json"}) as resp:
            text = await resp.text()
            if resp.status >= 500 or resp.status == 429:
                raise _RetryableStatus(resp.status, text)
            if resp.status >= 400:
                raise RemoteRewardError(
                    f"reward server {self.url} rejected the request with HTTP {resp.status} (not retried): {text[:200]}"
                )
        try:
            return parse_reward_reply(text, self.key)
        except ValueError as exc:
            raise RemoteRewardError(f"reward server {self.url} sent an unusable reply: {exc}") from None

    async def __call__(self, sample: Sample) -> float:
        try:
            body = json.dumps({"prompt": sample.prompt, "response": sample.response, "label": sample.label})
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"sample.label of type {type(sample.label).__name__} cannot be sent as JSON to the remote reward: {exc}"
            ) from None
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_random_exponential(multiplier=self.backoff_s, max=self.max_backoff_s),
            retry=retry_if_exception(_is_transient),
            reraise=True,
        )
        attempt_number = 0
        try:
            async for attempt in retrying:
                attempt_number = attempt.retry_state.attempt_number
                with attempt:
                    return await self._post_once(body)
        except RemoteRewardError:
            raise
        except Exception as exc:
            if not _is_transient(exc):
                raise
            cause = "timed out" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            raise RemoteRewardError(
                f"reward server {self.url} failed after {attempt_number} attempt(s): {cause}"
            ) from exc
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> RemoteReward:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
