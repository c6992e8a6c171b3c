"""``rollout.backend: sglang``: the RolloutBackend that starts SGLang engines and syncs their weights.

``start`` builds the commands (``launch.engine_commands``; tests swap in the built-in engine), starts them with
bounded health-checked startup, one small Ray actor per node (:class:`NodeProcesses`) holding the handles, then a
router for several regular engines (prefill/decode groups get none: the rollout manager pairs each request using
:meth:`prefill_engines`). ``update_weights`` (every engine, prefill ones too) follows ``rollout.weight_sync``:
``disk``, ``delta`` (checksummed changed tensors rebuilt on the node) or ``nccl`` (driven by trainer rank 0 through
:meth:`weight_sender`). Colocated runs release and resume memory in the order SGLang needs. The job's secret
reaches each server as ``--api-key`` in a 0600 ``--config`` file, never argv. More: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slime.backends.base import RolloutBackend, WeightSender
from slime.backends.sglang import launch, process
from slime.backends.sglang.weights import sync_delta, sync_from_disk
from slime.core.auth import SECRET_ENV, job_secret, write_private

__all__ = ["NodeProcesses", "SGLangRolloutBackend", "process_specs"]

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


def api_key_config() -> Path | None:
    """The job's secret as SGLang's ``api-key`` in a YAML file for ``--config`` (0600, beside the secret,
    removed with it on the next instance): SGLang has no environment variable for it, and argv is public."""
    secret, where = job_secret(), os.environ.get(SECRET_ENV)
    if not secret or not where:
        return None
    config = Path(where).with_name(Path(where).name + ".sglang.yaml")
    if not config.exists():
        write_private(config, f"api-key: {json.dumps(secret)}\n")  # JSON strings are YAML
    return config


def with_api_key(cmd: launch.EngineCommand, config: Path | None) -> launch.EngineCommand:
    """``cmd`` reading its API key from ``config`` (only SGLang servers: stand-ins read the secret's file)."""
    if config is None or "sglang.launch_server" not in cmd.argv:
        return cmd
    return dataclasses.replace(cmd, argv=(*cmd.argv, "--config", str(config)))


def _pin_gpus(cmd: launch.EngineCommand, gpu_ids: Sequence[str]) -> launch.EngineCommand:
    """``cmd`` seeing only the physical GPUs ``gpu_ids`` (numbered from 0 inside the process)."""
    argv = list(cmd.argv)
    if "--base-gpu-id" in argv:
        argv[argv.index("--base-gpu-id") + 1] = "0"
    return dataclasses.replace(cmd, argv=tuple(argv), env={**cmd.env, "CUDA_VISIBLE_DEVICES": ",".join(gpu_ids)})


class NodeProcesses:
    """Ray actor body: starts and stops the server processes of one node, keeping their handles."""

    def __init__(self) -> None:
        from slime.diagnosis import fault_dump

        fault_dump.arm()  # the watchdog's stack dump where py-spy cannot read this process
        self.processes: list[process.ManagedProcess] = []

    def busy_ports(self, ports: Sequence[int]) -> list[int]:
        return process.busy_ports(ports)

    def start(self, specs: Sequence[process.ProcessSpec], log_dir: str, timeout_s: float) -> list[int]:
        self.processes += process.start_processes(specs, log_dir, timeout_s=timeout_s)
        return [p.pid for p in self.processes]

    def stop(self) -> None:
        process.stop_all(self.processes)
        self.processes = []


class SGLangRolloutBackend(RolloutBackend):
    def __init__(self, *, command_builder: CommandBuilder | None = None, router: bool = True) -> None:
        self.command_builder = command_builder or launch.engine_commands
        self.use_router = router
        self.processes: list[process.ManagedProcess] = []
        self.urls: list[str] = []
        self.router_url: str | None = None
        self.bootstrap: dict[str, int] = {}  # prefill engine URL -> its KV bootstrap port
        self._base: Path | None = None  # delta sync: the last full checkpoint on this node
        self.nodes: dict[int, Any] = {}  # node rank -> NodeProcesses actor (runs with a Placement)

    def start(self, spec, layout, placement: Any, model_dir: Path, *, log_dir: Path | None = None) -> list[str]:
        from slime.placement import Placement

        self.spec = spec
        if isinstance(placement, Placement):
            self.log_dir = Path(log_dir or Path(spec.logging.dir) / "engines")
            return self._start_placed(spec, layout, placement)
        placement = dict(placement or {})
        self.log_dir = Path(log_dir or placement.get("log_dir") or Path(spec.logging.dir) / "engines")
        hosts = placement.get("hosts")
        local = placement.get("local_nodes")
        config = api_key_config()
        commands = [with_api_key(c, config) for c in self.command_builder(spec, layout, hosts=hosts)]
        specs = process_specs(commands, set(local) if local is not None else None)
        self.processes = process.start_processes(specs, self.log_dir, timeout_s=spec.rollout.startup_timeout_s)
        self._set_urls(commands)
        if self._router_wanted(spec) and (local is None or 0 in local):
            cmd = launch.router_command(spec, self.urls, host=(hosts or ["127.0.0.1"])[0])
            if cmd is not None:
                router = process.ProcessSpec(name="router", argv=cmd.argv, url=cmd.url, ports=(cmd.port,))
                self.processes += process.start_processes(
                    [router], self.log_dir, timeout_s=spec.rollout.startup_timeout_s
                )
                self.router_url = cmd.url
        return list(self.urls)

    def _start_placed(self, spec, layout, placement) -> list[str]:
        import ray

        ips = {b.node_rank: b.ip for b in placement.bundles}
        hosts = [ips.get(n, f"node{n}") for n in range(layout.nodes)]
        engine_nodes = sorted({s.node for slots in layout.engines for s in slots})
        first_slot = {n: next(s for slots in layout.engines for s in slots if s.node == n) for n in engine_nodes}
        actor = ray.remote(NodeProcesses)
        self.nodes = {
            n: actor.options(num_cpus=0, num_gpus=0, scheduling_strategy=placement.strategy(first_slot[n])).remote()
            for n in engine_nodes
        }
        try:
            base = self._port_block(engine_nodes)
            config = api_key_config()
            commands = self.command_builder(spec, layout, hosts=hosts, port_base=base + launch.PORT_STRIDE)
            commands = [with_api_key(c, config) for c in commands]
            top = max((p for c in commands for p in c.ports), default=base)
            if top - base >= _block():
                raise launch.LaunchError(
                    f"{len(commands)} engine process(es) need ports up to {top}, beyond the "
                    f"job's block {base}-{base + _block() - 1}; use fewer engines per "
                    f"node (raise rollout.gpus_per_engine)"
                )
            if not layout.cpu_only:  # each process sees its own slots' physical GPUs
                commands = [
                    _pin_gpus(
                        c,
                        [
                            g
                            for s in layout.engines[c.engine]
                            if s.node == c.node
                            for g in placement.bundle_of(s).gpu_ids
                        ],
                    )
                    for c in commands
                ]
            timeout = spec.rollout.startup_timeout_s
            ray.get(
                [
                    self.nodes[n].start.remote(process_specs(commands, {n}), str(self.log_dir), timeout)
                    for n in engine_nodes
                ]
            )
            self._set_urls(commands)
            first = layout.engines[0][0].node
            cmd = (
                launch.router_command(spec, self.urls, host=hosts[first], port=base)
                if self._router_wanted(spec)
                else None
            )
            if cmd is not None:
                router = process.ProcessSpec(name="router", argv=cmd.argv, url=cmd.url, ports=(cmd.port,))
                ray.get(self.nodes[first].start.remote([router], str(self.log_dir), timeout))
                self.router_url = cmd.url
        except BaseException:
            self.stop()
            raise
        return list(self.urls)

    def _set_urls(self, commands: Sequence[launch.EngineCommand]) -> None:
        self.urls = [c.url for c in commands if c.url]
        self.bootstrap = {c.url: c.bootstrap_port for c in commands if c.url and c.role == "prefill"}

    def _router_wanted(self, spec) -> bool:
        """A router in front of regular engines; none for prefill/decode groups (the rollout manager pairs)."""
        return self.use_router and spec.rollout.sglang.pd is None

    def prefill_engines(self) -> dict[str, int]:
        """Prefill engines (``rollout.sglang.pd``): URL → ``--disaggregation-bootstrap-port`` as launched."""
        return dict(self.bootstrap)

    def _port_block(self, nodes: Sequence[int]) -> int:
        """The base of the job's first engine port block that is free on every engine node."""
        import ray

        for i, base in enumerate(launch.port_blocks(str(self.log_dir))):
            if i >= 16:
                break
            ports = list(range(base, base + _block()))
            if not any(ray.get([self.nodes[n].busy_ports.remote(ports) for n in nodes])):
                return base
        raise launch.LaunchError(
            "no free engine port block on the engine nodes after 16 candidates; "
            "set SLIME_ENGINE_PORT_RANGE to a less busy range"
        )

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

    def weight_sender(self) -> WeightSender:
        from slime.backends.rollout.collective import EngineWeightSender

        return EngineWeightSender(self.urls, self.weight_sync_ranks())

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
        if self.nodes:
            import ray

            nodes, self.nodes = self.nodes, {}
            for ref in [a.stop.remote() for a in nodes.values()]:
                try:
                    ray.get(ref, timeout=60)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    pass  # actor or node gone (or hung): nothing left to ask it
            for a in nodes.values():
                ray.kill(a)


def _block() -> int:
    """Ports per engine port block (the Ray blocks' size)."""
    from slime.core.ports import BLOCK

    return BLOCK
