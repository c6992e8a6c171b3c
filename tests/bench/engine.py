"""Decode throughput of the built-in engine vs Hugging Face ``generate``, same model, same batch.

Run by hand (not part of the test suite)::

    python tests/bench/engine.py                     # bs 256 x 64 new tokens, 2 threads
    python tests/bench/engine.py --shape quickstart  # the quickstart rollout: 16 prompts x 8 samples x 4 tokens
    python tests/bench/engine.py --ablate            # also the engine without oneDNN (MKL GEMMs)
    python tests/bench/engine.py --batch 64 --new 128 --repeats 7 --http

Both sides sample at temperature 1 with no EOS stop, so every row decodes exactly
``--new`` tokens (in the quickstart shape the engine gets a ``sampling_seed`` per
request, as the rollout manager sends, which HF ``generate`` has no equivalent of).
Runs alternate (ours, HF, ours, HF, ...) so a busy shared machine slows both
alike; the best and the median of each are printed with their ratio, with the
thread settings and the load average before and after. ``--http`` also measures
the same batch sent as concurrent single requests through the HTTP server and
the rollout client (what a rollout does).

Threads: ``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` here, as the engine server
sets it in production (override with ``OMP_WAIT_POLICY=ACTIVE``): with OpenMP's
default busy-wait, 2 threads on a loaded 2-core machine ran 20-40x slower and
the medians said nothing. On a machine shared with other jobs wall time is
still noisy; ``--cpu-time`` runs both sides on one thread and compares the CPU
time of that thread instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before the torch import: OpenMP reads it once


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint dir (default: build the tiny model in a temp dir)")
    ap.add_argument(
        "--shape",
        choices=("decode", "quickstart"),
        default="decode",
        help="decode: --batch x --new (default); quickstart: 16 prompts x 8 samples x 4 tokens",
    )
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ablate", action="store_true", help="also time the engine with oneDNN off")
    ap.add_argument("--http", action="store_true", help="also time the HTTP server + client path")
    ap.add_argument(
        "--cpu-time", action="store_true", help="1 thread, compare thread CPU time (robust on a busy machine)"
    )
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.rollout.builtin.generator import Engine
    from slime.backends.rollout.builtin.linear import MIN_MACS, onednn_available
    from slime.backends.rollout.builtin.sampling import SamplingParams
    from slime.data.arith import split_pairs
    from slime.models.tiny import build_tiny_model

    torch.set_num_threads(1 if args.cpu_time else args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    tmp = tempfile.TemporaryDirectory()
    model_path = args.model or str(build_tiny_model(Path(tmp.name) / "tiny"))
    if args.shape == "quickstart":
        n_prompts, n_samples, args.new = 16, 8, 4
    else:
        n_prompts, n_samples = args.batch, 1
    batch = n_prompts * n_samples
    sides = {"engine": Engine(model_path, seed=0, max_running_requests=batch)}
    if args.ablate:
        sides["engine, oneDNN off"] = Engine(model_path, seed=0, max_running_requests=batch, onednn=False)
    tok = sides["engine"].tokenizer
    rows = split_pairs(seed=0)[0][:n_prompts]
    prompts = [tok.encode(r["prompt"], add_special_tokens=False) for r in rows for _ in range(n_samples)]
    if len({len(p) for p in prompts}) != 1:
        raise SystemExit("bench prompts must share one length (HF would need padding)")
    if args.shape == "quickstart":
        params: object = [
            SamplingParams(max_new_tokens=4, temperature=1.0, ignore_eos=True, sampling_seed=i) for i in range(batch)
        ]
    else:
        params = SamplingParams(max_new_tokens=args.new, temperature=1.0, ignore_eos=True)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    n_tokens = batch * args.new

    def ours(engine) -> float:
        t = clock()
        out = engine.generate(prompts, params)
        dt = clock() - t
        if sum(len(o.output_ids) for o in out) != n_tokens:
            raise SystemExit("engine produced the wrong number of tokens")
        return dt

    def theirs() -> float:
        t = clock()
        with torch.inference_mode():
            out = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                eos_token_id=None,
                pad_token_id=tok.pad_token_id,
            )
        dt = clock() - t
        if out.shape != (batch, ids.shape[1] + args.new):
            raise SystemExit(f"HF generate returned shape {tuple(out.shape)}")
        return dt

    load_start = os.getloadavg()[0]
    for engine in sides.values():  # warm-up (allocations, thread pools, oneDNN kernels)
        ours(engine)
    theirs()
    times: dict[str, list[float]] = {name: [] for name in (*sides, "HF generate")}
    for _ in range(args.repeats):  # interleaved: A B (C) A B (C) ...
        for name, engine in sides.items():
            times[name].append(ours(engine))
        times["HF generate"].append(theirs())
    load = os.getloadavg()[0]

    def rate(ts, f):
        return n_tokens / f(ts)

    print(
        f"model {model_path}  shape {args.shape}: {batch} requests x {args.new} new tokens  "
        f"repeats {args.repeats}  load average {load_start:.1f} -> {load:.1f} (other work skews both sides)"
        + ("  [thread CPU time]" if args.cpu_time else "  [wall time]")
    )
    print(
        f"threads: torch intra-op {torch.get_num_threads()}, inter-op {torch.get_num_interop_threads()}, "
        f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}; oneDNN linear "
        f"{'on' if onednn_available() else 'unavailable'} (from {MIN_MACS} multiply-adds a call)"
    )
    hf_t = times["HF generate"]
    for name, ts in times.items():
        ratio = (
            ""
            if ts is hf_t
            else (
                f"   ratio vs HF: median {statistics.median(hf_t) / statistics.median(ts):.2f}x"
                f"  best {min(hf_t) / min(ts):.2f}x"
            )
        )
        print(f"{name:<20}: best {rate(ts, min):9.0f} tok/s   median {rate(ts, statistics.median):9.0f}{ratio}")

    if args.http and not args.cpu_time:
        import re
        import subprocess

        from slime.backends.rollout.client import EngineClient

        # The server runs in its own process, as in a real rollout; the client here only sends.
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "slime.backends.rollout.builtin.server",
                "--model-path",
                model_path,
                "--port",
                "0",
                "--seed",
                "0",
                "--num-threads",
                str(args.threads),
                "--max-running-requests",
                str(batch),
                "--log-level",
                "warning",
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        try:
            url = re.search(r"at (http://\S+)", proc.stdout.readline()).group(1)

            async def burst() -> float:
                async with EngineClient(url) as client:
                    sp = {"max_new_tokens": args.new, "temperature": 1.0, "ignore_eos": True}
                    await client.generate(prompts[0], sp)
                    t = time.perf_counter()
                    await asyncio.gather(*(client.generate(p, sp) for p in prompts))
                    return time.perf_counter() - t

            t_http = [asyncio.run(burst()) for _ in range(args.repeats)]
        finally:
            proc.terminate()
            proc.wait(30)
        print(
            f"HTTP server process, {batch} concurrent requests: best {rate(t_http, min):9.0f} tok/s   "
            f"median {rate(t_http, statistics.median):9.0f}   ({min(hf_t) / min(t_http):.2f}x HF generate best)"
        )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
