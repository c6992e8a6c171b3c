"""Prefill/decode engine groups (``rollout.sglang.pd``) run: the rollout manager's clients pair each request.

Real SGLang in PD mode needs GPUs and a KV transfer engine (mooncake/nixl), which these machines lack. The
engines here are stand-ins for that GPU-only SGLang (``tests/fixtures/pd_engine.py``: aiohttp subprocesses
started by the real ``SGLangRolloutBackend`` with its command builder swapped) that require the job's bearer
token, record every request and pair as SGLang does: a decode engine answers only once the prefill engine
named by the request's ``bootstrap_host``/``bootstrap_port`` has served its ``bootstrap_room``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from msgspec.structs import replace

from slime.backends.rollout.client import EngineClient, EngineError
from slime.backends.sglang.backend import SGLangRolloutBackend
from slime.backends.sglang.launch import EngineCommand
from slime.core.auth import SECRET_ENV, new_secret
from slime.runtime.rollout_manager import RolloutManager
from slime.spec.load import load_spec
from tests.fixtures.tiny_models import ONE_LAYER

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_ins(spec, layout, hosts=None) -> list[EngineCommand]:
    """Two prefill engines and one decode engine, as launch.engine_commands describes them (role, port)."""
    cmds = []
    for i, role in enumerate(("prefill", "prefill", "decode")):
        port, boot = _free_port(), _free_port() if role == "prefill" else None
        argv = [sys.executable, "-m", "tests.fixtures.pd_engine", "--role", role, "--port", str(port)]
        argv += ["--bootstrap-port", str(boot)] if boot else []
        cmds.append(
            EngineCommand(
                engine=i,
                node_rank=0,
                nnodes=1,
                node=0,
                host="127.0.0.1",
                gpus=(),
                port=port,
                ports=(port, boot) if boot else (port,),
                argv=tuple(argv),
                role=role,
                bootstrap_port=boot,
            )
        )
    return cmds


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pd")
    with pytest.MonkeyPatch.context() as mp:
        secret_file = new_secret(tmp / "auth", "1.0")
        mp.setenv(SECRET_ENV, str(secret_file))
        spec = load_spec(ROOT / "specs" / "grpo-pd.yaml").tasks[0].spec
        backend = SGLangRolloutBackend(command_builder=_stand_ins)  # router on: PD must still start none
        backend.start(spec, None, {"log_dir": str(tmp / "engines")}, tmp)
        try:
            yield backend, spec, secret_file.read_text()
        finally:
            backend.stop()


def _manager(backend, spec) -> RolloutManager:
    mgr = RolloutManager(spec, [], "unused")  # construction only records; set_engines makes the clients
    mgr.set_engines(backend.urls, backend.prefill_engines())
    return mgr


async def _seen(url: str, path: str = "/generate") -> list[dict]:
    async with EngineClient(url) as c:
        return [r["body"] for r in await c.get("/_seen") if r["path"] == path]


async def _close(mgr: RolloutManager) -> None:
    await asyncio.gather(*(c.close() for c in mgr.clients), mgr._prefill.close())


def test_backend_starts_both_groups_without_a_router(engines):
    backend, _, _ = engines
    prefill, decode = backend.urls[:2], backend.urls[2]
    boot = backend.prefill_engines()
    assert list(boot) == prefill and all(isinstance(p, int) for p in boot.values()) and decode not in boot
    assert backend.router_url is None and [p.spec.name for p in backend.processes] == ["engine0", "engine1", "engine2"]
    assert backend.health() == dict.fromkeys(backend.urls, True)


def test_each_request_reaches_a_prefill_and_the_decode_engine_with_one_room(engines):
    backend, spec, _ = engines
    mgr = _manager(backend, spec)
    assert [c.base_url for c in mgr.clients] == [backend.urls[2]]  # only decode engines are generate targets
    boot = backend.prefill_engines()

    async def go():
        try:
            client = mgr.clients[0]
            # two requests at once: the second takes the other prefill engine (fewest prompt tokens in flight)
            return await asyncio.gather(
                client.generate([[1, 2, 3], [4, 5]], [{}, {}], rid=["a.", "b."]),
                client.generate([7, 8, 9], {}, rid="c."),
            )
        finally:
            await _close(mgr)

    (a, b), c = asyncio.run(go())
    assert mgr._prefill.load == [0, 0]  # every prompt token in flight was given back
    for res in (a, b, c):  # the decode engine's reply, first token (from the prefill) included
        assert res.output_ids == [11, 12, 13] and res.logprobs == [-0.25, -0.5, -0.75]
        assert res.text == "decoded" and res.weight_version == "0"  # the prefill's reply has neither
    mine = {str(["a.", "b."]), "c."}
    decoded = {str(body["rid"]): body for body in asyncio.run(_seen(backend.urls[2])) if str(body["rid"]) in mine}
    used = []
    for url in boot:
        for body in asyncio.run(_seen(url)):
            if str(body["rid"]) not in decoded:
                continue
            used.append(url)
            assert decoded[str(body["rid"])] == body  # the same body: rooms, host, port, rid, sampling
            rooms = body["bootstrap_room"] if isinstance(body["rid"], list) else [body["bootstrap_room"]]
            ports = body["bootstrap_port"] if isinstance(body["rid"], list) else [body["bootstrap_port"]]
            assert all(0 <= r < 2**63 for r in rooms) and len(set(rooms)) == len(rooms)
            assert set(ports) == {boot[url]}
    assert sorted(used) == sorted(boot)  # one request on each prefill engine


def test_a_rollout_generates_every_group_through_a_pair(engines, tmp_path, tiny_model):
    """The rollout manager's own path (GroupGenerator over its clients): every sample is the decode's reply."""
    backend, _, _ = engines
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+1=", "label": str(i + 1)}) + "\n" for i in range(4)))
    spec = load_spec(ROOT / "specs" / "quickstart.yaml").spec
    spec = replace(
        spec,
        data=replace(spec.data, prompts=str(prompts), eval=()),
        rollout=replace(spec.rollout, batch_size=4, n_samples_per_prompt=2),
    )
    mgr = RolloutManager(spec, [], str(tiny_model(seed=0, **ONE_LAYER)))
    mgr.setup()
    mgr.set_engines(backend.urls, backend.prefill_engines())
    try:
        samples = mgr.generate(0).samples
    finally:
        mgr.close()
    assert len(samples) == 8 and {s.group_index for s in samples} == {0, 1, 2, 3}
    for s in samples:
        assert s.tokens[-3:] == [11, 12, 13] and s.response_length == 3
        assert s.rollout_log_probs == [-0.25, -0.5, -0.75] and s.response == "decoded"

    def rollout_rids(url: str) -> set[str]:
        return {str(b["rid"]) for b in asyncio.run(_seen(url)) if str(b["rid"]).startswith("['r0-")}

    decoded = rollout_rids(backend.urls[2])  # one request per drawn group, each also on a prefill engine
    assert len(decoded) >= 4 and decoded == rollout_rids(backend.urls[0]) | rollout_rids(backend.urls[1])


def test_a_failure_on_either_side_names_that_engine_and_ends_the_other(engines):
    backend, spec, secret = engines
    prefill0, decode = backend.urls[0], backend.urls[2]

    async def fail(url: str, message: str) -> None:
        async with EngineClient(url, secret=secret) as c:
            await c.post("/_fail", {"status": 500, "message": message})

    async def attempt(rid: str):
        mgr = _manager(backend, spec)  # a fresh pool: idle, so the first prefill engine is picked
        try:
            await mgr.clients[0].generate([1, 2, 3], {}, rid=rid)
        finally:
            await _close(mgr)

    asyncio.run(fail(prefill0, "prefill exploded"))
    with pytest.raises(EngineError) as err:
        asyncio.run(attempt("p-fails."))
    assert err.value.url == prefill0 + "/generate" and err.value.status == 500
    assert "prefill engine of a prefill/decode pair: prefill exploded" in str(err.value)
    deadline = time.monotonic() + 5  # the decode engine, waiting for that KV cache, is told to abort
    while not [b for b in asyncio.run(_seen(decode, "/abort_request")) if b["rid"] == "p-fails."]:
        assert time.monotonic() < deadline, "the decode side's request was not aborted"
        time.sleep(0.05)

    asyncio.run(fail(decode, "decode exploded"))
    with pytest.raises(EngineError) as err:
        asyncio.run(attempt("d-fails."))
    assert err.value.url == decode + "/generate" and "decode engine of a prefill/decode pair: decode exploded" in str(
        err.value
    )


def test_weight_updates_and_control_calls_reach_every_engine_of_both_groups(engines, tmp_path):
    backend, _, _ = engines
    backend.update_weights(tmp_path, 3)  # disk: /update_weights_from_disk (flush_cache) on each engine
    backend.release_memory(["kv_cache"])
    backend.resume_memory(["kv_cache"])
    for url in backend.urls:
        (upd,) = asyncio.run(_seen(url, "/update_weights_from_disk"))
        assert upd == {"model_path": str(tmp_path), "flush_cache": True, "weight_version": "3"}
        assert asyncio.run(_seen(url, "/release_memory_occupation")) == [{"tags": ["kv_cache"]}]
        assert asyncio.run(_seen(url, "/resume_memory_occupation")) == [{"tags": ["kv_cache"]}]
    sender = backend.weight_sender()  # NCCL sync: pause, flush, update and continue on the same engines
    assert list(sender.urls) == backend.urls and backend.weight_sync_ranks() == [2, 2, 2]


def test_the_stand_ins_refuse_requests_without_the_token(engines):
    """So the tests above show the token reached both sides of every pair."""
    backend, _, _ = engines

    async def bare(url: str) -> int:
        async with aiohttp.ClientSession() as http, http.post(url + "/generate", json={"input_ids": [1]}) as r:
            return r.status

    assert [asyncio.run(bare(u)) for u in backend.urls] == [401, 401, 401]


def test_prefill_engines_must_be_among_the_engines_and_leave_a_decode_engine():
    from slime.backends.rollout.pd import paired_clients

    with pytest.raises(ValueError, match="http://p:1 are not among the engines"):
        paired_clients(["http://d:2"], {"http://p:1": 3})
    with pytest.raises(ValueError, match="at least one decode engine"):
        paired_clients(["http://p:1"], {"http://p:1": 3})
