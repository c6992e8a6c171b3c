"""The one HTTP client for rollout engines: real SGLang servers and the built-in engine.

Every caller goes through :class:`EngineClient` and gets typed results (:class:`GenerateResult`).
Guaranteed: only connection failures of idempotent calls are retried (``generate``, raw ``post`` and
RL control calls never, unless marked idempotent: a resent generation or release could run twice);
every failure raises :class:`EngineError` naming URL, status and message; one ``aiohttp`` session
per event loop, so several loops may use a client; the job's secret is sent when set. aiohttp: the
engine side already depends on it and its unbounded pool carries a rollout's many concurrent
requests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from slime.core.auth import auth_headers

__all__ = [
    "ClientPool",
    "EngineClient",
    "EngineError",
    "EngineUnavailable",
    "GenerateResult",
    "generate_payload",
    "generate_results",
]


class EngineError(RuntimeError):
    """A call to a rollout engine failed."""

    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        self.url, self.status, self.message = url, status, message
        where = f"{url} (HTTP {status})" if status is not None else url
        super().__init__(f"{where}: {message}")


class EngineUnavailable(EngineError):
    """The engine could not be reached (connection refused, reset, timed out)."""


@dataclass(frozen=True)
class GenerateResult:
    """One generated sequence, as returned by ``/generate``."""

    output_ids: list[int]
    text: str
    logprobs: list[float] | None
    finish_reason: str  # "stop" | "length" | "abort"
    matched: int | str | None = None
    weight_version: str | None = None
    prompt_tokens: int | None = None
    rid: str | None = None
    meta_info: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def aborted(self) -> bool:
        return self.finish_reason == "abort"

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"

    @classmethod
    def from_response(cls, item: Any, url: str = "") -> GenerateResult:
        if not isinstance(item, dict) or not isinstance(item.get("meta_info"), dict):
            raise EngineError(url, f"unexpected /generate reply (no meta_info): {str(item)[:200]}")
        meta = item["meta_info"]
        pairs = meta.get("output_token_logprobs")
        logprobs = None
        if pairs is not None:
            logprobs = [float(p[0]) for p in pairs]
        ids = item.get("output_ids")
        if ids is None:
            if pairs is None:
                raise EngineError(
                    url,
                    "the /generate reply has neither output_ids nor output_token_logprobs; request return_logprob=True",
                )
            ids = [int(p[1]) for p in pairs]
        if logprobs is not None and len(logprobs) != len(ids):
            raise EngineError(url, f"/generate returned {len(ids)} output ids but {len(logprobs)} log-probs")
        fr = meta.get("finish_reason")
        if isinstance(fr, dict):
            reason, matched = str(fr.get("type")), fr.get("matched")
        else:
            reason, matched = (str(fr) if fr is not None else "abort"), None
        version = meta.get("weight_version")
        return cls(
            output_ids=list(ids),
            text=item.get("text", ""),
            logprobs=logprobs,
            finish_reason=reason,
            matched=matched,
            weight_version=None if version is None else str(version),
            prompt_tokens=meta.get("prompt_tokens"),
            rid=meta.get("id"),
            meta_info=meta,
        )


def _message(body: Any, text: str) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("message"):
            return str(body["message"])
    return text.strip()[:500] or "no message"


def generate_payload(
    input_ids: Sequence[int] | Sequence[Sequence[int]],
    sampling_params: dict | Sequence[dict] | None = None,
    *,
    return_logprob: bool = True,
    rid: str | Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``/generate`` body of SGLang's ``GenerateReqInput`` for token ids (a list of lists: a batch)."""
    ids = list(input_ids)
    if not ids:
        raise ValueError("input_ids must not be empty")
    batched = isinstance(ids[0], (list, tuple))
    payload: dict[str, Any] = {
        "input_ids": [list(x) for x in ids] if batched else ids,
        "sampling_params": (
            list(sampling_params) if isinstance(sampling_params, (list, tuple)) else dict(sampling_params or {})
        ),
        "return_logprob": return_logprob,
    }
    if rid is not None:
        payload["rid"] = list(rid) if isinstance(rid, (list, tuple)) else rid
    return payload


