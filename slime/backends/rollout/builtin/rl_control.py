"""The built-in engine's RL control endpoints, as SGLang serves them: weight sync over a collective
group, pause/continue generation, and releasing/resuming memory for colocated training.

They let the code that drives real SGLang (``NcclWeightSync``, ``EngineClient`` memory calls) run
unchanged against this engine on CPU (gloo instead of NCCL). Released weights and KV cache become
``meta`` tensors (memory really returned); resumed weights are zero-filled, and unlike SGLang the
engine refuses ``/generate`` until new weights are loaded. ``/weights_checker`` gives a checksum so
tests can prove engine weights equal the trainer's. Not guaranteed: SGLang's exact error texts;
release while requests run (refused). Endpoint bodies: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import torch

__all__ = ["MEMORY_TAGS", "ControlError", "RLControl", "weights_checksum"]

log = logging.getLogger(__name__)
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


class ControlError(ValueError):
    """A bad or untimely control request (HTTP 400 with SGLang's error body)."""


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")


def weights_checksum(named) -> str:
    """SHA-256 over ``(name, fp32 bytes)`` of HF-named tensors in name order (tied ``lm_head`` skipped).

    The trainer side computes the same over what it sends, so equal digests mean bit-equal weights
    (in fp32; lower-precision engines compare after the cast). Not SGLang's checksum format."""
    import hashlib

    h = hashlib.sha256()
    tensors = dict(named)
    if (
        "lm_head.weight" in tensors
        and "model.embed_tokens.weight" in tensors
        and tensors["lm_head.weight"].data_ptr() == tensors["model.embed_tokens.weight"].data_ptr()
    ):
        tensors.pop("lm_head.weight")
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def _swap_params(model: torch.nn.Module, make) -> None:
    """Replace every parameter by ``make(old)`` (a tensor can't be moved to ``meta`` in place);
    a parameter shared by several modules (tied embeddings) stays shared."""
    new: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if id(p) not in new:
                new[id(p)] = torch.nn.Parameter(make(p), requires_grad=p.requires_grad)
            setattr(module, name, new[id(p)])


def _tags(body: dict) -> list[str]:
    tags = body.get("tags")
    if tags is None:
        return list(MEMORY_TAGS)
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ControlError(f"tags must be a list of strings from {list(MEMORY_TAGS)} (or null for all)")
    unknown = sorted(set(tags) - set(MEMORY_TAGS))
    if unknown:
        raise ControlError(f"unknown memory tag(s) {unknown}; valid: {list(MEMORY_TAGS)}")
    return tags


class RLControl:
    """State of the control endpoints of one engine server (all methods run on its event loop)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.groups: dict[str, tuple[Any, str]] = {}  # group name -> (process group, backend)
        self.in_flight = 0  # /generate requests submitted and not yet answered
        self.released: set[str] = set()
        self.weights_stale = False  # resumed after a release: contents lost until the next update
        self._running = asyncio.Event()
        self._running.set()
        self._kv_meta: list[tuple[torch.Size, torch.dtype]] = []

    # ----------------------------------------------------------------- gating
    async def admit_generate(self) -> None:
        """Wait while paused; refuse while memory is released or weights are stale."""
        await self._running.wait()
        if self.released - {"cuda_graph"}:
            raise ControlError(
                f"engine memory is released ({', '.join(sorted(self.released))}): "
                "POST /resume_memory_occupation (and load weights) before generating"
            )
        if self.weights_stale:
            raise ControlError(
                "the weights were released and resumed but not reloaded: update the weights "
                "(update_weights_from_disk / update_weights_from_distributed) before generating"
            )

    def weights_loaded(self) -> None:
        self.weights_stale = False

    # ------------------------------------------------------------ pause/continue
    async def pause_generation(self, body: dict) -> dict:
        mode = body.get("mode", "abort")
        if mode != "abort":
            raise ControlError(f"pause_generation mode {mode!r} is not supported by the built-in engine; use 'abort'")
        self._running.clear()
        self.engine.abort(abort_all=True, message="Aborted by /pause_generation")
        return {"success": True, "message": "Generation paused (running requests aborted)."}

    async def continue_generation(self, body: dict) -> dict:
        self._running.set()
        return {"success": True, "message": "Generation continued."}

    # ------------------------------------------------------------- weight group
    async def init_weights_update_group(self, body: dict) -> dict:
        from slime.backends.rollout.collective import init_weight_update_group

        try:
            addr, port = str(body["master_address"]), int(body["master_port"])
            rank, world = int(body["rank_offset"]), int(body["world_size"])
            name = str(body["group_name"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ControlError(
                "init_weights_update_group needs master_address, master_port, rank_offset, "
                f"world_size and group_name ({exc!r})"
            ) from None
        backend = str(body.get("backend") or "nccl")
        if backend == "nccl" and self.engine.device.type != "cuda":
            raise ControlError("backend 'nccl' needs a CUDA engine; this engine runs on CPU: use backend 'gloo'")
        if name in self.groups:
            raise ControlError(f"a weight-update group named {name!r} already exists; destroy it first")
        timeout = float(body.get("timeout_s", 600.0))
        try:
            group = await asyncio.to_thread(
                init_weight_update_group,
                addr,
                port,
                rank=rank,
                world_size=world,
                group_name=name,
                backend=backend,
                timeout_s=timeout,
            )
        except Exception as exc:  # noqa: BLE001 - rendezvous failures: report, keep serving
            return {"success": False, "message": f"failed to join weight-update group {name!r}: {exc}"}
        self.groups[name] = (group, backend)
        return {"success": True, "message": f"Joined weight-update group {name!r} as rank {rank} of {world}."}

    async def destroy_weights_update_group(self, body: dict) -> dict:
        import torch.distributed as dist

        name = str(body.get("group_name", "weight_update_group"))
        entry = self.groups.pop(name, None)
        if entry is None:
            raise ControlError(f"no weight-update group named {name!r}")
        dist.destroy_process_group(entry[0])
        return {"success": True, "message": f"Left weight-update group {name!r}."}

    async def update_weights_from_distributed(self, body: dict) -> dict:
        import torch.distributed as dist

        names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
        if not (
            isinstance(names, list)
            and isinstance(dtypes, list)
            and isinstance(shapes, list)
            and len(names) == len(dtypes) == len(shapes)
            and names
        ):
            raise ControlError("names, dtypes and shapes must be non-empty lists of the same length")
        name = str(body.get("group_name", "weight_update_group"))
        if name not in self.groups:
            raise ControlError(f"no weight-update group named {name!r}: POST /init_weights_update_group first")
        if "weights" in self.released:
            raise ControlError(
                "the weights are released: POST /resume_memory_occupation with tags ['weights'] before updating them"
            )
        group, backend = self.groups[name]
        dev = self.engine.device if backend == "nccl" else torch.device("cpu")
        tensors = []
        for n, dt, shape in zip(names, dtypes, shapes):
            dtype = getattr(torch, str(dt), None)
            if not isinstance(dtype, torch.dtype) or not isinstance(shape, list):
                raise ControlError(f"{n}: bad dtype {dt!r} or shape {shape!r}")
            tensors.append(torch.empty(shape, dtype=dtype, device=dev))

        def receive() -> None:
            if dev.type == "cuda":
                torch.cuda.set_device(dev)  # worker thread: its current device defaults to 0
            for t in tensors:
                dist.broadcast(t, src=0, group=group)

        await asyncio.to_thread(receive)
        version = body.get("weight_version")
        fut = self.engine.update_weights_from_tensors(
            [(n, t.to(self.engine.device)) for n, t in zip(names, tensors)],
            weight_version=None if version is None else str(version),
        )
        ok, message = await asyncio.wrap_future(fut)
        if ok:
            self.weights_loaded()
        return {"success": ok, "message": message}

    async def weights_checker(self, body: dict) -> dict:
        """``{"action": "checksum"}`` → :func:`weights_checksum` of the live model (for tests and checks)."""
        if body.get("action", "checksum") != "checksum":
            raise ControlError(f"weights_checker action {body.get('action')!r} is not supported; use 'checksum'")
        if "weights" in self.released:
            raise ControlError("the weights are released: nothing to check")
        named = dict(self.engine.hf_model.named_parameters())
        return {"success": True, "checksum": weights_checksum(named.items())}

    # ------------------------------------------------------------------ memory
    def occupation(self) -> dict:
        decoder = self.engine.decoder
        return {
            "released": sorted(self.released),
            "weights_bytes": _bytes(self.engine.hf_model.parameters()),
            "kv_cache_bytes": _bytes(decoder.kv_cache),
        }

    async def release_memory_occupation(self, body: dict) -> dict:
        tags = _tags(body)
        busy = self.in_flight + self.engine.num_running
        if busy:
            raise ControlError(
                f"cannot release memory while {busy} request(s) are running; "
                "POST /pause_generation (or wait for them) first"
            )
        before = self.occupation()
        decoder = self.engine.decoder
        if "kv_cache" in tags and "kv_cache" not in self.released:
            self._kv_meta = [(t.shape, t.dtype) for t in decoder.kv_cache]
            decoder.kv_cache = [torch.empty(s, dtype=d, device="meta") for s, d in self._kv_meta]
        if "weights" in tags and "weights" not in self.released:
            _swap_params(self.engine.hf_model, lambda p: torch.empty(p.shape, dtype=p.dtype, device="meta"))
            decoder.refresh_weights()  # its fused copies become meta too
        self.released |= set(tags)
        after = self.occupation()
        freed = before["weights_bytes"] + before["kv_cache_bytes"] - after["weights_bytes"] - after["kv_cache_bytes"]
        return {"success": True, "message": f"Released {sorted(tags)} ({freed} bytes)."}

    async def resume_memory_occupation(self, body: dict) -> dict:
        tags = _tags(body)
        decoder, dev = self.engine.decoder, self.engine.device
        if "weights" in tags and "weights" in self.released:
            _swap_params(self.engine.hf_model, lambda p: torch.zeros(p.shape, dtype=p.dtype, device=dev))
            decoder.refresh_weights()
            self.weights_stale = True
        if "kv_cache" in tags and "kv_cache" in self.released:
            decoder.kv_cache = [torch.zeros(s, dtype=d, device=dev) for s, d in self._kv_meta]
        self.released -= set(tags)
        return {"success": True, "message": f"Resumed {sorted(tags)}."}
