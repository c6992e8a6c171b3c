"""RL step time breakdown (rollout / train / sync) of the runtime on the quickstart, against a bare loop.

Run by hand (not part of the test suite)::

    python tests/bench/rl_step.py                  # 3 rounds x 30 rollouts of specs/quickstart.yaml, 2 threads
    python tests/bench/rl_step.py --rounds 1 --rollouts 60 --set rollout.batch_size=32

Baseline, measured in the same run: the same step written as one plain Python loop in one process
(built-in ``Engine`` called directly, ``TorchTrainBackend``, weights handed over through the same HF
export on disk) — no Ray, no HTTP, no actors. The runtime is ``python -m slime.train`` on a fresh run dir
(private local Ray, engine behind its HTTP server, trainer and rollout manager as actors); its per-phase
times come from ``metrics.jsonl``. Both skip the SFT warm-up and evals and use the untrained tiny model, so
responses run to ``max_response_len``. Rounds alternate bare and runtime, so a change in the machine's load
hits both; printed are medians over all rounds per phase and the runtime/bare ratio (the orchestration
overhead), the runtime's start-up (from launching ``python -m slime.train`` to the start of rollout 0: the
moment its metrics line appears, less that step's time; median over rounds) and how much of it went to
starting the local Ray (the driver's "connected to Ray" line: a job launched by slime-submit has its Ray
started by the bootstrap before the driver), the thread settings and the
load average before and after (other work on a shared machine slows either side; compare runs made at
similar load). Both sides run with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets it, as the
runtime's CPU workers do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Before torch loads: what the runtime gives its CPU workers too (slime.runtime.job), so the bare loop and the
# runtime wait the same way; OpenMP's default spinning is much slower when other work shares the cores.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def load(overrides: list[str], logdir: Path):
    from slime.spec import load_spec

    return load_spec(REPO / "specs" / "quickstart.yaml", overrides=overrides + [f"logging.dir={logdir}"])


def bare_loop(spec, model_dir: Path, rollouts: int, threads: int, tmp: Path) -> dict[str, list[float]]:
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.rollout.builtin.generator import Engine
    from slime.backends.rollout.builtin.sampling import SamplingParams
    from slime.backends.train.torch_backend import TorchTrainBackend
    from slime.data.jsonl import PromptDataset
    from slime.rl.rewards.string_match import normalize_text
    from slime.runtime.train_data import collate, sequence_scores, token_advantages

    torch.set_num_threads(threads)
    r, a = spec.rollout, spec.algorithm
    engine = Engine(model_dir, seed=spec.train.seed, num_threads=threads)
    backend = TorchTrainBackend()
    backend.init(spec, RankInfo(rank=0, world_size=1, master_addr="", master_port=0, device="cpu"), model_dir)
    data = PromptDataset(spec.data.prompts, seed=spec.train.seed)
    tok = engine.tokenizer
    times: dict[str, list[float]] = {"rollout": [], "train": [], "sync": []}
    for step in range(rollouts):
        t0 = time.perf_counter()
        rows = data.next_batch(r.batch_size)
        n = r.n_samples_per_prompt
        prompts = [tok.encode(row.text, add_special_tokens=False) for row in rows for _ in range(n)]
        labels = [str(row.label) for row in rows for _ in range(r.n_samples_per_prompt)]
        params = [
            SamplingParams(
                max_new_tokens=r.max_response_len, temperature=r.temperature, sampling_seed=step * 100_000 + i
            )
            for i in range(len(prompts))
        ]
        done = engine.generate(prompts, params)
        rewards = [float(normalize_text(c.text) == lab) for c, lab in zip(done, labels)]
        t1 = time.perf_counter()
        batch = collate(
            [
                {"tokens": p + c.output_ids, "response_length": len(c.output_ids), "rollout_log_probs": c.logprobs}
                for p, c in zip(prompts, done)
            ]
        )
        batch.old_log_probs = backend.log_probs(batch, temperature=r.temperature)
        scores = torch.tensor(
            sequence_scores(
                rewards, estimator=a.estimator, group_size=r.n_samples_per_prompt, normalize_std=bool(a.normalize_std)
            )
        )
        batch.advantages, _ = token_advantages(scores, batch.response_mask, estimator=a.estimator)
        backend.train_step(batch, step=step)
        t2 = time.perf_counter()
        out = backend.export_weights(tmp / f"v{step}")
        fut = engine.update_weights_from_disk(str(out), weight_version=str(step + 1))
        while not fut.done():
            engine.step()
        if not fut.result()[0]:
            raise RuntimeError(fut.result()[1])
        t3 = time.perf_counter()
        times["rollout"].append(t1 - t0)
        times["train"].append(t2 - t1)
        times["sync"].append(t3 - t2)
    return times


def runtime_loop(
    overrides: list[str], logdir: Path, name: str
) -> tuple[dict[str, list[float]], float, tuple[float, float]]:
    """Per-phase times of one ``slime.train`` run, its wall time, and its start-up (launch to rollout 0) with
    the part of it spent starting the local Ray."""
    from launchers.base import SubmitOptions, create_run_dir
    from launchers.local.launcher import LocalLauncher

    loaded = load(overrides, logdir)
    run = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    metrics = run / "tasks/0/metrics.jsonl"
    t = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.train", str(run)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    first_line_at = None
    while proc.poll() is None and first_line_at is None:
        if metrics.is_file() and any('"rollout_id": 0' in x for x in metrics.read_text().splitlines()):
            first_line_at = time.perf_counter() - t
        time.sleep(0.02)
    _, err = proc.communicate()
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"slime.train failed ({proc.returncode}):\n{err[-3000:]}")
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    steps = [r for r in rows if r["rollout_id"] >= 0]
    times = {
        "rollout": [r["time/rollout_s"] for r in steps],
        "train": [r["time/train_s"] for r in steps],
        "sync": [r["time/sync_s"] for r in steps],
    }
    startup = (first_line_at or wall) - steps[0]["time/step_s"]
    # The driver's "connected to Ray" line: how much of the start-up was starting the local Ray, which a job
    # launched by slime-submit does not pay in its driver (the bootstrap started Ray before it).
    ray = re.search(r"\[slime\.train \+([\d.]+)s\] connected to Ray", err)
    return times, wall, (startup, float(ray.group(1)) if ray else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rollouts", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3, help="bare/runtime pairs, alternating")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the bare loop")
    ap.add_argument("--set", action="append", default=[], metavar="PATH=VALUE", help="extra spec override")
    ap.add_argument("--raw", type=Path, help="also write the per-step times and start-ups here (JSON)")
    args = ap.parse_args()
    overrides = [
        f"rollout.num_rollouts={args.rollouts}",
        "algorithm.sft_warmup_steps=0",
        "data.eval=[]",
        "logging.progress=false",
        "train.checkpoint.interval=100000",
        *args.set,
    ]
    skip = min(3, args.rollouts // 4)  # first steps pay one-off warm-up costs
    load_start = os.getloadavg()[0]
    bare: dict[str, list[float]] = {"rollout": [], "train": [], "sync": []}
    ours: dict[str, list[float]] = {"rollout": [], "train": [], "sync": []}
    startups, rays, walls = [], [], []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        from slime.models.tiny import ensure_builtin_model

        spec = load(overrides, tmp / "runs").spec
        model_dir = ensure_builtin_model("tiny", tmp / "model")
        for i in range(args.rounds):
            b = bare_loop(spec, model_dir, args.rollouts, args.threads, tmp / f"weights{i}")
            o, wall, (startup, ray) = runtime_loop(overrides, tmp / "runs", f"bench-{i}")
            for phase in bare:
                bare[phase] += b[phase][skip:]
                ours[phase] += o[phase][skip:]
            startups.append(startup)
            rays.append(ray)
            walls.append(wall)
            print(f"round {i}: runtime start-up {startup:.1f} s (local Ray {ray:.1f} s), wall {wall:.1f} s", flush=True)

    if args.raw:
        args.raw.write_text(
            json.dumps({"bare": bare, "runtime": ours, "startup": startups, "ray_start": rays, "wall": walls})
        )

    def med(xs: list[float]) -> float:
        return statistics.median(xs) * 1000

    print(
        f"RL step breakdown, quickstart spec, {args.rounds} rounds x {args.rollouts} rollouts of "
        f"{spec.rollout.batch_size}x{spec.rollout.n_samples_per_prompt} samples (median ms/step, first {skip} "
        "of each run skipped)"
    )
    print(f"{'phase':<10}{'bare loop':>12}{'runtime':>12}{'ratio':>8}")
    for phase in ("rollout", "train", "sync"):
        b, r = med(bare[phase]), med(ours[phase])
        print(f"{phase:<10}{b:>12.1f}{r:>12.1f}{r / b:>8.2f}")
    b = med([x + y + z for x, y, z in zip(bare["rollout"], bare["train"], bare["sync"])])
    r = med([x + y + z for x, y, z in zip(ours["rollout"], ours["train"], ours["sync"])])
    print(f"{'step':<10}{b:>12.1f}{r:>12.1f}{r / b:>8.2f}")
    print(
        f"runtime start-up (launch of slime.train to the start of rollout 0, incl. local Ray): median "
        f"{statistics.median(startups):.1f} s (each: {', '.join(f'{x:.1f}' for x in startups)}); "
        f"slime.train wall median {statistics.median(walls):.1f} s"
    )
    after = [s - r for s, r in zip(startups, rays)]
    print(
        f"  of which starting the local Ray: median {statistics.median(rays):.1f} s; the rest (what the driver of a "
        f"job launched by slime-submit waits, Ray already up): median {statistics.median(after):.1f} s "
        f"(each: {', '.join(f'{x:.1f}' for x in after)})"
    )
    print(
        f"bare loop torch threads {args.threads}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; "
        f"cores {os.cpu_count()}; load average {load_start:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