def generate_results(body: Any, payload: dict[str, Any], url: str) -> GenerateResult | list[GenerateResult]:
    """The typed reply to ``payload`` (a list for a batch), or EngineError naming ``url``."""
    ids = payload["input_ids"]
    if isinstance(ids[0], list):
        if not isinstance(body, list) or len(body) != len(ids):
            raise EngineError(url, f"expected a list of {len(ids)} results, got {str(body)[:200]}")
        return [GenerateResult.from_response(item, url) for item in body]
    return GenerateResult.from_response(body, url)


class EngineClient:
    """Async client for one engine at ``base_url`` (e.g. ``http://127.0.0.1:30000``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_connections: int = 0,
        secret: str | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine URL {base_url!r} must start with http:// or https://")
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_connections = int(max_connections)
        self.headers = auth_headers(secret)  # the job's secret by default ($SLIME_JOB_SECRET_FILE)
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    # --------------------------------------------------------------- plumbing
    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        for other in [lp for lp in self._sessions if lp.is_closed()]:
            self._sessions.pop(other)  # its loop is gone; nothing left to close
        sess = self._sessions.get(loop)
        if sess is None or sess.closed:
            sess = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers=self.headers,
            )
            self._sessions[loop] = sess
        return sess

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        sess = self._sessions.pop(loop, None)
        if sess is not None:
            await sess.close()

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        idempotent: bool,
        expect_json: bool = True,
        timeout_s: float | None = None,
    ) -> Any:
        url = self.base_url + path
        attempts = 1 + (self.retries if idempotent else 0)
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        last: Exception | None = None
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(self.backoff_s * (2 ** (attempt - 1)))
            try:
                async with self._session().request(method, url, json=payload, timeout=timeout) as resp:
                    text = await resp.text()
                    body: Any = None
                    if text and (expect_json or resp.status >= 400):
                        try:
                            body = await resp.json(content_type=None)
                        except ValueError:
                            body = None
                    if resp.status >= 400:
                        raise EngineError(url, _message(body, text), resp.status)
                    if expect_json and text and body is None:
                        raise EngineError(url, f"reply is not JSON: {text[:200]!r}", resp.status)
                    return body if expect_json else text
            except TimeoutError:  # before ClientConnectionError: aiohttp's timeouts subclass both
                raise EngineUnavailable(url, f"no reply within {timeout_s or self.timeout_s:g} s") from None
            except aiohttp.ClientConnectionError as exc:
                last = exc  # refused / reset / disconnected: maybe retry
        raise EngineUnavailable(url, f"cannot connect after {attempts} attempt(s): {last}")

    # ------------------------------------------------------------------ calls
    async def post(self, path: str, json: Any = None, *, idempotent: bool = False, expect_json: bool = True) -> Any:
        """POST ``json`` to ``path``; retried on connection errors only if ``idempotent``."""
        return await self._request("POST", path, json, idempotent=idempotent, expect_json=expect_json)

    async def get(self, path: str, *, expect_json: bool = True) -> Any:
        return await self._request("GET", path, idempotent=True, expect_json=expect_json)

    async def generate(
        self,
        input_ids: Sequence[int] | Sequence[Sequence[int]],
        sampling_params: dict | Sequence[dict] | None = None,
        *,
        return_logprob: bool = True,
        rid: str | Sequence[str] | None = None,
    ) -> GenerateResult | list[GenerateResult]:
        """Generate from token ids; a list of lists gives a list of results (one request)."""
        payload = generate_payload(input_ids, sampling_params, return_logprob=return_logprob, rid=rid)
        body = await self._request("POST", "/generate", payload, idempotent=False)
        return generate_results(body, payload, self.base_url + "/generate")

    async def health(self) -> bool:
        """True when ``/health`` answers 200; False when it answers otherwise or not at all."""
        try:
            await self._request("GET", "/health", idempotent=False, expect_json=False, timeout_s=10)
            return True
        except EngineError:
            return False

    async def health_generate(self) -> bool:
        try:
            await self._request("GET", "/health_generate", idempotent=False, expect_json=False, timeout_s=60)
            return True
        except EngineError:
            return False

    async def wait_healthy(self, timeout_s: float = 300.0, interval_s: float = 0.5) -> None:
        """Poll ``/health`` until it answers 200; raise EngineUnavailable naming the URL after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while True:
            try:
                await self._request(
                    "GET",
                    "/health",
                    idempotent=False,
                    expect_json=False,
                    timeout_s=max(0.1, min(10.0, deadline - time.monotonic())),
                )
                return
            except EngineError as exc:
                last = exc.message if exc.status is None else f"HTTP {exc.status}: {exc.message}"
            if time.monotonic() + interval_s > deadline:
                raise EngineUnavailable(
                    self.base_url + "/health", f"engine not healthy after {timeout_s:g} s (last: {last})"
                )
            await asyncio.sleep(interval_s)

    async def flush_cache(self) -> None:
        await self._request("POST", "/flush_cache", idempotent=True, expect_json=False)

    async def update_weights_from_disk(
        self,
        model_path: str,
        weight_version: str | None = None,
        *,
        load_format: str | None = None,
        abort_all_requests: bool = False,
    ) -> dict:
        """Make the engine load an HF checkpoint directory; returns the reply (``success`` is True)."""
        payload: dict[str, Any] = {"model_path": str(model_path)}
        if weight_version is not None:
            payload["weight_version"] = str(weight_version)
        if load_format is not None:
            payload["load_format"] = load_format
        if abort_all_requests:
            payload["abort_all_requests"] = True
        body = await self._request("POST", "/update_weights_from_disk", payload, idempotent=True)
        if not isinstance(body, dict) or not body.get("success"):
            raise EngineError(self.base_url + "/update_weights_from_disk", _message(body, str(body)))
        return body

    async def _control(self, path: str, payload: dict) -> dict:
        body = await self._request("POST", path, payload, idempotent=False)
        if isinstance(body, dict) and body.get("success") is False:
            raise EngineError(self.base_url + path, _message(body, str(body)))
        return body if isinstance(body, dict) else {}

    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> dict:
        """Free the engine's GPU memory for a colocated trainer; ``tags`` from weights, kv_cache,
        cuda_graph (None = all). Released weights must be reloaded after the resume."""
        return await self._control("/release_memory_occupation", {"tags": None if tags is None else list(tags)})

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> dict:
        """Re-allocate what ``release_memory_occupation`` freed (None = all released tags)."""
        return await self._control("/resume_memory_occupation", {"tags": None if tags is None else list(tags)})

    async def pause_generation(self, mode: str = "abort") -> dict:
        return await self._control("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict:
        return await self._control("/continue_generation", {})

    async def get_model_info(self) -> dict:
        return await self._request("GET", "/get_model_info", idempotent=True)

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        if rid is None and not abort_all:
            raise ValueError("abort needs a rid or abort_all=True")
        payload: dict[str, Any] = {"rid": rid or ""}
        if abort_all:
            payload["abort_all"] = True
        await self._request("POST", "/abort_request", payload, idempotent=True, expect_json=False)


class ClientPool:
    """One event loop and one :class:`EngineClient` per engine, kept for a backend's life: the driver's
    calls (a weight sync every step) reuse their connections instead of a session and a loop per call."""

    def __init__(self, clients: list[EngineClient]) -> None:
        self.clients, self.loop = clients, asyncio.new_event_loop()

    def each(self, fn: Any) -> list[Any]:
        """``fn(client)`` on every engine at once; the results in engine order."""

        async def go():
            return await asyncio.gather(*(fn(c) for c in self.clients))

        return self.loop.run_until_complete(go())

    def close(self) -> None:
        try:
            for c in self.clients:
                self.loop.run_until_complete(c.close())
        finally:
            self.clients = []
            self.loop.close()
