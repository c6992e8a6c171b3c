"""Megatron backend on a real GPU: bf16, distributed optimizer, gradient clipping, each attention backend.

Skips cleanly without CUDA or megatron-core. Each case runs in its own process
(world size 1, NCCL) so megatron's global parallel state never leaks between
cases or into the pytest process. Prints step time and MFU (``-s`` to see them).

Checks: Megatron log-probs match the HF model's bf16 forward on the same
weights (bf16 tolerance); one training step on a batch whose advantages are all
+1 raises the log-probs of that batch (the loss decreases); the SDPA and the
local (unfused) attention give the same log-probs; the exported HF checkpoint
loads. With >= 2 GPUs, TP=2 matches TP=1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tests.fixtures.ranks import last_json, spawn_ranks  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (megatron backend is GPU-only)"),
    pytest.mark.skipif(
        importlib.util.find_spec("megatron.core") is None,
        reason="megatron-core is not installed (pip install --no-deps megatron-core==0.16.1)",
    ),
]
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "L40S": 362.0, "B200": 2250.0}


def peak_flops() -> float | None:
    if os.environ.get("SLIME_PEAK_TFLOPS"):
        return float(os.environ["SLIME_PEAK_TFLOPS"]) * 1e12
    name = torch.cuda.get_device_name(0)
    return next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)


@pytest.fixture(scope="module")
def model_dir(tiny_model) -> Path:
    return tiny_model(
        arch="qwen2",
        hidden=512,
        layers=4,
        heads=8,
        kv_heads=2,
        intermediate=1536,
        max_position=1024,
        seed=0,
    )


def _run(model_dir: Path, out: Path, *, attention: str, tp: int = 1) -> list[dict]:
    outs = spawn_ranks(
        lambda rank, port: [
            sys.executable,
            __file__,
            str(model_dir),
            str(out),
            attention,
            str(rank),
            str(tp),
            str(port),
        ],
        tp,
        env=lambda rank: {"CUDA_VISIBLE_DEVICES": str(rank)},
        timeout=600,
    )
    for stdout in outs:
        print(stdout)
    return [last_json(stdout) for stdout in outs]


@pytest.mark.parametrize("attention", ["sdpa", "local", "auto"])
def test_one_step_bf16(model_dir, tmp_path, attention):
    (r,) = _run(model_dir, tmp_path, attention=attention)
    assert r["logp_mean_abs_diff_vs_hf"] < 0.02, r  # bf16 forward vs bf16 forward, different kernels
    assert r["logp_max_abs_diff_vs_hf"] < 0.3, r
    assert r["mean_logp_after"] > r["mean_logp_before"], r  # the all-positive-advantage step helped
    assert r["pg_loss_after"] < r["pg_loss_before"], r
    assert r["export_loads"] and r["grad_norm"] > 0, r


def test_sdpa_matches_local_attention(model_dir, tmp_path):
    (a,) = _run(model_dir, tmp_path / "a", attention="sdpa")
    (b,) = _run(model_dir, tmp_path / "b", attention="local")
    diff = (torch.tensor(a["logp_before_sample"]) - torch.tensor(b["logp_before_sample"])).abs().max().item()
    assert diff < 0.05, diff


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_tp2_matches_tp1(model_dir, tmp_path):
    (one,) = _run(model_dir, tmp_path / "tp1", attention="sdpa")
    two = _run(model_dir, tmp_path / "tp2", attention="sdpa", tp=2)
    assert abs(two[0]["grad_norm"] - one["grad_norm"]) / one["grad_norm"] < 0.05
    assert abs(two[0]["pg_loss_before"] - one["pg_loss_before"]) < 1e-2


# ----------------------------------------------------------------------------- worker
def _worker(model_dir: str, out: str, attention: str, rank: int, tp: int, port: int) -> None:
    import time

    import msgspec
    from transformers import AutoModelForCausalLM

    from slime.backends.base import RankInfo, TrainBatch
    from slime.backends.megatron.backend import MegatronTrainBackend, mfu, model_flops_per_token
    from slime.rl.losses import logprobs_from_logits
    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    data = {
        "apiVersion": "slime/v1",
        "kind": "RLJob",
        "name": "gpu",
        "model": {"path": model_dir},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 10},
        "train": {
            "backend": "megatron",
            "parallel": {"tensor": tp},
            "micro_batch_size": 4,
            "precision": "bf16",
            "backend_args": {"attention-backend": attention},
            "optimizer": {"lr": 1e-4, "distributed": True, "clip_grad": 1.0},
        },
    }
    spec = resolve(msgspec.convert(data, Spec), Path(out))
    b = MegatronTrainBackend()
    b.init(
        spec,
        RankInfo(rank=rank, world_size=tp, master_addr="127.0.0.1", master_port=port, device="cuda:0"),
        Path(model_dir),
        role="actor",
    )
    g = torch.Generator().manual_seed(0)
    B, T = 8, 512
    tokens = torch.randint(5, 250, (B, T), generator=g)
    am = torch.ones(B, T, dtype=torch.long)
    rm = torch.ones(B, T - 1)
    rm[:, :64] = 0
    batch = TrainBatch(tokens=tokens, attention_mask=am, response_mask=rm, advantages=torch.ones(B, T - 1))
    before = b.log_probs(batch, temperature=1.0)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda()
    with torch.no_grad():
        ref = logprobs_from_logits(hf(tokens.cuda()).logits[:, :-1], tokens[:, 1:].cuda()).cpu()
    del hf
    m = rm.bool()
    batch.old_log_probs = before
    m0 = b.train_step(batch, step=0)  # pg_loss at the old policy (ratio 1): -mean(A)
    after = b.log_probs(batch, temperature=1.0)
    m1 = b.train_step(batch, step=1)  # its pg_loss is measured at the updated policy, before its own update
    timed = []
    for step in range(2, 5):  # speed only: the weights keep moving
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.train_step(batch, step=step)
        torch.cuda.synchronize()
        timed.append(time.perf_counter() - t0)
    step_s = min(timed)
    export = b.export_weights(Path(out) / "export")
    loads = AutoModelForCausalLM.from_pretrained(export) is not None
    peak = peak_flops()
    tokens_per_step = B * T // tp  # each TP rank shares the same tokens; per-GPU work is 1/tp
    result = {
        "attention": b.attention,
        "tp": tp,
        "logp_mean_abs_diff_vs_hf": float((before - ref)[m].abs().mean()),
        "logp_max_abs_diff_vs_hf": float((before - ref)[m].abs().max()),
        "mean_logp_before": float(before[m].mean()),
        "mean_logp_after": float(after[m].mean()),
        "pg_loss_before": m0["pg_loss"],
        "pg_loss_after": m1["pg_loss"],
        "grad_norm": m0["grad_norm"],
        "step_time_s": step_s,
        "export_loads": loads,
        "logp_before_sample": before[:2, 60:80].tolist(),
        "model_tflop_per_step": model_flops_per_token(b.shape, T) * B * T / 1e12,
        "mfu": mfu(b.shape, tokens_per_step, T, step_s, peak) if peak else None,
    }
    print(
        f"# {result['attention']} tp{tp}: step {step_s * 1e3:.1f} ms, "
        f"{result['model_tflop_per_step'] / step_s / tp:.1f} TFLOP/s per GPU, MFU {result['mfu']}"
    )
    torch.distributed.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    a = sys.argv[1:]
    _worker(a[0], a[1], a[2], int(a[3]), int(a[4]), int(a[5]))
