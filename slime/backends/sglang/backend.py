"""``rollout.backend: sglang``: the RolloutBackend that starts SGLang engines and syncs their weights.

``start`` builds the commands (``launch.engine_commands``, swappable through
``command_builder`` — tests pass one that starts the built-in engine), starts
the processes of the engines placed on this node (``placement["local_nodes"]``;
all nodes when absent, i.e. single-node jobs) with bounded health-checked
startup (``process.start_processes``), then the router when there are several
engines. ``update_weights`` follows ``rollout.weight_sync``:

* ``disk``: every engine loads the HF directory written by the trainer;
* ``delta``: the first sync loads the full directory and keeps it as the base;
  later syncs write a delta (changed tensors only, checksummed) next to it,
  rebuild the full checkpoint in this node's ``<log_dir>/weights/v<version>``
  from base + delta (verifying every checksum) and load that;
* ``nccl``: needs the trainer's tensors, so the runtime drives
  ``weights.NcclWeightSync`` from trainer rank 0 (``TrainerRank.push_weights``,
  one group rank per engine GPU: :meth:`weight_sync_ranks`) and never calls
  ``update_weights``; called anyway (outside the runtime), it loads from disk.

Colocated runs (``rollout.colocate``): the runtime calls :meth:`release_memory`
after each rollout (``/release_memory_occupation``, all tags; the commands pass
``--enable-memory-saver``) and, before the next one, :meth:`resume_memory` with
``weights``, the weight update, then ``kv_cache`` and ``cuda_graph`` — the order
SGLang needs, since resumed weights hold garbage until reloaded.

``placement`` (from the runtime): ``{"hosts": [node addresses], "local_nodes":
[indices of nodes this process manages], "log_dir": path}``; every key optional.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from slime.backends.base import RolloutBackend
from slime.backends.sglang import launch, process
from slime.backends.sglang.weights import sync_delta, sync_from_disk

__all__ = ["SGLangRolloutBackend", "process_specs"]

CommandBuilder = Callable[..., Sequence[launch.EngineCommand]]


def process_specs(commands: Sequence[launch.EngineCommand], local_nodes: set[int] | None) -> list[process.ProcessSpec]:
    """The processes of ``commands`` to start on this node (names: engine<i>[-node<r>])."""
    out = []
    for c in commands:
        if local_nodes is not None and c.node not in local_nodes:
            continue
        name = f"engine{c.engine}" + (f"-node{c.node_rank}" if c.nnodes > 1 else "")
        out.append(process.ProcessSpec(name=name, argv=c.argv, url=c.url, ports=c.ports, env=c.env))
    return out


class SGLangRolloutBackend(RolloutBackend):
    def __init__(self, *, command_builder: CommandBuilder | None = None, router: bool = True) -> None:
        self.command_builder = command_builder or launch.engine_commands
        self.use_router = router
        self.processes: list[process.ManagedProcess] = []
        self.urls: list[str] = []
        self.router_url: str | None = None
        self._base: Path | None = None  # delta sync: the last full checkpoint on this node

    def start(self, spec, layout, placement: Mapping[str, Any] | None, model_dir: Path) -> list[str]:
        placement = dict(placement or {})
        self.spec = spec
        self.log_dir = Path(placement.get("log_dir") or Path(spec.logging.dir) / "engines")
        hosts = placement.get("hosts")
        local = placement.get("local_nodes")
        commands = self.command_builder(spec, layout, hosts=hosts)
        specs = process_specs(commands, set(local) if local is not None else None)
        self.processes = process.start_processes(specs, self.log_dir, timeout_s=spec.rollout.startup_timeout_s)
        self.urls = [c.url for c in commands if c.url]
        if self.use_router and (local is None or 0 in local):
            cmd = launch.router_command(spec, self.urls, host=(hosts or ["127.0.0.1"])[0])
            if cmd is not None:
                router = process.ProcessSpec(name="router", argv=cmd.argv, url=cmd.url, ports=(cmd.port,))
                self.processes += process.start_processes([router], self.log_dir,
                                                          timeout_s=spec.rollout.startup_timeout_s)
                self.router_url = cmd.url
        return list(self.urls)

    def _clients(self):
        from slime.backends.rollout.client import EngineClient

        return [EngineClient(u) for u in self.urls]

    async def _update(self, source: Path, version: int) -> None:
        clients = self._clients()
        try:
            if self.spec.rollout.weight_sync != "delta" or self._base is None:
                await sync_from_disk(clients, source, version=version)
                if self.spec.rollout.weight_sync == "delta":
                    self._base = self._keep(source, version)
                return
            from slime.backends.sglang.delta import write_delta

            delta_dir = self.log_dir / "weights" / f"delta-v{version}"
            shutil.rmtree(delta_dir, ignore_errors=True)
            await asyncio.to_thread(write_delta, self._base, source, delta_dir, version=str(version))
            target = self.log_dir / "weights" / f"v{version}"
            shutil.rmtree(target, ignore_errors=True)
            await sync_delta(clients, base_dir=self._base, delta_dir=delta_dir, target_dir=target, version=version)
            shutil.rmtree(delta_dir, ignore_errors=True)
            old, self._base = self._base, target
            if old.parent == target.parent:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            await asyncio.gather(*(c.close() for c in clients))

    def _keep(self, source: Path, version: int) -> Path:
        """Copy a full checkpoint to this node's weights dir (the base of the next delta)."""
        target = self.log_dir / "weights" / f"v{version}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(source, target)
        return target

    def update_weights(self, source: Path, version: int) -> None:
        asyncio.run(self._update(Path(source), version))

    def weight_sync_ranks(self) -> list[int]:
        """Ranks each engine takes in the NCCL weight-update group: one per engine GPU."""
        return [self.spec.rollout.gpus_per_engine] * len(self.urls)

    def _each(self, call) -> list[Any]:
        async def go():
            clients = self._clients()
            try:
                return await asyncio.gather(*(call(c) for c in clients))
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        return asyncio.run(go())

    def release_memory(self, tags: list[str] | None = None) -> list[dict]:
        """Every engine frees ``tags`` (None = all: weights, kv_cache, cuda_graph) for a colocated trainer."""
        return self._each(lambda c: c.release_memory_occupation(tags))

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self._each(lambda c: c.resume_memory_occupation(tags))

    def health(self) -> dict[str, bool]:
        async def check():
            clients = self._clients()
            try:
                return await asyncio.gather(*(c.health() for c in clients))
            finally:
                await asyncio.gather(*(c.close() for c in clients))

        return dict(zip(self.urls, asyncio.run(check())))

    def stop(self) -> None:
        process.stop_all(self.processes)
        self.processes = []
