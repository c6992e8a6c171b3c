"""``rollout.backend: builtin``: one Ray actor per engine, each hosting the built-in HTTP server.

``start`` places engine ``i`` on the first slot of ``layout.engines[i]`` (``start_teacher``: the OPD teacher
on ``layout.teacher``), loads the model there and returns the base URLs once every ``/health`` answers
(bounded by ``rollout.startup_timeout_s``). Everything else (generation, weight loads, weight sync, memory
release/resume) goes over HTTP through ``EngineClient``, exactly as with SGLang. ``rollout.builtin.args``
maps onto the engine's options; other keys are rejected with the valid names. Devices: CUDA on a GPU slot,
CPU on a CPU slot or with ``cluster.fake_gpus``; a GPU slot without CUDA fails ``start`` with an
``InfraError`` naming the host, never a silent CPU engine. Servers require the job's secret.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slime.backends.base import RolloutBackend, WeightSender
from slime.backends.rollout.builtin.args import BUILTIN_ENGINE_ARGS, builtin_engine_arg
from slime.diagnosis import fault_dump
from slime.diagnosis.beats import beat

if TYPE_CHECKING:
    from slime.spec.layout import Layout
    from slime.spec.types import Spec

__all__ = ["BuiltinRolloutBackend", "EngineHost", "engine_kwargs"]


def engine_kwargs(spec: Spec) -> dict[str, Any]:
    """``rollout.builtin.args`` as keyword arguments of the built-in ``Engine``."""
    out: dict[str, Any] = {}
    for key, value in spec.rollout.builtin.args.items():
        name = builtin_engine_arg(key)
        if name is None:  # validate refuses it first (its hooks.known_args)
            raise ValueError(
                f"rollout.builtin.args.{key} is not an option of the built-in engine; valid: "
                f"{', '.join(BUILTIN_ENGINE_ARGS)} (SGLang flags need rollout.backend: sglang)"
            )
        out[name] = value
    tokenizer = spec.model.tokenizer
    if tokenizer and tokenizer != spec.model.path:  # decode with what the rollout manager encodes with
        out["tokenizer_path"] = tokenizer
    return out


class EngineHost:
    """Ray actor body: runs one built-in engine server in this process."""

    def __init__(
        self,
        model_dir: str,
        *,
        seed: int,
        gpu_slot: bool,
        kwargs: dict[str, Any],
        weight_version: str = "0",
        host: str | None = None,
        fake_gpus: bool = False,
        name: str = "engine",
        weights_root: str | None = None,
    ) -> None:
        from slime.placement import normal_priority

        normal_priority()
        fault_dump.arm()  # the watchdog's stack dump where py-spy cannot read this process
        self.model_dir, self.seed, self.gpu_slot = model_dir, seed, gpu_slot
        self.fake_gpus, self.name = fake_gpus, name
        self.kwargs, self.weight_version, self.host = dict(kwargs), weight_version, host
        self.weights_root = weights_root
        self.server = None

    def start(self) -> str:
        from slime.backends.rollout.builtin.server import start_server
        from slime.core.auth import job_secret
        from slime.placement import slot_device

        host = self.host
        if host is None:
            import ray

            host = ray.util.get_node_ip_address()
        device = slot_device(self.gpu_slot, fake_gpus=self.fake_gpus, what=self.name)
        self.server = start_server(
            self.model_dir,
            host=host,
            port=0,
            seed=self.seed,
            device=device,
            secret=job_secret(),  # the raylet's environment names the job's secret file
            weights_root=self.weights_root,
            **self.kwargs,
        )
        self.server.engine.weight_version = self.weight_version
        beat("engine start")  # loaded: while the others load, the start moves
        return self.server.url

    def pid(self) -> int:
        return os.getpid()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


class BuiltinRolloutBackend(RolloutBackend):
    """Engine calls from the driver (weight loads, memory, health) go through one event loop and one
    ``EngineClient`` per engine kept for the backend's life: a weight sync every step then reuses its
    connections instead of opening a session and a loop per call."""

    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.urls: list[str] = []
        self._pool: Any = None  # a ClientPool, made on the first call

    def start(
        self, spec: Spec, layout: Layout, placement: Any, model_dir: Path, *, log_dir: Path | None = None
    ) -> list[str]:  # log_dir unused: engines log through Ray
        kwargs = engine_kwargs(spec)
        for i, slots in enumerate(layout.engines):
            self._spawn(
                spec, layout, placement, slots[0], model_dir, dict(kwargs), seed=spec.train.seed + i, name="engine"
            )
        return self._wait_started(spec, f"the {len(layout.engines)} built-in engine(s)")

    def start_teacher(self, spec: Spec, layout: Layout, placement: Any, teacher_dir: Path) -> str:
        """The OPD teacher: one built-in engine on ``layout.teacher`` serving ``teacher_dir`` (its own tokenizer)."""
        kw = {k: v for k, v in engine_kwargs(spec).items() if k != "tokenizer_path"}
        self._spawn(spec, layout, placement, layout.teacher[0], teacher_dir, kw, seed=spec.train.seed, name="teacher")
        return self._wait_started(spec, "the teacher engine (algorithm.opd.type: engine)")[0]

    def _spawn(
        self, spec: Spec, layout: Layout, placement: Any, slot: Any, model_dir: Path, kw: dict, *, seed: int, name: str
    ) -> None:
        """One ``EngineHost`` actor on ``slot`` serving ``model_dir`` (not started yet: ``_wait_started``)."""
        import ray

        from slime.placement import placement_options, torch_threads

        kw.setdefault("num_threads", torch_threads(layout, slot, "engine", spec.cluster.cpus_per_node))
        cls = ray.remote(EngineHost).options(max_concurrency=4, **placement_options(layout, placement, slot))
        what = f"engine {len(self.actors)}" if name == "engine" else name
        self.actors.append(
            cls.remote(
                str(model_dir),
                seed=seed,
                gpu_slot=slot.gpu is not None,
                kwargs=kw,
                fake_gpus=spec.cluster.fake_gpus,
                name=f"{what} (slot {slot})",
                weights_root=os.environ.get("SLIME_RUN_DIR"),  # set by the bootstrap for the driver
            )
        )

    def _wait_started(self, spec: Spec, what: str) -> list[str]:
        """Start every actor's server and wait until each answers ``/health`` (``rollout.startup_timeout_s``)."""
        import ray

        from slime.backends.rollout.client import EngineClient

        timeout = spec.rollout.startup_timeout_s
        try:
            self.urls = ray.get([a.start.remote() for a in self.actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            self.stop()
            raise TimeoutError(f"{what} did not start within {timeout:g} s (rollout.startup_timeout_s)") from None

        async def wait_all() -> None:
            clients = [EngineClient(u) for u in self.urls]
            try:
                await asyncio.gather(*(c.wait_healthy(timeout_s=timeout) for c in clients))
            finally:
                for c in clients:
                    await c.close()

        asyncio.run(wait_all())
        return list(self.urls)

    def _each(self, fn) -> list[Any]:
        from slime.backends.rollout.client import ClientPool, EngineClient

        if self._pool is None:
            self._pool = ClientPool([EngineClient(u) for u in self.urls])
        return self._pool.each(fn)

    def _close_clients(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def update_weights(self, source: Path, version: int) -> None:
        self._each(lambda c: c.update_weights_from_disk(str(source), str(version)))

    def weight_sync_ranks(self) -> list[int]:
        """Ranks each engine takes in a collective weight-update group (one process each)."""
        return [1] * len(self.urls)

    def weight_sender(self) -> WeightSender:
        """The engines serve SGLang's weight-update endpoints (``rl_control``): SGLang's sender fits."""
        from slime.backends.rollout.collective import EngineWeightSender

        return EngineWeightSender(self.urls, self.weight_sync_ranks())

    def release_memory(self, tags: list[str] | None = None) -> list[dict]:
        """Colocated runs: every engine frees ``tags`` (None = weights and KV cache) while the trainer steps."""
        return self._each(lambda c: c.release_memory_occupation(tags))

    def resume_memory(self, tags: list[str] | None = None) -> None:
        self._each(lambda c: c.resume_memory_occupation(tags))

    def health(self) -> dict[str, bool]:
        return dict(zip(self.urls, self._each(lambda c: c.health())))

    def stop(self) -> None:
        import ray

        try:
            self._close_clients()
        except Exception:  # noqa: BLE001 - the engines are being stopped anyway
            pass
        for a in self.actors:
            try:
                ray.get(a.stop.remote(), timeout=15)
            except Exception:  # noqa: BLE001 - the actor may already be gone; kill it anyway
                pass
            ray.kill(a)
        self.actors = []
