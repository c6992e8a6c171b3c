"""The fit check as a spec rule and a command: refused at validate (exit 2) with the role, the largest
terms and the fixes; a near miss warns; ``--no-fit-check`` skips it and the lock records that; ``fit``
prints the table. Silent without a readable config.json or a known GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slime.cli.main import main
from slime.fit import estimate
from slime.fit.check import DISABLE_ENV
from slime.fit.gpus import gpu_memory_gib
from tests.fixtures.fit_configs import QWEN25_7B, write_model
from tests.fixtures.spec_helpers import GPU_SPEC, load, problems, spec, to_yaml

# Qwen2.5-7B, 16 GPUs, tp 2, colocated: fits an 80 GiB GPU, not a 40 GiB one (no recompute, the optimizer unsharded)
BIG = {"train.micro_batch_size": 1, "rollout.max_prompt_len": 1024, "rollout.max_response_len": 8192}


@pytest.fixture
def qwen7b(tmp_path: Path) -> Path:
    return write_model(tmp_path, "Qwen2.5-7B-Instruct", QWEN25_7B)


def _spec(model: Path, gpu: dict | None, **edits):
    return spec(GPU_SPEC, **{"model.path": str(model), **BIG, **edits, **({"cluster.gpu": gpu} if gpu else {})})


def test_a_gpu_name_alone_gives_its_memory(qwen7b):
    assert gpu_memory_gib("h100 80gb") == gpu_memory_gib("H100-80GB") == 80 and gpu_memory_gib("H200") == 141
    report = estimate(load(_spec(qwen7b, {"name": "H200-141GB"})).spec)
    assert report is not None and report.gpu_bytes == 141 << 30 and report.gpu == "H200-141GB"


def test_an_unknown_gpu_name_is_refused_with_the_known_ones(qwen7b):
    [p] = problems(_spec(qwen7b, {"name": "Z900"}))
    assert p.path == "cluster.gpu.name" and "'Z900' is not a GPU" in p.message and "H100-80GB" in p.hint


def test_memory_gb_decides_whether_the_actor_fits(qwen7b):
    assert not problems(_spec(qwen7b, {"name": "Z900", "memory_gb": 80}))
    [p] = [p for p in problems(_spec(qwen7b, {"memory_gb": 48})) if p.path == "train.parallel"]
    assert p.path == "train.parallel" and "the actor needs 60.3 GiB" in p.message and "has 48.0 GiB" in p.message
    assert "largest terms: activations 21.2 GiB, weights 14.2 GiB" in p.message
    # full recompute alone brings it under 48 GiB, and costs no GPUs: listed first
    assert p.hint.startswith("cheapest fixes: train.megatron.args.recompute-granularity: full (-> 41.")
    assert "train.parallel.tensor: 4" in p.hint


def test_nothing_is_said_without_a_known_gpu_or_a_readable_config(qwen7b, tmp_path):
    assert estimate(load(_spec(qwen7b, None)).spec) is None
    assert estimate(load(_spec(tmp_path / "absent", {"memory_gb": 1})).spec) is None


def test_an_engine_that_cannot_hold_one_request_is_refused(qwen7b):
    # 0.15 x (80 GiB - the colocated trainer's ~33 GiB) is less than the engine's 7.1 GiB of weights
    edits = {"rollout.sglang": {"args": {"mem-fraction-static": 0.15}}}
    [p] = problems(_spec(qwen7b, {"name": "H100-80GB"}, **edits))
    assert p.path == "rollout.gpus_per_engine" and "cannot hold one request: its KV pool takes 0 tokens" in p.message
    assert "trainer (resident)" in p.message and "rollout.colocate: false" in p.hint


def test_a_small_kv_pool_warns_with_the_throughput_consequence(qwen7b):
    loaded = load(_spec(qwen7b, {"name": "H100-80GB"}, **{"rollout.sglang": {"args": {"mem-fraction-static": 0.3}}}))
    [w] = [p for p in loaded.warnings if p.path == "rollout.gpus_per_engine"]
    assert "waves" in w.message and "samples at full length" in w.message


def test_validate_refuses_with_exit_2_and_no_fit_check_skips_it(qwen7b, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "0")  # restored (unset) after the test, whatever main() sets
    path = tmp_path / "job.yaml"
    path.write_text(to_yaml(_spec(qwen7b, {"memory_gb": 40})))
    assert main(["validate", str(path)]) == 2
    assert "the actor needs" in capsys.readouterr().err
    assert main(["validate", str(path), "--no-fit-check"]) == 0


def test_fit_prints_each_role_and_exits_by_the_verdict(qwen7b, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "0")  # restored (unset) after the test, whatever main() sets
    path = tmp_path / "job.yaml"
    path.write_text(to_yaml(_spec(qwen7b, None)))
    assert main(["fit", str(path), "--gpu", "H100-80GB"]) == 0
    out = capsys.readouterr().out
    assert "actor (16 x H100-80GB)" in out and "kv pool" in out and "headroom (ok)" in out
    assert main(["fit", str(path), "--set", "cluster.gpu={memory_gb: 40}", "--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["ok"] is False and doc["roles"][0]["verdict"] == "over" and doc["problems"][0]["path"] == "train.parallel"
    )
    assert main(["fit", str(path)]) == 2 and "cluster.gpu.name" in capsys.readouterr().err


def test_the_lock_records_a_skipped_fit_check(qwen7b, tmp_path, monkeypatch):
    from launchers.base import SubmitOptions
    from launchers.slurm.launcher import SlurmLauncher
    from slime.provenance import build_lock

    loaded = load(_spec(qwen7b, {"name": "H100-80GB"}), base_dir=tmp_path)
    request = SlurmLauncher().dryrun(loaded, SubmitOptions(run_name="fit-1")).request
    assert build_lock(request, SubmitOptions(), environ={})["options"]["fit_check"] is True
    assert build_lock(request, SubmitOptions(), environ={DISABLE_ENV: "1"})["options"]["fit_check"] is False
