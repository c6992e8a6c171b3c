"""Decode throughput of the built-in engine vs Hugging Face ``generate``, same model, same batch.

Run by hand (not part of the test suite)::

    python tests/bench/engine.py                 # bs 256 x 64 new tokens, 2 threads
    python tests/bench/engine.py --batch 64 --new 128 --repeats 7 --http

Both sides sample at temperature 1 with no EOS stop, so every row decodes exactly
``--new`` tokens. Runs alternate (ours, HF, ours, HF, ...) so a busy shared
machine slows both alike; the best and the median of each are printed with the
ratio. ``--http`` also measures the same batch sent as concurrent single
requests through the HTTP server and the rollout client (what a rollout does).
On a machine shared with other jobs wall time is unreliable; ``--cpu-time``
runs both sides on one thread and compares the CPU time of that thread instead.
There, also set ``OMP_WAIT_POLICY=PASSIVE``: with OpenMP's default busy-wait both
sides ran 20-40x slower on a loaded 2-core machine.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="HF checkpoint dir (default: build the tiny model in a temp dir)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--http", action="store_true", help="also time the HTTP server + client path")
    ap.add_argument("--cpu-time", action="store_true",
                    help="1 thread, compare thread CPU time (robust on a busy machine)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slime.backends.rollout.builtin.generator import Engine
    from slime.backends.rollout.builtin.sampling import SamplingParams
    from slime.data.arith import split_pairs
    from slime.models.tiny import build_tiny_model

    torch.set_num_threads(1 if args.cpu_time else args.threads)
    clock = time.thread_time if args.cpu_time else time.perf_counter
    tmp = tempfile.TemporaryDirectory()
    model_path = args.model or str(build_tiny_model(Path(tmp.name) / "tiny"))
    engine = Engine(model_path, seed=0, max_running_requests=args.batch)
    tok = engine.tokenizer
    rows = split_pairs(seed=0)[0][: args.batch]
    prompts = [tok.encode(r["prompt"]) for r in rows]
    if len({len(p) for p in prompts}) != 1:
        raise SystemExit("bench prompts must share one length (HF would need padding)")
    params = SamplingParams(max_new_tokens=args.new, temperature=1.0, ignore_eos=True)
    hf = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = torch.tensor(prompts)
    n_tokens = args.batch * args.new

    def ours() -> float:
        t = clock()
        out = engine.generate(prompts, params)
        dt = clock() - t
        if sum(len(o.output_ids) for o in out) != n_tokens:
            raise SystemExit("engine produced the wrong number of tokens")
        return dt

    def theirs() -> float:
        t = clock()
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_p=1.0,
                              top_k=0, max_new_tokens=args.new, min_new_tokens=args.new, eos_token_id=None,
                              pad_token_id=tok.pad_token_id)
        dt = clock() - t
        if out.shape != (args.batch, ids.shape[1] + args.new):
            raise SystemExit(f"HF generate returned shape {tuple(out.shape)}")
        return dt

    load_start = os.getloadavg()[0]
    ours(), theirs()  # warm-up (allocations, thread pools)
    t_ours, t_hf = [], []
    for _ in range(args.repeats):
        t_ours.append(ours())
        t_hf.append(theirs())

    def rate(ts, f):
        return n_tokens / f(ts)

    load = os.getloadavg()[0]
    print(f"model {model_path}  batch {args.batch} x {args.new} new tokens  threads {torch.get_num_threads()}  "
          f"repeats {args.repeats}  load average {load_start:.1f} -> {load:.1f} (other work skews both sides)"
          + ("  [thread CPU time]" if args.cpu_time else ""))
    print(f"built-in engine : best {rate(t_ours, min):9.0f} tok/s   median {rate(t_ours, statistics.median):9.0f}")
    print(f"HF generate     : best {rate(t_hf, min):9.0f} tok/s   median {rate(t_hf, statistics.median):9.0f}")
    print(f"ratio (engine / HF): best {min(t_hf) / min(t_ours):.2f}x   median "
          f"{statistics.median(t_hf) / statistics.median(t_ours):.2f}x")

    if args.http and not args.cpu_time:
        import re
        import subprocess

        from slime.backends.rollout.client import EngineClient

        # The server runs in its own process, as in a real rollout; the client here only sends.
        proc = subprocess.Popen(
            [sys.executable, "-m", "slime.backends.rollout.builtin.server", "--model-path", model_path,
             "--port", "0", "--seed", "0", "--num-threads", str(args.threads),
             "--max-running-requests", str(args.batch), "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True, cwd=str(Path(__file__).resolve().parents[2]))
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
        print(f"HTTP server process, {args.batch} concurrent requests: best {rate(t_http, min):9.0f} tok/s   "
              f"median {rate(t_http, statistics.median):9.0f}   ({min(t_hf) / min(t_http):.2f}x HF generate)")
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
