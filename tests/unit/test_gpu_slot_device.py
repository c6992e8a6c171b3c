"""A GPU slot without CUDA never runs on CPU by itself: trainer ranks and built-in engines refuse it with an
``InfraError`` naming the host and slot, unless ``cluster.fake_gpus`` says the GPU slots are placeholders.

This machine has no CUDA at all, which is exactly the failing case. ``TrainerRank`` and ``EngineHost`` run
here as plain objects (no Ray), the way the Ray actors construct and start them.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace  # noqa: E402

from slime.backends.rollout.builtin.backend import EngineHost  # noqa: E402
from slime.core.errors import InfraError  # noqa: E402
from slime.models.tiny import build_tiny_model  # noqa: E402
from slime.placement import slot_device  # noqa: E402
from slime.runtime.failures import classify  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname().split(".")[0]
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("slot-device") / "tiny", seed=0)


def _spec(fake_gpus: bool):
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    return replace(spec, cluster=replace(spec.cluster, gpus_per_node=1, fake_gpus=fake_gpus))


def test_slot_device_refuses_a_gpu_slot_without_cuda_and_names_the_host():
    assert slot_device(False, fake_gpus=False, what="x") == "cpu"  # a CPU slot
    assert slot_device(True, fake_gpus=True, what="x") == "cpu"  # the explicit opt-in
    with pytest.raises(InfraError) as err:
        slot_device(True, fake_gpus=False, what="actor rank 0 (slot node0:gpu0)")
    msg = str(err.value)
    assert f"actor rank 0 (slot node0:gpu0) on {HOST} sits on a GPU slot" in msg
    assert "CUDA is not available there: torch is a CPU-only build" in msg
    assert f"cluster.slurm.exclude: [{HOST}]" in msg and "cluster.fake_gpus: true" in msg
    assert classify(err.value) == 3


def test_a_trainer_rank_on_a_gpu_slot_without_cuda_raises_unless_fake_gpus(model_dir):
    rank = TrainerRank(_spec(False), "actor", 1, 2, threads=1, gpu_slot=True, slot="node0:gpu1")
    with pytest.raises(InfraError, match=rf"actor rank 1 \(slot node0:gpu1\) on {HOST} sits on a GPU slot"):
        rank.init("127.0.0.1", 0, str(model_dir))
    assert rank.device == "cpu" and not hasattr(rank, "rank_info")  # refused before anything loaded
    fake = TrainerRank(_spec(True), "actor", 0, 1, threads=1, gpu_slot=True, slot="node0:gpu0")
    fake.init("127.0.0.1", 0, str(model_dir))
    assert fake.device == "cpu" and fake.where()["device"] == "cpu"
    assert next(fake.backend.model.parameters()).device.type == "cpu"


def test_a_builtin_engine_on_a_gpu_slot_without_cuda_raises_unless_fake_gpus(model_dir):
    host = EngineHost(str(model_dir), seed=0, gpu_slot=True, kwargs={}, host="127.0.0.1", name="engine 0 (slot x)")
    with pytest.raises(InfraError, match=rf"engine 0 \(slot x\) on {HOST} sits on a GPU slot"):
        host.start()
    assert host.server is None
    fake = EngineHost(str(model_dir), seed=0, gpu_slot=True, kwargs={}, host="127.0.0.1", fake_gpus=True)
    try:
        assert fake.start().startswith("http://127.0.0.1:")
        assert fake.server.engine.device.type == "cpu"
    finally:
        fake.stop()
