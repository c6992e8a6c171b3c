"""Megatron backend on a real GPU: bf16, distributed optimizer, gradient clipping, each attention backend,
the MoE / MLA families, exact resume; runnable on ONE GPU (a lent test machine has one H200).

Skips cleanly without CUDA or megatron-core. Each case runs in its own process(es) (NCCL) so
megatron's global parallel state never leaks between cases or into the pytest process. Prints
step time and MFU (``-s`` to see them). Every check compares tensors, so a wrong backend fails:

* bf16, per attention backend: Megatron log-probs match the HF model's bf16 forward on the same
  weights (bf16 tolerance); one step on a batch whose advantages are all +1 raises its log-probs;
  the exported checkpoint holds exactly the trained tensors (bit-exact in bf16) and HF loading it
  reproduces the trained model's log-probs; SDPA and the local (unfused) attention agree.
* fp32, Qwen3 / Qwen3-MoE / Qwen2-MoE / DeepSeek-V3 (tiny, transformers' own classes): log-probs
  equal HF's (fp32 tolerance), a step lowers the loss, the export reproduces the trained model.
* fp32 with the distributed optimizer: save -> step -> load -> step gives the same log-probs, and
  the CUDA RNG stream is restored.
* With >= 2 GPUs: TP=2 gives TP=1's log-probs, losses and gradient norm (fp32).
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


def _run(model_dir: Path, out: Path, *, tp: int = 1, **args) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)

    def argv(rank: int, port: int) -> list[str]:
        payload = {"model_dir": str(model_dir), "out": str(out), "tp": tp, "port": port, **args}
        return [sys.executable, __file__, json.dumps(payload), str(rank)]

    env = {"CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")}  # resume check
    outs = spawn_ranks(argv, tp, env=lambda rank: {**env, "CUDA_VISIBLE_DEVICES": str(rank)}, timeout=600)
    for stdout in outs:
        print(stdout)
    return [last_json(stdout) for stdout in outs]


@pytest.mark.parametrize("attention", ["sdpa", "local", "auto"])
def test_one_step_bf16_and_the_export_is_the_trained_model(model_dir, tmp_path, attention):
    (r,) = _run(model_dir, tmp_path, mode="bf16", attention=attention)
    assert r["logp_mean_abs_diff_vs_hf"] < 0.02, r  # bf16 forward vs bf16 forward, different kernels
    assert r["logp_max_abs_diff_vs_hf"] < 0.3, r
    assert r["mean_logp_after"] > r["mean_logp_before"], r  # the all-positive-advantage step helped
    assert r["grad_norm"] > 0, r
    assert r["export_tensors_equal"] and r["export_tensor_count"] == r["hf_tensor_count"], r
    assert r["export_logp_mean_abs_diff"] < 0.02 and r["export_logp_max_abs_diff"] < 0.3, r
    assert r["trained_moved_logp"] > 1e-3, r  # and the trained model is not the initial one


def test_sdpa_matches_local_attention(model_dir, tmp_path):
    (a,) = _run(model_dir, tmp_path / "a", mode="bf16", attention="sdpa")
    (b,) = _run(model_dir, tmp_path / "b", mode="bf16", attention="local")
    diff = (torch.tensor(a["logp_before_sample"]) - torch.tensor(b["logp_before_sample"])).abs().max().item()
    assert diff < 0.05, diff


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "qwen2_moe", "deepseek_v3"])
def test_model_families_match_hf_in_fp32(tmp_path, family):
    from tests.fixtures.tiny_families import build

    build(family, tmp_path / family)
    (r,) = _run(tmp_path / family, tmp_path / "out", mode="family")
    assert r["logp_max_abs_diff_vs_hf"] < 1e-3, r
    assert r["pg_loss_after"] < r["pg_loss_before"], r
    assert r["export_logp_max_abs_diff"] < 1e-3 and r["trained_moved_logp"] > 1e-3, r
    if family != "qwen3":
        assert 1.0 <= r["moe_load_balancing_loss"] < 4.0, r


def test_resume_is_exact_with_the_distributed_optimizer(model_dir, tmp_path):
    (r,) = _run(model_dir, tmp_path, mode="resume")
    assert r["moved_after_save"] > 1e-4, r  # the step after the save changed the model
    assert r["repeat_max_abs_diff"] < 1e-5, r  # ... and repeating it from the checkpoint gives the same model
    assert r["cuda_rng_restored"], r


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs: NCCL cannot put two ranks on one GPU")
def test_tp2_matches_tp1(model_dir, tmp_path):
    (one,) = _run(model_dir, tmp_path / "tp1", mode="compare")
    two = _run(model_dir, tmp_path / "tp2", mode="compare", tp=2)
    for r in two:
        for key in ("logp_before", "logp_after"):
            diff = (torch.tensor(r[key]) - torch.tensor(one[key])).abs().max().item()
            assert diff < 1e-4, (key, diff)
        for key in ("pg_loss", "grad_norm"):
            assert r[key] == pytest.approx(one[key], rel=1e-4), key


# ----------------------------------------------------------------------------- worker
def _spec(args: dict, *, precision: str, attention: str = "auto", distributed: bool = True, lr: float = 1e-4):
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "gpu",
        "model": {"path": args["model_dir"]},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 10},
        "train": {
            "backend": "megatron",
            "parallel": {"tensor": args["tp"], "sequence_parallel": args["tp"] > 1},
            "micro_batch_size": 4,
            "precision": precision,
            "megatron": {"args": {"attention-backend": attention}},
            "optimizer": {"lr": lr, "lr_schedule": "linear", "distributed": distributed, "clip_grad": 1.0},
        },
    }
    return resolve(msgspec.convert(data, Spec), Path(args["out"]))


def _backend(args: dict, rank: int, spec):
    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend

    b = MegatronTrainBackend()
    info = RankInfo(
        rank=rank, world_size=args["tp"], master_addr="127.0.0.1", master_port=args["port"], device="cuda:0"
    )
    b.init(spec, info, Path(args["model_dir"]), role="actor")
    return b


def _batch(B: int, T: int, vocab: int, *, prompt: int):
    from slime.backends.base import TrainBatch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, vocab, (B, T), generator=g)
    rm = torch.ones(B, T - 1)
    rm[:, :prompt] = 0
    adv = torch.ones(B, T - 1)
    adv[1::2] = -0.5
    return TrainBatch(
        tokens=tokens, attention_mask=torch.ones(B, T, dtype=torch.long), response_mask=rm, advantages=adv
    )


def _hf_logp(model_dir, tokens, dtype):
    from transformers import AutoModelForCausalLM

    from slime.rl.losses import logprobs_from_logits

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa").cuda()
    with torch.no_grad():
        out = logprobs_from_logits(hf(tokens.cuda()).logits.float()[:, :-1], tokens[:, 1:].cuda()).cpu()
    del hf
    return out


def _export_checks(b, out: Path, tokens, after, m, dtype) -> dict:
    from slime.backends.megatron.hf_io import read_tensors

    export = b.export_weights(out / "export")
    saved = read_tensors(export)
    trained = {n: t.to(dtype).cpu() for n, t in b.iter_hf_weights()}
    exp = _hf_logp(export, tokens, dtype)
    return {
        "export_tensors_equal": sorted(saved) == sorted(trained)
        and all(torch.equal(saved[n], trained[n]) for n in saved),
        "export_tensor_count": len(saved),
        "hf_tensor_count": len(trained),
        "export_logp_mean_abs_diff": float((exp - after)[m].abs().mean()),
        "export_logp_max_abs_diff": float((exp - after)[m].abs().max()),
    }


def _bf16(args: dict, rank: int) -> dict:
    import time

    from slime.backends.megatron.flops import mfu, model_flops_per_token

    b = _backend(args, rank, _spec(args, precision="bf16", attention=args["attention"]))
    B, T = 8, 512
    batch = _batch(B, T, 250, prompt=64)
    batch.advantages = torch.ones(B, T - 1)
    m = batch.response_mask.bool()
    before = b.log_probs(batch, temperature=1.0)
    ref = _hf_logp(args["model_dir"], batch.tokens, torch.bfloat16)
    batch.old_log_probs = before
    m0 = b.train_step(batch, step=0)
    after = b.log_probs(batch, temperature=1.0)
    timed = []
    for step in range(1, 4):  # speed only
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        b.train_step(batch, step=step)
        torch.cuda.synchronize()
        timed.append(time.perf_counter() - t0)
    trained = b.log_probs(batch, temperature=1.0)
    step_s, peak = min(timed), peak_flops()
    result = {
        "attention": b.attention,
        "logp_mean_abs_diff_vs_hf": float((before - ref)[m].abs().mean()),
        "logp_max_abs_diff_vs_hf": float((before - ref)[m].abs().max()),
        "mean_logp_before": float(before[m].mean()),
        "mean_logp_after": float(after[m].mean()),
        "trained_moved_logp": float((trained - before)[m].abs().max()),
        "grad_norm": m0["grad_norm"],
        "step_time_s": step_s,
        "logp_before_sample": before[:2, 60:80].tolist(),
        "model_tflop_per_step": model_flops_per_token(b.shape, T) * B * T / 1e12,
        "mfu": mfu(b.shape, B * T, T, step_s, peak) if peak else None,
        **_export_checks(b, Path(args["out"]), batch.tokens, trained, m, torch.bfloat16),
    }
    print(f"# {result['attention']}: step {step_s * 1e3:.1f} ms, MFU {result['mfu']}")
    return result


def _family(args: dict, rank: int) -> dict:
    b = _backend(args, rank, _spec(args, precision="fp32", lr=1e-3))
    batch = _batch(8, 48, 100, prompt=8)
    m = batch.response_mask.bool()
    before = b.log_probs(batch, temperature=1.0)
    ref = _hf_logp(args["model_dir"], batch.tokens, torch.float32)
    batch.old_log_probs = before
    m0 = b.train_step(batch, step=0)
    m1 = b.train_step(batch, step=1)
    after = b.log_probs(batch, temperature=1.0)
    return {
        "logp_max_abs_diff_vs_hf": float((before - ref)[m].abs().max()),
        "pg_loss_before": m0["pg_loss"],
        "pg_loss_after": m1["pg_loss"],
        "moe_load_balancing_loss": m0.get("moe_load_balancing_loss"),
        "trained_moved_logp": float((after - before)[m].abs().max()),
        **_export_checks(b, Path(args["out"]), batch.tokens, after, m, torch.float32),
    }


def _resume(args: dict, rank: int) -> dict:
    torch.use_deterministic_algorithms(True, warn_only=True)
    b = _backend(args, rank, _spec(args, precision="fp32", lr=1e-3))
    batch = _batch(8, 128, 250, prompt=16)
    batch.old_log_probs = b.log_probs(batch, temperature=1.0)
    b.train_step(batch, step=0)
    b.save(Path(args["out"]) / "ckpt")
    saved = b.log_probs(batch, temperature=1.0)
    rng_after_save = torch.rand(4, device="cuda").tolist()
    b.train_step(batch, step=1)
    first = b.log_probs(batch, temperature=1.0)
    b.load(Path(args["out"]) / "ckpt")
    rng_after_load = torch.rand(4, device="cuda").tolist()
    b.train_step(batch, step=1)
    again = b.log_probs(batch, temperature=1.0)
    return {
        "moved_after_save": float((first - saved).abs().max()),
        "repeat_max_abs_diff": float((again - first).abs().max()),
        "cuda_rng_restored": rng_after_load == rng_after_save,
    }


def _compare(args: dict, rank: int) -> dict:
    b = _backend(args, rank, _spec(args, precision="fp32", lr=1e-3))
    batch = _batch(8, 128, 250, prompt=16)
    before = b.log_probs(batch, temperature=1.0)
    batch.old_log_probs = before
    m0 = b.train_step(batch, step=0)
    after = b.log_probs(batch, temperature=1.0)
    return {
        "logp_before": before.tolist(),
        "logp_after": after.tolist(),
        **{k: m0[k] for k in ("pg_loss", "grad_norm")},
    }


def _worker(args: dict, rank: int) -> None:
    result = {"bf16": _bf16, "family": _family, "resume": _resume, "compare": _compare}[args["mode"]](args, rank)
    torch.distributed.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]), int(sys.argv[2]))
