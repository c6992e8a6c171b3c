"""``WeightSync`` (``slime.runtime.weight_sync``) against a real built-in engine over HTTP: the colocation
state machine (release after a rollout, resume around the next weight update, in SGLang's order) and
the disk sync's exports.

Real parts: the built-in engine server (served from this process: ``BuiltinRolloutBackend`` itself
would put it in a Ray actor, so ``start``/``stop`` are overridden; every other backend call is the
backend's own, over HTTP) and a real ``TrainerRank`` with the torch backend as the policy (built and
initialised the way the runtime does, without Ray). The engine enforces the order: it refuses to
update released weights and to generate while anything is released or its weights are stale, so a
wrong order fails here. The collective (``nccl``/gloo) sync is covered end to end by
``test_runtime_weight_sync.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace  # noqa: E402

from slime.backends.rollout.builtin.backend import BuiltinRolloutBackend  # noqa: E402
from slime.backends.rollout.builtin.rl_control import weights_checksum  # noqa: E402
from slime.backends.rollout.builtin.server import start_server  # noqa: E402
from slime.backends.rollout.client import EngineClient, EngineError  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.runtime.weight_sync import WeightSync  # noqa: E402
from slime.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)
GREEDY = {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}


class InProcessEngine(BuiltinRolloutBackend):
    """The built-in rollout backend with its one engine served from this process."""

    def start(self, spec, layout, placement, model_dir, *, log_dir=None):
        self.server = start_server(model_dir, seed=0, num_threads=1)
        self.server.engine.weight_version = "0"  # as EngineHost starts it
        self.urls = [self.server.url]
        return list(self.urls)

    def stop(self):
        self.server.stop()


def _call(url: str, fn):
    async def go():
        client = EngineClient(url, timeout_s=60)
        try:
            return await fn(client)
        finally:
            await client.close()

    return asyncio.run(go())


def _generate_version(url: str) -> str:
    return _call(url, lambda c: c.generate([[5, 9, 13]], [GREEDY], return_logprob=True))[0].weight_version


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model(seed=0)


@pytest.fixture()
def parts(model_dir, tmp_path):
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    spec = replace(spec, rollout=replace(spec.rollout, colocate=True, weight_sync="disk"))
    policy = TrainerRank(spec, "actor", 0, 1, threads=torch.get_num_threads(), gpu_slot=False)
    policy.init("127.0.0.1", 0, str(model_dir))
    engines = InProcessEngine()
    engines.start(spec, None, None, model_dir)
    said: list[str] = []
    yield spec, policy, engines, WeightSync(spec, policy, engines, tmp_path / "weights", say=said.append), said
    engines.stop()


def test_release_then_sync_resumes_in_order_and_the_engine_serves_the_new_version(parts, tmp_path):
    spec, policy, engines, ws, said = parts
    url = engines.urls[0]
    assert not ws.released and _generate_version(url) == "0"

    ws.release()
    info = _call(url, lambda c: c.get("/get_server_info"))
    assert ws.released and info["memory_occupation"]["released"] == ["cuda_graph", "kv_cache", "weights"]
    (message,) = said
    assert message.startswith("colocated: engine memory released for training: Released ['cuda_graph', 'kv_cache'")
    with pytest.raises(EngineError, match="memory is released"):
        _generate_version(url)
    ws.release()  # already released: nothing is asked of the engines, nothing said again
    assert ws.released and len(said) == 1

    with torch.no_grad():  # "train": the policy moves away from the engine's weights
        for p in policy.backend.model.parameters():
            p.add_(0.01)
    seconds = ws.sync(1)
    assert seconds > 0 and not ws.released
    info = _call(url, lambda c: c.get("/get_server_info"))
    assert info["memory_occupation"]["released"] == [] and info["memory_occupation"]["kv_cache_bytes"] > 0
    assert _generate_version(url) == "1"
    served = _call(url, lambda c: c.post("/weights_checker", {"action": "checksum"}))["checksum"]
    assert served == weights_checksum(policy.backend.hf_weights())


def test_disk_sync_keeps_one_export_and_writes_the_final_model_from_it(parts, tmp_path):
    spec, policy, engines, ws, said = parts
    exports = tmp_path / "weights"
    ws.sync(1)  # not released: no resume asked (the engine would accept it anyway; nothing said)
    assert ws.last_export == exports / "v1" and said == []
    ws.release()
    ws.sync(2)
    assert sorted(p.name for p in exports.iterdir()) == ["v2"] and _generate_version(engines.urls[0]) == "2"
    final = tmp_path / "final_model"
    ws.write_final_model(final)
    assert (final / "model.safetensors").read_bytes() == (exports / "v2" / "model.safetensors").read_bytes()
    assert not (tmp_path / ".final_model.tmp").exists()


def test_without_colocation_release_does_nothing(parts):
    spec, policy, engines, _, said = parts
    ws = WeightSync(
        replace(spec, rollout=replace(spec.rollout, colocate=False)), policy, engines, Path("unused"), say=said.append
    )
    ws.release()
    assert not ws.released and said == [] and _generate_version(engines.urls[0]) == "0"
