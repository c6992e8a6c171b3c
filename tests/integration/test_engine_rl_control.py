"""The built-in engine's RL control endpoints through the same client code that drives SGLang.

Real parts: the engine server (a ``python -m slime.backends.rollout.builtin.server``
subprocess for the weight-sync test, so the two ends of the collective group are
separate processes as in production; in-process otherwise), HTTP on 127.0.0.1,
and the real ``NcclWeightSync`` as the trainer side with ``backend="gloo"``
(torch's NCCL needs CUDA; the request bodies, call order and rendezvous are the
ones used with SGLang).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from slime.backends.rollout.builtin.rl_control import weights_checksum  # noqa: E402
from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from slime.backends.rollout.client import EngineClient, EngineError  # noqa: E402
from slime.backends.sglang.weights import NcclWeightSync  # noqa: E402
from slime.rl.losses import logprobs_from_logits  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
PROMPT = [5, 9, 13, 7]
GREEDY = {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}


@pytest.fixture(scope="module")
def models(tiny_model):
    return tiny_model(seed=0), tiny_model(seed=1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hf(model_dir):
    m = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return m.eval()


def _hf_logprobs(model, ids: list[int], out: list[int]) -> torch.Tensor:
    seq = torch.tensor([ids + out])
    with torch.no_grad():
        lp = logprobs_from_logits(model(seq).logits[:, :-1], seq[:, 1:], 1.0)[0]
    return lp[len(ids) - 1 :]


async def _generate(client: EngineClient):
    return (await client.generate([PROMPT], [GREEDY], return_logprob=True))[0]


def _named(model):
    tied = model.config.tie_word_embeddings
    return [(n, t.detach()) for n, t in model.state_dict().items() if not (tied and n == "lm_head.weight")]


def test_distributed_weight_sync_reaches_the_engine_bit_exactly(models):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slime.backends.rollout.builtin.server",
            "--model-path",
            str(models[0]),
            "--port",
            str(port),
            "--seed",
            "0",
            "--num-threads",
            "1",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    trainer = _hf(models[1])  # the "trained" policy: different weights than the engine's

    async def scenario():
        client = EngineClient(url, timeout_s=60)
        await client.wait_healthy(timeout_s=60)
        # On CPU the engine refuses NCCL with a clear message instead of hanging in a rendezvous.
        with pytest.raises(EngineError, match="needs a CUDA engine"):
            await client.post(
                "/init_weights_update_group",
                {
                    "master_address": "127.0.0.1",
                    "master_port": _free_port(),
                    "rank_offset": 1,
                    "world_size": 2,
                    "group_name": "g",
                    "backend": "nccl",
                },
            )
        with pytest.raises(EngineError, match="no weight-update group named 'slime_weight_sync'"):
            await client.post(
                "/update_weights_from_distributed",
                {
                    "names": ["model.norm.weight"],
                    "dtypes": ["float32"],
                    "shapes": [[64]],
                    "group_name": "slime_weight_sync",
                },
            )
        before = await client.post("/weights_checker", {"action": "checksum"})
        sync = NcclWeightSync(
            clients=[client],
            engine_gpus=[1],
            master_address="127.0.0.1",
            master_port=_free_port(),
            backend="gloo",
            bucket_bytes=64 << 10,
        )
        await sync.init_group()
        sent = await sync.update(_named(trainer), version=5)
        after = await client.post("/weights_checker", {"action": "checksum"})
        version = (await client.get("/get_weight_version"))["weight_version"]
        res = await _generate(client)
        # a second sync back to the original weights (the group is reused)
        await sync.update(_named(_hf(models[0])), version=6)
        back = await client.post("/weights_checker", {"action": "checksum"})
        await client.post("/destroy_weights_update_group", {"group_name": "slime_weight_sync"})
        await client.close()
        import torch.distributed as dist

        dist.destroy_process_group(sync.group)
        return before, sent, after, version, res, back

    try:
        before, sent, after, version, res, back = asyncio.run(scenario())
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert sent == len(_named(trainer)) and sent > 10
    assert after["checksum"] == weights_checksum(_named(trainer)) != before["checksum"]
    assert back["checksum"] == before["checksum"]
    assert version == "5" and res.weight_version == "5"
    want = _hf_logprobs(trainer, PROMPT, res.output_ids)
    assert (torch.tensor(res.logprobs) - want).abs().max() < 1e-4  # the decoder serves the new weights


def test_pause_aborts_running_and_holds_new_requests_until_continue(models):
    srv = start_server(models[0], seed=0, num_threads=1)

    async def scenario():
        client = EngineClient(srv.url, timeout_s=60)
        long = asyncio.create_task(
            client.generate([PROMPT], [{"max_new_tokens": 400, "temperature": 0.0, "ignore_eos": True}])
        )
        while srv.engine.num_running == 0:
            await asyncio.sleep(0.01)
        await client.pause_generation()
        aborted = (await long)[0]
        held = asyncio.create_task(_generate(client))
        await asyncio.sleep(0.5)
        waiting = not held.done()
        with pytest.raises(EngineError, match="mode 'retract' is not supported"):
            await client.pause_generation("retract")
        await client.continue_generation()
        done = await asyncio.wait_for(held, 30)
        await client.close()
        return aborted, waiting, done

    try:
        aborted, waiting, done = asyncio.run(scenario())
    finally:
        srv.stop()
    assert aborted.aborted and len(aborted.output_ids) < 400
    assert waiting, "a request sent while paused must wait for /continue_generation"
    assert len(done.output_ids) == GREEDY["max_new_tokens"] and not done.aborted


def test_release_and_resume_memory_like_a_colocated_run(models):
    srv = start_server(models[0], seed=0, num_threads=1)

    async def info(client):
        return (await client.get("/get_server_info"))["memory_occupation"]

    async def scenario():
        client = EngineClient(srv.url, timeout_s=60)
        steps = {"first": await _generate(client), "resident": await info(client)}
        # busy engine: release is refused rather than pulling memory from under a running request
        long = asyncio.create_task(
            client.generate([PROMPT], [{"max_new_tokens": 300, "temperature": 0.0, "ignore_eos": True}])
        )
        while srv.engine.num_running == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(EngineError, match="request\\(s\\) are running"):
            await client.release_memory_occupation()
        await long
        with pytest.raises(EngineError, match="unknown memory tag"):
            await client.release_memory_occupation(["kv"])
        await client.release_memory_occupation()  # all tags
        steps["released"] = await info(client)
        with pytest.raises(EngineError, match="memory is released"):
            await _generate(client)
        steps["health_generate_released"] = await client.health_generate()
        await client.resume_memory_occupation(["weights"])
        steps["weights_back"] = await info(client)
        with pytest.raises(EngineError, match="memory is released \\(cuda_graph, kv_cache\\)"):
            await _generate(client)
        await client.resume_memory_occupation(["kv_cache", "cuda_graph"])
        with pytest.raises(EngineError, match="resumed but not reloaded"):
            await _generate(client)
        await client.update_weights_from_disk(str(models[0]), "2")  # the colocated trainer's new weights
        steps["again"] = await _generate(client)
        steps["resumed"] = await info(client)
        await client.close()
        return steps

    try:
        steps = asyncio.run(scenario())
    finally:
        srv.stop()
    resident, released = steps["resident"], steps["released"]
    assert resident["weights_bytes"] > 100_000 and resident["kv_cache_bytes"] > 100_000
    assert released == {"released": ["cuda_graph", "kv_cache", "weights"], "weights_bytes": 0, "kv_cache_bytes": 0}
    assert steps["health_generate_released"] is False
    assert steps["weights_back"]["weights_bytes"] == resident["weights_bytes"]
    assert steps["weights_back"]["kv_cache_bytes"] == 0
    assert steps["resumed"] == resident
    first, again = steps["first"], steps["again"]
    assert again.output_ids == first.output_ids and again.logprobs == pytest.approx(first.logprobs, abs=1e-6)
    assert again.weight_version == "2"
