"""Delta checkpoints (round trip, size, corruption) and the NCCL weight-sync protocol over gloo.

The NCCL test's engines are fakes at the SGLang boundary (SGLang needs CUDA):
small aiohttp servers, one subprocess each, that implement the five endpoints
the sync uses the way SGLang 0.5 does — join the group with the same
rendezvous (:func:`init_weight_update_group`, the mirror of SGLang's
``init_custom_process_group``) and receive each tensor by broadcast from rank 0
— and record the order of calls. The trainer side is the real
``NcclWeightSync``, with ``backend="gloo"`` instead of NCCL, in its own process.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slime.backends.sglang.delta import DeltaError, apply_delta, write_delta
from slime.backends.sglang.weights import buckets

ROOT = Path(__file__).resolve().parents[2]


def _checkpoint(path: Path, tensors: dict[str, torch.Tensor], *, shards: int = 2) -> Path:
    path.mkdir(parents=True)
    names = sorted(tensors)
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        fname = f"model-{k:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    return path


def _base_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        f"model.layers.{i}.{n}": torch.randn(64, 64, generator=g).to(torch.bfloat16)
        for i in range(4)
        for n in ("a.weight", "b.weight")
    } | {"model.norm.weight": torch.ones(64)}


def _rl_step(tensors: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """A small update: in bf16 most elements keep their exact bits."""
    g = torch.Generator().manual_seed(1)
    out = dict(tensors)
    for n in names:
        t = tensors[n].float()
        out[n] = (t + 1e-3 * t.abs().mean() * torch.randn(t.shape, generator=g)).to(tensors[n].dtype)
    return out


def test_delta_round_trip_ships_only_changes(tmp_path):
    base_t = _base_tensors()
    changed = ["model.layers.0.a.weight", "model.layers.2.a.weight"]
    new_t = _rl_step(base_t, changed) | {"model.extra.weight": torch.arange(10.0)}
    base = _checkpoint(tmp_path / "base", base_t)
    new = _checkpoint(tmp_path / "new", new_t, shards=3)
    stats = write_delta(base, new, tmp_path / "delta", version="7", base_version="6")
    assert stats.total == len(new_t) and stats.changed == 3
    index = json.loads((tmp_path / "delta" / "index.json").read_text())
    assert sorted(index["tensors"]) == sorted(changed + ["model.extra.weight"])
    assert index["tensors"]["model.extra.weight"]["encoding"] == "raw"  # not in the base
    assert index["tensors"][changed[0]]["encoding"] == "xor"
    assert stats.payload_bytes < 0.6 * stats.raw_bytes  # XOR of a small step is mostly zeros

    out = tmp_path / "rebuilt"
    apply_delta(base, tmp_path / "delta", out)
    rebuilt = {}
    for f in out.glob("*.safetensors"):
        rebuilt.update(load_file(str(f)))
    assert sorted(rebuilt) == sorted(new_t)
    for n, t in new_t.items():
        assert rebuilt[n].dtype == t.dtype and torch.equal(rebuilt[n], t), n
    assert (out / "config.json").is_file() and (out / "model.safetensors.index.json").is_file()
    # shard 1 holds only unchanged tensors (layers 0/2 'a' weights sort into shard 0): linked, not rewritten
    weight_map = json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    untouched = {f for f in set(weight_map.values()) if not any(weight_map[n] == f for n in changed)}
    assert untouched and all(os.path.samefile(out / f, base / f) for f in untouched)

    raw_stats = write_delta(base, new, tmp_path / "delta-raw", encoding="raw")
    assert raw_stats.payload_bytes > stats.payload_bytes


def test_nothing_changed_gives_an_empty_delta(tmp_path):
    t = _base_tensors()
    base = _checkpoint(tmp_path / "a", t)
    same = _checkpoint(tmp_path / "b", t, shards=1)
    stats = write_delta(base, same, tmp_path / "d")
    assert stats.changed == 0 and stats.payload_bytes == 0
    apply_delta(base, tmp_path / "d", tmp_path / "out")
    assert torch.equal(
        load_file(str(next((tmp_path / "out").glob("model-00000*"))))["model.layers.0.a.weight"],
        t["model.layers.0.a.weight"],
    )


@pytest.fixture()
def delta(tmp_path):
    base_t = _base_tensors()
    base = _checkpoint(tmp_path / "base", base_t)
    new = _checkpoint(tmp_path / "new", _rl_step(base_t, ["model.layers.1.b.weight"]))
    write_delta(base, new, tmp_path / "delta")
    entry = json.loads((tmp_path / "delta" / "index.json").read_text())["tensors"]["model.layers.1.b.weight"]
    return base, tmp_path / "delta", tmp_path / "delta" / entry["file"], base_t


def test_corrupt_payload_is_detected_before_use(delta, tmp_path):
    base, d, payload, _ = delta
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))
    with pytest.raises(DeltaError, match=r"model\.layers\.1\.b\.weight: payload .* fails its SHA-256 check"):
        apply_delta(base, d, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_truncated_payload_and_bad_index_are_detected(delta, tmp_path):
    base, d, payload, _ = delta
    payload.write_bytes(payload.read_bytes()[:-5])
    with pytest.raises(DeltaError, match="fails its SHA-256 check"):
        apply_delta(base, d, tmp_path / "out")
    (d / "index.json").write_text('{"format": "other/9"}')
    with pytest.raises(DeltaError, match="is not 'slime-delta/1'"):
        apply_delta(base, d, tmp_path / "out")


def test_delta_applied_to_the_wrong_base_fails_its_checksum(delta, tmp_path):
    _, d, _, base_t = delta
    other = _checkpoint(tmp_path / "other", _rl_step(base_t, ["model.layers.1.b.weight", "model.layers.3.a.weight"]))
    with pytest.raises(DeltaError, match="model.layers.1.b.weight: rebuilt tensor fails its SHA-256 check"):
        apply_delta(other, d, tmp_path / "out")


def test_buckets_respect_the_byte_budget():
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    groups = list(buckets(named, bucket_bytes=80))  # float32: 40, 40, 120, 20, 400, 4 bytes
    assert [[n for n, _ in g] for g in groups] == [["t0", "t1"], ["t2"], ["t3"], ["t4"], ["t5"]]


# ----------------------------------------------------------------------------- NCCL protocol over gloo
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(url)


def run_sync_protocol(backend: str, devices: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Two fake engines + the real trainer side; ``devices`` = CUDA_VISIBLE_DEVICES for trainer, e1, e2."""
    ports = [_free_port(), _free_port()]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def env_for(i):
        return env if devices is None else {**env, "CUDA_VISIBLE_DEVICES": devices[i]}

    device = "cpu" if devices is None else "cuda"
    engines = [
        subprocess.Popen(
            [sys.executable, __file__, "engine", str(p), device],
            env=env_for(i + 1),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, p in enumerate(ports)
    ]
    try:
        for p in ports:
            _wait_http(f"http://127.0.0.1:{p}")
        trainer = subprocess.run(
            [sys.executable, __file__, "trainer", str(_free_port()), backend, device, *map(str, ports)],
            env=env_for(0),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert trainer.returncode == 0, trainer.stderr[-3000:]
        sent = json.loads(trainer.stdout.strip().splitlines()[-1])
    finally:
        for e in engines:
            e.terminate()
        logs = [json.loads(e.communicate(timeout=30)[0].strip().splitlines()[-1]) for e in engines]
    return sent, logs


def check_sync_protocol(sent: dict, logs: list[dict], backend: str) -> None:
    assert sent["count"] == 5
    for offset, log in zip((1, 2), logs):
        calls = log["calls"]
        assert calls[0] == ["init_weights_update_group", offset, 3, backend]
        assert calls[1:3] == [["pause_generation"], ["flush_cache"]]
        updates = [c for c in calls if c[0] == "update_weights_from_distributed"]
        assert len(updates) == 3 and all(c[2] == "9" for c in updates)  # bucketed, version passed
        assert calls[-1] == ["continue_generation"]
        assert log["received"] == sent["digests"]


def test_nccl_sync_protocol_with_gloo():
    sent, logs = run_sync_protocol("gloo")
    check_sync_protocol(sent, logs, "gloo")


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _trainer_main(master_port: int, backend: str, device: str, engine_ports: list[int]) -> None:
    import asyncio

    from slime.backends.rollout.client import EngineClient
    from slime.backends.sglang.weights import NcclWeightSync

    g = torch.Generator().manual_seed(0)
    named = [(f"w{i}", torch.randn(64, 32, generator=g).to(torch.bfloat16).to(device)) for i in range(5)]

    async def run():
        clients = [EngineClient(f"http://127.0.0.1:{p}") for p in engine_ports]
        sync = NcclWeightSync(
            clients,
            engine_gpus=[1, 1],
            master_address="127.0.0.1",
            master_port=master_port,
            backend=backend,
            bucket_bytes=2 * 64 * 32 * 2,
        )
        await sync.init_group()
        count = await sync.update(named, version=9)
        await asyncio.gather(*(c.close() for c in clients))
        return count

    count = asyncio.run(run())
    print(json.dumps({"count": count, "digests": {n: _digest(t.cpu()) for n, t in named}}))


def _engine_main(port: int, device: str) -> None:
    """A fake SGLang engine: the weight-sync endpoints only, logging every call."""
    import asyncio
    import signal

    import torch.distributed as dist
    from aiohttp import web

    from slime.backends.sglang.weights import init_weight_update_group

    state = {"calls": [], "received": {}, "group": None}

    async def init_group(request):
        b = await request.json()
        state["calls"].append(["init_weights_update_group", b["rank_offset"], b["world_size"], b["backend"]])
        state["group"] = await asyncio.to_thread(
            init_weight_update_group,
            b["master_address"],
            b["master_port"],
            rank=b["rank_offset"],
            world_size=b["world_size"],
            group_name=b["group_name"],
            backend=b["backend"],
        )
        return web.json_response({"success": True, "message": "ok"})

    async def update(request):
        b = await request.json()
        state["calls"].append(["update_weights_from_distributed", len(b["names"]), b.get("weight_version")])

        def receive():
            for name, dtype, shape in zip(b["names"], b["dtypes"], b["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                dist.broadcast(t, src=0, group=state["group"])
                state["received"][name] = _digest(t.cpu())

        await asyncio.to_thread(receive)
        return web.json_response({"success": True, "message": "ok"})

    def simple(name, reply):
        async def handler(request):
            state["calls"].append([name])
            return reply()

        return handler

    app = web.Application()
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    app.router.add_post("/init_weights_update_group", init_group)
    app.router.add_post("/update_weights_from_distributed", update)
    app.router.add_post("/pause_generation", simple("pause_generation", lambda: web.json_response({"status": "ok"})))
    app.router.add_post(
        "/continue_generation", simple("continue_generation", lambda: web.json_response({"status": "ok"}))
    )
    app.router.add_post("/flush_cache", simple("flush_cache", lambda: web.Response(text="Cache flushed.\n")))

    async def serve():
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(serve())
    print(json.dumps({"calls": state["calls"], "received": state["received"]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "engine":
        _engine_main(int(sys.argv[2]), sys.argv[3])
    else:
        _trainer_main(int(sys.argv[2]), sys.argv[3], sys.argv[4], [int(p) for p in sys.argv[5:]])
