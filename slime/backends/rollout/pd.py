"""Prefill/decode pairing of ``/generate`` requests in the engine client (sglang-router 0.3.2's ``mini_lb``).

With prefill/decode engine groups each request goes to one decode engine and one prefill engine at once, both
bodies carrying the prefill engine's host and KV bootstrap port and one random ``bootstrap_room`` per item, so
that SGLang moves that prefill's KV cache to that decode engine. Guaranteed: the reply is the decode engine's
(its output log-probs include the first token, sampled by the prefill); a failure on either side raises
``EngineError`` naming that engine, after the other side's request is cancelled and aborted; the job's bearer
token goes to both. Weight updates and control calls are not here: the backend sends them to every engine.
Not done: streaming, and the prompt's log-probs (the prefill's reply is dropped; rollouts use none).
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from slime.backends.rollout.client import EngineClient, EngineError, generate_payload, generate_results

__all__ = ["PairedClient", "PrefillPool", "bootstrap_fields", "paired_clients"]


def _host(url: str) -> str:
    """The prefill engine's host as SGLang's bootstrap client takes it (an IPv6 address in brackets)."""
    host = urlparse(url).hostname or ""
    try:
        ipaddress.IPv6Address(host)
        return f"[{host}]"
    except ValueError:
        return host


def bootstrap_fields(host: str, port: int, batch: int | None) -> dict[str, Any]:
    """``bootstrap_host/port/room`` of one request (lists of ``batch`` for a batch, as ``mini_lb`` sends).

    A room is 63 random bits from the OS (``secrets``): the run seeds ``random``, and two requests in flight
    on one prefill engine must not share a room."""
    if batch is None:
        return {"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": secrets.randbits(63)}
    return {
        "bootstrap_host": [host] * batch,
        "bootstrap_port": [port] * batch,
        "bootstrap_room": [secrets.randbits(63) for _ in range(batch)],
    }


class PrefillPool:
    """The prefill engines (URL → KV bootstrap port) that the decode engines' clients share.

    Each request takes the engine with the fewest prompt tokens in flight (ties: the first): prefill work
    grows with the prompt, and a slow or busy engine then gets less; no state beyond one counter each."""

    def __init__(self, bootstrap: Mapping[str, int], **client_args: Any) -> None:
        if not bootstrap:
            raise ValueError("prefill/decode pairing needs at least one prefill engine")
        self.clients = [EngineClient(u, **client_args) for u in bootstrap]
        self.hosts = [_host(u) for u in bootstrap]
        self.ports = [int(p) for p in bootstrap.values()]
        self.load = [0] * len(self.clients)  # prompt tokens in flight per engine

    def pick(self) -> int:
        return min(range(len(self.load)), key=self.load.__getitem__)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients))


async def _side(role: str, client: EngineClient, payload: dict[str, Any]) -> Any:
    try:
        return await client.post("/generate", payload)
    except EngineError as exc:  # same type (EngineUnavailable stays one), the role in the message
        raise type(exc)(exc.url, f"{role} engine of a prefill/decode pair: {exc.message}", exc.status) from None


class PairedClient:
    """A decode engine's client whose ``generate`` pairs each request with an engine of ``pool``.

    The rollout manager's generate target (``generate``, ``abort``, ``health``, ``close``, ``base_url``:
    the decode engine's); ``pool`` is closed by its owner."""

    def __init__(self, decode: EngineClient, pool: PrefillPool) -> None:
        self.decode, self.pool, self.base_url = decode, pool, decode.base_url
        self._prefill_of: dict[str, EngineClient] = {}  # rid in flight -> its prefill engine (abort)

    async def generate(
        self,
        input_ids: Sequence[int] | Sequence[Sequence[int]],
        sampling_params: dict | Sequence[dict] | None = None,
        *,
        return_logprob: bool = True,
        rid: str | Sequence[str] | None = None,
    ) -> Any:
        """As :meth:`EngineClient.generate`, on this decode engine and a prefill engine at once."""
        payload = generate_payload(input_ids, sampling_params, return_logprob=return_logprob, rid=rid)
        ids = payload["input_ids"]
        batch = len(ids) if isinstance(ids[0], list) else None
        i = self.pool.pick()
        payload.update(bootstrap_fields(self.pool.hosts[i], self.pool.ports[i], batch))
        tokens = sum(map(len, ids)) if batch is not None else len(ids)
        rids = [] if rid is None else [rid] if isinstance(rid, str) else list(rid)
        self._prefill_of.update(dict.fromkeys(rids, self.pool.clients[i]))
        self.pool.load[i] += tokens
        try:
            body = await self._both(i, tokens, payload, rids)
        finally:
            for r in rids:
                self._prefill_of.pop(r, None)
        return generate_results(body, payload, self.base_url + "/generate")

    async def _both(self, i: int, tokens: int, payload: dict[str, Any], rids: list[str]) -> Any:
        """POST ``payload`` to prefill engine ``i`` and the decode engine; the decode's reply."""
        prefill, released = self.pool.clients[i], []

        def release() -> None:  # once: at the prefill's reply, or at the end if its task never ran
            if not released:
                released.append(True)
                self.pool.load[i] -= tokens

        async def prefill_side() -> Any:
            try:
                return await _side("prefill", prefill, payload)
            finally:
                release()  # its share of the work ends with its reply

        sides = [asyncio.ensure_future(prefill_side()), asyncio.ensure_future(_side("decode", self.decode, payload))]
        try:
            await asyncio.wait(sides, return_when=asyncio.FIRST_EXCEPTION)
            for s in sides:
                if s.done() and s.exception() is not None:
                    raise s.exception()
            return sides[1].result()
        finally:
            left = [(s, c) for s, c in zip(sides, (prefill, self.decode)) if not s.done()]
            for s, _ in left:
                s.cancel()
            # the other side would wait for its partner (KV cache never sent or never taken): end it
            await asyncio.gather(
                *(s for s, _ in left), *(c.abort(r) for _, c in left for r in rids), return_exceptions=True
            )
            release()

    async def abort(self, rid: str | None = None, *, abort_all: bool = False) -> None:
        """Abort ``rid`` on the decode engine and on the prefill engine it was paired with."""
        prefill = self.pool.clients if abort_all else [c for c in (self._prefill_of.get(rid or ""),) if c]
        await asyncio.gather(
            self.decode.abort(rid, abort_all=abort_all), *(p.abort(rid, abort_all=abort_all) for p in prefill)
        )

    async def health(self) -> bool:
        return await self.decode.health()

    async def close(self) -> None:
        await self.decode.close()


def paired_clients(
    urls: Sequence[str], bootstrap: Mapping[str, int], **client_args: Any
) -> tuple[list[Any], PrefillPool | None]:
    """(the generate targets, the prefill pool or None): one client per engine of ``urls`` that is not a
    prefill engine (``bootstrap``: prefill URL → KV bootstrap port), paired with the pool when there is one."""
    if not bootstrap:
        return [EngineClient(u, **client_args) for u in urls], None
    unknown = sorted(set(bootstrap) - set(urls))
    if unknown:
        raise ValueError(f"prefill engine(s) {', '.join(unknown)} are not among the engines {list(urls)}")
    pool = PrefillPool(bootstrap, **client_args)
    decode = [u for u in urls if u not in bootstrap]
    if not decode:
        raise ValueError("prefill/decode pairing needs at least one decode engine")
    return [PairedClient(EngineClient(u, **client_args), pool) for u in decode], pool
