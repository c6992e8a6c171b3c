"""Weight sync over a collective group, trainer rank 0 -> every engine, through SGLang's HTTP API.

Shared by both rollout backends and trainer rank 0 (which gets an :class:`EngineWeightSender`
from ``RolloutBackend.weight_sender()``). :func:`init_weight_update_group` mirrors SGLang's
``init_custom_process_group`` (torch's private ``_new_process_group_helper``, as SGLang: public
APIs cannot make a second independent group). :class:`NcclWeightSync` pauses, flushes, broadcasts
bucket by bucket, and always resumes generation, re-raising a bucket's error. On CPU the same code
runs with gloo. Request bodies follow SGLang's ``io_struct`` at the pinned version.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from slime.backends.base import WeightSender
from slime.core.errors import InfraError
from slime.diagnosis.beats import beat

__all__ = [
    "EngineWeightSender",
    "NcclWeightSync",
    "WeightSyncError",
    "buckets",
    "call_all",
    "init_weight_update_group",
]


class WeightSyncError(InfraError):
    """At least one engine did not take the new weights; the message names each one."""


async def call_all(clients: Sequence[Any], call) -> list[Any]:
    """``call(client)`` on every engine at once; any failure raises one error naming each engine."""
    results = await asyncio.gather(*(call(c) for c in clients), return_exceptions=True)
    failed = [(c.base_url, r) for c, r in zip(clients, results) if isinstance(r, BaseException)]
    if failed:
        raise WeightSyncError("; ".join(f"{url}: {err}" for url, err in failed))
    return list(results)


def init_weight_update_group(
    master_address: str,
    master_port: int,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str = "nccl",
    timeout_s: float = 600.0,
):
    """Join the trainer ↔ engines group (the same rendezvous as SGLang's ``init_custom_process_group``)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world, rendezvous

    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(
        rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name, timeout=timeout
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def buckets(named: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Group ``(name, tensor)`` pairs into lists of at most ``bucket_bytes`` (a larger tensor goes alone)."""
    current: list[tuple[str, Any]] = []
    size = 0
    for name, t in named:
        n = t.numel() * t.element_size()
        if current and size + n > bucket_bytes:
            yield current
            current, size = [], 0
        current.append((name, t))
        size += n
    if current:
        yield current


@dataclass
class NcclWeightSync:
    """Trainer rank 0's side of weight sync over a collective group (NCCL on GPU)."""

    clients: Sequence[Any]
    engine_gpus: Sequence[int]  # GPUs (= ranks) of each engine, in client order
    master_address: str
    master_port: int
    group_name: str = "slime_weight_sync"
    backend: str = "nccl"
    bucket_bytes: int = 512 << 20
    group: Any = None

    @property
    def world_size(self) -> int:
        return 1 + sum(self.engine_gpus)

    async def init_group(self) -> None:
        offsets = [1 + sum(self.engine_gpus[:i]) for i in range(len(self.engine_gpus))]

        async def one(pair):
            client, offset = pair
            body = await client.post(
                "/init_weights_update_group",
                {
                    "master_address": self.master_address,
                    "master_port": self.master_port,
                    "rank_offset": offset,
                    "world_size": self.world_size,
                    "group_name": self.group_name,
                    "backend": self.backend,
                },
            )
            if not isinstance(body, dict) or not body.get("success"):
                raise WeightSyncError(f"init_weights_update_group failed: {body}")

        pairs = list(zip(self.clients, offsets))
        joined = asyncio.to_thread(
            init_weight_update_group,
            self.master_address,
            self.master_port,
            rank=0,
            world_size=self.world_size,
            group_name=self.group_name,
            backend=self.backend,
        )
        results = await asyncio.gather(joined, *(one(p) for p in pairs), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise WeightSyncError(f"weight-update group {self.group_name!r} not formed: {errors[0]}")
        self.group = results[0]

    def _broadcast(self, tensors: list[Any]) -> None:
        import torch
        import torch.distributed as dist

        if tensors and tensors[0].is_cuda:  # this runs in a worker thread: its current device defaults to 0
            torch.cuda.set_device(tensors[0].device)
        for t in tensors:
            dist.broadcast(t, src=0, group=self.group)

    async def update(self, named_tensors: Iterable[tuple[str, Any]], *, version: int | str | None = None) -> int:
        """Send every tensor to every engine; return how many were sent."""
        if self.group is None:
            raise RuntimeError("call init_group() before update()")
        clients = self.clients
        await call_all(clients, lambda c: c.post("/pause_generation", {"mode": "abort"}))
        sent = 0
        try:
            await call_all(clients, lambda c: c.post("/flush_cache", None, idempotent=True, expect_json=False))
            for bucket in buckets(named_tensors, self.bucket_bytes):
                await self._send_bucket(bucket, version)
                sent += len(bucket)
                beat("weight sync")
        finally:
            await call_all(clients, lambda c: c.post("/continue_generation", {}))
        return sent

    async def _send_bucket(self, bucket: list[tuple[str, Any]], version: int | str | None) -> None:
        tensors = [t.contiguous() for _, t in bucket]
        payload: dict[str, Any] = {
            "names": [n for n, _ in bucket],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors],
            "shapes": [list(t.shape) for t in tensors],
            "group_name": self.group_name,
            "flush_cache": False,
        }
        if version is not None:
            payload["weight_version"] = str(version)

        async def one(client):
            body = await client.post("/update_weights_from_distributed", payload)
            if not isinstance(body, dict) or not body.get("success"):
                raise WeightSyncError(f"update_weights_from_distributed failed: {body}")

        # The engines' replies arrive only once they have received the broadcast.
        posts = asyncio.gather(*(one(c) for c in self.clients), return_exceptions=True)
        await asyncio.to_thread(self._broadcast, tensors)
        results = await posts
        failed = [(c.base_url, r) for c, r in zip(self.clients, results) if isinstance(r, BaseException)]
        if failed:
            raise WeightSyncError("; ".join(f"{u}: {e}" for u, e in failed))


class EngineWeightSender(WeightSender):
    """The ``WeightSender`` of engines that serve SGLang's weight-update endpoints (SGLang, built-in).

    Made in the driver (``RolloutBackend.weight_sender()``) from the engines' URLs and group ranks;
    pickled to trainer rank 0, which connects it once (forming the group) and then sends every
    version through it. Not thread-safe; one sender per trainer rank 0."""

    def __init__(self, urls: Sequence[str], engine_ranks: Sequence[int]) -> None:
        if len(urls) != len(engine_ranks):
            raise ValueError(f"{len(urls)} engine URLs but {len(engine_ranks)} engine rank counts")
        self.urls, self.engine_ranks = tuple(urls), tuple(engine_ranks)
        self._sync: NcclWeightSync | None = None

    async def connect(self, master_address: str, master_port: int, *, backend: str) -> None:
        from slime.backends.rollout.client import EngineClient

        sync = NcclWeightSync(
            clients=[EngineClient(u) for u in self.urls],
            engine_gpus=list(self.engine_ranks),
            master_address=master_address,
            master_port=master_port,
            backend=backend,
        )
        await sync.init_group()
        self._sync = sync

    async def update(self, named_tensors: Iterable[tuple[str, Any]], *, version: int) -> int:
        if self._sync is None:
            raise RuntimeError("EngineWeightSender.update() before connect()")
        return await self._sync.update(named_tensors, version=version)
