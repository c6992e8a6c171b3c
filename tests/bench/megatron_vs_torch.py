"""Train-step speed: the Megatron backend vs a plain HF + SDPA torch step, same model, same batch, one GPU.

Run by hand on a GPU machine (megatron-core installed with --no-deps)::

    python tests/bench/megatron_vs_torch.py                    # 0.47B Qwen2 shape, seq 2048, batch 8, bf16
    python tests/bench/megatron_vs_torch.py --attention sdpa local auto
    python tests/bench/megatron_vs_torch.py --device cpu --tiny --skip-megatron   # smoke-test the torch side

Model: a randomly initialised Qwen2-shaped model (default hidden 1024, 24
layers, 16 heads, 16 KV heads, FFN 4096, vocab 32768: 0.47B parameters). Batch
``--batch`` x ``--seq`` tokens, all trained (GRPO loss with advantages +1).

* torch baseline: ``AutoModelForCausalLM`` in bf16 with SDPA attention,
  ``torch.optim.AdamW(fused=True)`` on the bf16 parameters, loss = the shared
  ``slime.rl.losses.policy_loss`` on ``logprobs_from_logits``, one micro-batch.
* megatron: ``MegatronTrainBackend.train_step`` (world size 1, bf16, fp32 master
  weights in the distributed optimizer, gradient clipping 1.0), one micro-batch.

Each side runs ``--warmup`` steps then ``--steps`` timed steps; the best and
median step times, TFLOP/s and MFU (``--peak-tflops``, default by GPU name) are
printed with the ratio megatron/torch in throughput (> 1 means Megatron is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "L40S": 362.0, "B200": 2250.0}


def build_model(out: Path, args) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.ffn,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=max(4096, args.seq),
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(out)
    return out


def make_batch(args):
    import torch

    from slime.backends.base import TrainBatch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    ones = torch.ones(args.batch, args.seq - 1)
    return TrainBatch(
        tokens=tokens, attention_mask=torch.ones_like(tokens), response_mask=ones, advantages=ones, old_log_probs=None
    )


def timed(step, args, sync) -> list[float]:
    for _ in range(args.warmup):
        step()
    sync()
    out = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        out.append(time.perf_counter() - t0)
    return out


def torch_side(model_dir: Path, args) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    from slime.rl.losses import logprobs_from_logits, policy_loss

    dev = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").to(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=dev.type == "cuda")
    batch = make_batch(args)
    tokens = batch.tokens.to(dev)
    mask, adv = batch.response_mask.to(dev), batch.advantages.to(dev)

    def step():
        logits = model(tokens).logits[:, :-1]
        logp = logprobs_from_logits(logits, tokens[:, 1:])
        loss, _ = policy_loss(logp, logp.detach(), adv, mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = timed(step, args, torch.cuda.synchronize if dev.type == "cuda" else (lambda: None))
    model = opt = None  # free GPU memory before the megatron side runs
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return times


def megatron_side(model_dir: Path, args, attention: str) -> tuple[list[float], str]:
    """Runs in a subprocess per attention backend (megatron's global state is per process)."""
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "--_worker", str(model_dir), attention, str(port), json.dumps(vars(args))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"megatron ({attention}) failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["times"], out["attention"]


def _megatron_worker(model_dir: str, attention: str, port: int, raw: str) -> None:
    import msgspec
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.megatron.backend import MegatronTrainBackend
    from slime.spec.resolve import resolve
    from slime.spec.types import Spec

    args = argparse.Namespace(**json.loads(raw))
    data = {
        "apiVersion": "slime/v2",
        "kind": "RLJob",
        "name": "bench",
        "model": {"path": model_dir},
        "data": {"prompts": "unused.jsonl"},
        "rollout": {"num_rollouts": 100},
        "train": {
            "backend": "megatron",
            "micro_batch_size": args.batch,
            "precision": "bf16",
            "megatron": {"args": {"attention-backend": attention}},
            "optimizer": {"lr": 1e-6, "distributed": True, "clip_grad": 1.0},
        },
    }
    spec = resolve(msgspec.convert(data, Spec), Path(model_dir))
    backend = MegatronTrainBackend()
    backend.init(
        spec,
        RankInfo(rank=0, world_size=1, master_addr="127.0.0.1", master_port=port, device="cuda:0"),
        Path(model_dir),
        role="actor",
    )
    batch = make_batch(args)
    counter = iter(range(10**9))
    times = timed(lambda: backend.train_step(batch, step=next(counter)), args, torch.cuda.synchronize)
    print(json.dumps({"times": times, "attention": backend.attention}))
    torch.distributed.destroy_process_group()


def report(name: str, times: list[float], flops_per_step: float, peak: float | None) -> float:
    best, med = min(times), statistics.median(times)
    tf = flops_per_step / best / 1e12
    mfu = f"{flops_per_step / best / peak:.1%}" if peak else "n/a"
    print(f"{name:<22} best {best * 1e3:8.1f} ms  median {med * 1e3:8.1f} ms  {tf:7.1f} TFLOP/s  MFU {mfu}")
    return best


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_worker":
        _megatron_worker(*sys.argv[2:6])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--attention", nargs="+", default=["auto"], help="megatron attention backends to time")
    ap.add_argument("--peak-tflops", type=float, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a toy shape (smoke test)")
    ap.add_argument("--skip-megatron", action="store_true")
    args = ap.parse_args()
    if args.tiny:
        args.hidden, args.layers, args.heads, args.kv_heads, args.ffn, args.vocab = 64, 2, 4, 4, 128, 256
        args.seq, args.batch, args.warmup, args.steps = 64, 2, 1, 2

    import torch

    from slime.backends.megatron.backend import model_flops_per_token
    from slime.backends.megatron.config import ModelShape

    if args.device == "cuda" and not torch.cuda.is_available():
        print("# skipped: no CUDA device (this benchmark measures GPU step time)")
        return 0
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    if peak is None and args.device == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        peak = next((v * 1e12 for k, v in PEAK_TFLOPS.items() if k in name), None)
        print(f"# GPU: {name}, peak bf16 {peak / 1e12 if peak else 'unknown'} TFLOP/s")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args)
        shape = ModelShape.from_hf_config(json.loads((model_dir / "config.json").read_text()))
        flops = model_flops_per_token(shape, args.seq) * args.batch * args.seq
        print(
            f"# model {shape.num_params() / 1e9:.3f}B params, batch {args.batch} x seq {args.seq}, "
            f"{flops / 1e12:.1f} TFLOP per step"
        )
        base = report("torch (HF+SDPA)", torch_side(model_dir, args), flops, peak)
        if args.skip_megatron:
            return 0
        for attention in args.attention:
            times, resolved = megatron_side(model_dir, args, attention)
            best = report(f"megatron ({resolved})", times, flops, peak)
            print(f"{'':22} speed vs torch: {base / best:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
