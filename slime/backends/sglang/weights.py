"""Weight sync from the trainer to SGLang engines: from disk, as a delta over disk, or over NCCL.

All engine calls go through ``EngineClient`` and SGLang's HTTP API at the pinned version.
**disk**: :func:`sync_from_disk` (``/update_weights_from_disk`` on every engine at once);
**delta**: :func:`sync_delta` rebuilds the checkpoint on the engine's node, then loads it;
**nccl**: driven by trainer rank 0 through ``slime.backends.rollout.collective``
(:class:`NcclWeightSync`, re-exported here).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slime.backends.rollout.collective import (
    NcclWeightSync,
    WeightSyncError,
    buckets,
    call_all,
    init_weight_update_group,
)

__all__ = ["NcclWeightSync", "WeightSyncError", "buckets", "init_weight_update_group", "sync_delta", "sync_from_disk"]


async def sync_from_disk(
    clients: Sequence[Any], model_path: str | Path, *, version: int | str | None = None, flush_cache: bool = True
) -> list[dict]:
    """Every engine loads the HF checkpoint dir ``model_path`` (visible at that path on its node)."""
    payload: dict[str, Any] = {"model_path": str(model_path), "flush_cache": flush_cache}
    if version is not None:
        payload["weight_version"] = str(version)

    async def one(client):
        body = await client.post("/update_weights_from_disk", payload, idempotent=True)
        if not isinstance(body, dict) or not body.get("success"):
            raise WeightSyncError(f"update_weights_from_disk({model_path}) failed: {body}")
        return body

    return await call_all(clients, one)


async def sync_delta(
    clients: Sequence[Any],
    *,
    base_dir: str | Path,
    delta_dir: str | Path,
    target_dir: str | Path,
    version: int | str | None = None,
) -> Path:
    """Rebuild ``target_dir`` = base + delta on this node (checksums verified), then load it everywhere.

    Call once per engine node with that node's engines; ``target_dir`` becomes
    the base of the next delta.
    """
    from slime.backends.sglang.delta import apply_delta

    await asyncio.to_thread(apply_delta, base_dir, delta_dir, target_dir)
    await sync_from_disk(clients, target_dir, version=version)
    return Path(target_dir)
