"""SGLang backend process management and weight sync, exercised with the built-in engine.

SGLang cannot run on these machines (it needs CUDA). The built-in engine
(``python -m slime.backends.rollout.builtin.server``) serves the same HTTP
endpoints this backend uses for startup and disk/delta weight sync, so the
backend runs unchanged with only its command builder swapped. Error paths use
real subprocesses that exit early or never become healthy.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch

from slime.backends.sglang.backend import SGLangRolloutBackend
from slime.backends.sglang.launch import EngineCommand
from slime.backends.sglang.process import EngineStartError, ProcessSpec, busy_ports, start_processes, stop_all
from slime.spec.load import load_spec
from tests.fixtures.tiny_models import SMALL

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _builtin_argv(model_dir: Path, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "slime.backends.rollout.builtin.server",
        "--model-path",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-threads",
        "1",
        "--seed",
        "0",
    ]


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model(**SMALL)


def test_builtin_engine_starts_healthy_and_stops_by_process_group(tiny, tmp_path):
    port = _free_port()
    spec = ProcessSpec(name="engine0", argv=_builtin_argv(tiny, port), url=f"http://127.0.0.1:{port}", ports=(port,))
    procs = start_processes([spec], tmp_path, timeout_s=120)
    try:
        assert procs[0].healthy() and procs[0].log_path.read_text().startswith("$ ")
        assert busy_ports([port], "127.0.0.1") == [port]
    finally:
        stop_all(procs)
    assert procs[0].proc.returncode is not None and _gone(procs[0].pid)
    assert busy_ports([port], "127.0.0.1") == []


def test_early_exit_names_the_engine_its_url_and_log(tmp_path):
    port = _free_port()
    argv = [sys.executable, "-c", "import sys; print('error: unrecognized argument --bogus', flush=True); sys.exit(3)"]
    ok_port = _free_port()
    sleeper = ProcessSpec(
        name="engine0",
        argv=[sys.executable, "-c", "import time; time.sleep(600)"],
        url=f"http://127.0.0.1:{ok_port}",
        ports=(ok_port,),
    )
    bad = ProcessSpec(name="engine1", argv=argv, url=f"http://127.0.0.1:{port}", ports=(port,))
    t0 = time.monotonic()
    with pytest.raises(EngineStartError) as err:
        start_processes([sleeper, bad], tmp_path, timeout_s=60, interval_s=0.1)
    assert time.monotonic() - t0 < 30  # did not wait for the timeout
    text = str(err.value)
    assert "engine1" in text and f"http://127.0.0.1:{port}" in text and "exited with code 3" in text
    assert str(tmp_path / "engine1.log") in text and "unrecognized argument --bogus" in text
    assert err.value.log_path == tmp_path / "engine1.log"


def test_never_healthy_times_out_and_everything_is_stopped(tmp_path):
    port = _free_port()
    pid_file = tmp_path / "pid"
    code = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
        "print('loading weights ...', flush=True); time.sleep(600)"
    )
    spec = ProcessSpec(name="engine3", argv=[sys.executable, "-c", code], url=f"http://127.0.0.1:{port}", ports=(port,))
    with pytest.raises(EngineStartError, match=r"engine3 \(http://127\.0\.0\.1:\d+\): not healthy after 2 s") as err:
        start_processes([spec], tmp_path, timeout_s=2, interval_s=0.2)
    assert "loading weights ..." in err.value.tail
    assert _gone(int(pid_file.read_text()))  # stopped before the error was raised


def test_busy_port_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        spec = ProcessSpec(
            name="engine0", argv=[sys.executable, "-c", "pass"], url=f"http://127.0.0.1:{port}", ports=(port,)
        )
        with pytest.raises(EngineStartError, match=rf"port\(s\) \[{port}\] already in use"):
            start_processes([spec], tmp_path)
    assert not (tmp_path / "engine0.log").exists()


def _perturbed_copy(src: Path, dst: Path, seed: int) -> Path:
    """A new 'trained' checkpoint: a few tensors changed, the rest bit-identical."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for name in sorted(tensors)[:3]:
        tensors[name] = tensors[name] + 0.05 * torch.randn(tensors[name].shape, generator=g)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


async def _greedy_logprobs(url: str, prompt: list[int]):
    from slime.backends.rollout.client import EngineClient

    async with EngineClient(url) as client:
        r = await client.generate(prompt, {"max_new_tokens": 6, "temperature": 0.0}, return_logprob=True)
        version = (await client.get("/get_weight_version"))["weight_version"]
    return r.output_ids, r.logprobs, version


