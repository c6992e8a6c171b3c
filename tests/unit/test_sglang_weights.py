"""Delta checkpoints (round trip, size, corruption) and the NCCL weight-sync protocol over gloo.

The NCCL test's engines are fakes at the SGLang boundary (SGLang needs CUDA), the trainer side is the
real ``NcclWeightSync`` with ``backend="gloo"`` instead of NCCL: see ``tests/fixtures/weight_sync_protocol.py``
(shared with the GPU test, which runs it over NCCL).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from slime.backends.sglang.delta import DeltaError, apply_delta, write_delta
from slime.backends.sglang.weights import buckets
from tests.fixtures.weight_sync_protocol import check_sync_protocol, run_sync_protocol

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
def test_nccl_sync_protocol_with_gloo():
    sent, logs = run_sync_protocol("gloo")
    check_sync_protocol(sent, logs, "gloo")