def _hf_logprobs(model_dir: Path, prompt: list[int], out: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from slime.rl.losses import logprobs_from_logits

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.tensor([prompt + out])
    with torch.no_grad():
        lp = logprobs_from_logits(model(ids).logits[:, :-1], ids[:, 1:])[0]
    return lp[len(prompt) - 1 :]


@pytest.mark.parametrize("weight_sync", ["disk", "delta"])
def test_backend_starts_engines_and_syncs_weights(tiny, tmp_path, weight_sync):
    spec = (
        load_spec(ROOT / "specs" / "grpo-disaggregated.yaml", overrides=[f"rollout.weight_sync={weight_sync}"])
        .tasks[0]
        .spec
    )

    def builtin_builder(spec, layout, hosts=None):
        cmds = []
        for i, _ in enumerate(layout.engines):
            port = _free_port()
            cmds.append(
                EngineCommand(
                    engine=i,
                    node_rank=0,
                    nnodes=1,
                    node=0,
                    host="127.0.0.1",
                    gpus=(),
                    port=port,
                    ports=(port,),
                    argv=tuple(_builtin_argv(tiny, port)),
                )
            )
        return cmds

    backend = SGLangRolloutBackend(command_builder=builtin_builder, router=False)
    from slime.spec.layout import plan_layout

    urls = backend.start(spec, plan_layout(spec), {"log_dir": str(tmp_path / "engines")}, tiny)
    try:
        assert len(urls) == 2 and backend.health() == dict.fromkeys(urls, True)
        prompt = [5, 6, 7, 8]
        v1 = _perturbed_copy(tiny, tmp_path / "v1", seed=1)
        backend.update_weights(v1, 1)
        v2 = _perturbed_copy(v1, tmp_path / "v2", seed=2)
        backend.update_weights(v2, 2)  # delta mode: base v1 + delta, rebuilt on this node
        for url in urls:
            out, logprobs, version = asyncio.run(_greedy_logprobs(url, prompt))
            assert version == "2"
            torch.testing.assert_close(torch.tensor(logprobs), _hf_logprobs(v2, prompt, out), atol=1e-4, rtol=0)
        if weight_sync == "delta":
            rebuilt = tmp_path / "engines" / "weights" / "v2"
            assert rebuilt.is_dir() and not (tmp_path / "engines" / "weights" / "v1").exists()
    finally:
        pids = [p.pid for p in backend.processes]
        backend.stop()
    assert all(_gone(pid) for pid in pids)


def test_backend_memory_release_resume_and_collective_sync(tiny, tmp_path):
    """The colocated cycle (release → resume weights → load → resume KV) and the NCCL sync's client code,
    driven through SGLangRolloutBackend against two built-in engines (gloo instead of NCCL on CPU)."""
    import torch.distributed as dist

    from slime.backends.rollout.builtin.rl_control import weights_checksum
    from slime.backends.rollout.client import EngineClient, EngineError
    from slime.backends.sglang.weights import NcclWeightSync
    from slime.spec.layout import plan_layout

    spec = load_spec(ROOT / "specs" / "grpo-disaggregated.yaml").tasks[0].spec

    def builtin_builder(spec, layout, hosts=None):
        ports = [_free_port() for _ in layout.engines]
        return [
            EngineCommand(
                engine=i,
                node_rank=0,
                nnodes=1,
                node=0,
                host="127.0.0.1",
                gpus=(),
                port=p,
                ports=(p,),
                argv=tuple(_builtin_argv(tiny, p)),
            )
            for i, p in enumerate(ports)
        ]

    backend = SGLangRolloutBackend(command_builder=builtin_builder, router=False)
    urls = backend.start(spec, plan_layout(spec), {"log_dir": str(tmp_path / "engines")}, tiny)
    prompt = [5, 6, 7, 8]
    try:
        assert backend.weight_sync_ranks() == [spec.rollout.gpus_per_engine] * 2
        replies = backend.release_memory()
        assert all(r["success"] and "Released" in r["message"] for r in replies)
        with pytest.raises(EngineError, match="memory is released"):
            asyncio.run(_greedy_logprobs(urls[0], prompt))
        backend.resume_memory(["weights"])
        v1 = _perturbed_copy(tiny, tmp_path / "v1", seed=1)
        backend.update_weights(v1, 1)
        backend.resume_memory(["kv_cache", "cuda_graph"])
        for url in urls:
            out, logprobs, version = asyncio.run(_greedy_logprobs(url, prompt))
            assert version == "1"
            torch.testing.assert_close(torch.tensor(logprobs), _hf_logprobs(v1, prompt, out), atol=1e-4, rtol=0)

        # collective sync of v2 from "trainer rank 0" (this process); one group rank per built-in engine
        from transformers import AutoModelForCausalLM

        v2 = _perturbed_copy(v1, tmp_path / "v2", seed=2)
        model = AutoModelForCausalLM.from_pretrained(v2, dtype=torch.float32)
        named = [
            (n, t)
            for n, t in model.state_dict().items()
            if n != "lm_head.weight" or not model.config.tie_word_embeddings
        ]

        async def push():
            clients = [EngineClient(u) for u in urls]
            sync = NcclWeightSync(
                clients=clients,
                engine_gpus=[1, 1],
                master_address="127.0.0.1",
                master_port=_free_port(),
                backend="gloo",
            )
            await sync.init_group()
            await sync.update(named, version=2)
            sums = [(await c.post("/weights_checker", {"action": "checksum"}))["checksum"] for c in clients]
            for c in clients:
                await c.close()
            dist.destroy_process_group(sync.group)
            return sums

        assert asyncio.run(push()) == [weights_checksum(named)] * 2
        for url in urls:
            out, logprobs, version = asyncio.run(_greedy_logprobs(url, prompt))
            assert version == "2"
            torch.testing.assert_close(torch.tensor(logprobs), _hf_logprobs(v2, prompt, out), atol=1e-4, rtol=0)
    finally:
        backend.stop()
