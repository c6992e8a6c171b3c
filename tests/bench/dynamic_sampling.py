"""Rollout throughput with dynamic sampling on vs off: samples kept per second, and those with signal.

Run by hand (not part of the test suite)::

    python tests/bench/dynamic_sampling.py                 # 300 warm-up steps, 12 rollouts of each, 2 threads
    python tests/bench/dynamic_sampling.py --warmup 150 --rollouts 20

What runs: the built-in tiny model gets an SFT warm-up in this process (``TorchTrainBackend``, the
quickstart's settings), so that, as in the quickstart's RL phase, some prompt groups are all right, some
all wrong and some mixed; its weights are served by one built-in engine over HTTP; two rollout managers
(the runtime's own ``RolloutManager``, in this process) draw rollouts from it in turn, interleaved so
both see the same load:

* **off**: ``specs/quickstart.yaml``'s rollout — 16 groups of 8 drawn and all trained on;
* **on**: ``specs/dapo.yaml``'s — groups drawn 24 at a time, only those whose rewards differ
  (``nonzero_std``) kept, up to 4 rounds, until 16 pass.

Printed per mode: median seconds per rollout, samples kept per second, and *signal* samples per second
(samples of groups whose rewards differ: the only ones GRPO learns from; for "on" every kept sample),
with the ratios on/off. The weights do not change between rollouts (a benchmark of the data path, not of
learning). Load average before and after is printed: other work on a shared machine slows both modes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def warmed_model(steps: int, threads: int, tmp: Path) -> Path:
    """The tiny model after ``steps`` SFT steps of the quickstart's warm-up, exported as an HF dir."""
    import torch

    from slime.backends.base import RankInfo
    from slime.backends.train.torch_backend import TorchTrainBackend
    from slime.models.tiny import ensure_builtin_model
    from slime.runtime.rollout_manager import RolloutManager
    from slime.runtime.train_data import collate
    from slime.spec import load_spec

    torch.set_num_threads(threads)
    spec = load_spec(REPO / "specs" / "quickstart.yaml").spec
    model = ensure_builtin_model("tiny", tmp / "models")
    backend = TorchTrainBackend()
    backend.init(spec, RankInfo(rank=0, world_size=1, master_addr="", master_port=0, device="cpu"), model)
    mgr = RolloutManager(spec, [], str(model))
    gbs = spec.train.global_batch_size
    for step in range(steps):
        backend.train_step(collate(mgr.sft_samples(gbs), kind="sft"), step=step)
    return backend.export_weights(tmp / "warm")


def signal(samples) -> int:
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group_index, []).append(float(s.reward or 0.0))
    return sum(len(g) for g in groups.values() if max(g) != min(g))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--warmup", type=int, default=300, help="SFT warm-up steps before measuring")
    ap.add_argument("--rollouts", type=int, default=12, help="rollouts measured per mode")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from slime.backends.rollout.builtin.server import start_server
    from slime.runtime.rollout_manager import RolloutManager
    from slime.spec import load_spec

    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        model = warmed_model(args.warmup, args.threads, Path(tmp))
        server = start_server(model, seed=1, num_threads=args.threads)
        specs = {
            name: load_spec(REPO / "specs" / f"{f}.yaml").spec for name, f in (("off", "quickstart"), ("on", "dapo"))
        }
        mgrs = {name: RolloutManager(spec, [server.url], str(model)) for name, spec in specs.items()}
        times: dict[str, list[float]] = {"off": [], "on": []}
        kept: dict[str, list[int]] = {"off": [], "on": []}
        useful: dict[str, list[int]] = {"off": [], "on": []}
        rounds: list[int] = []
        try:
            for r in range(args.rollouts + 1):  # rollout 0 of each warms the engine up: not counted
                for name, mgr in mgrs.items():
                    t = time.perf_counter()
                    batch = mgr.generate(r, 0)
                    dt = time.perf_counter() - t
                    if r == 0:
                        continue
                    times[name].append(dt)
                    kept[name].append(len(batch.samples))
                    useful[name].append(signal(batch.samples))
                    if name == "on":
                        rounds.append(batch.metrics["rollout/rounds"])
        finally:
            for mgr in mgrs.values():
                mgr.close()
            server.stop()
    rate = {n: sum(kept[n]) / sum(times[n]) for n in times}
    sig = {n: sum(useful[n]) / sum(times[n]) for n in times}
    print(f"load average before {load0[0]:.1f}, after {os.getloadavg()[0]:.1f}; threads {args.threads}")
    print(f"{'mode':5} {'s/rollout':>10} {'kept/rollout':>13} {'kept/s':>8} {'signal/s':>9}")
    for n in ("off", "on"):
        print(
            f"{n:5} {statistics.median(times[n]):10.3f} {statistics.mean(kept[n]):13.1f} {rate[n]:8.1f} {sig[n]:9.1f}"
        )
    print(
        f"on/off: kept samples per second {rate['on'] / rate['off']:.2f}x, signal samples per second "
        f"{sig['on'] / sig['off']:.2f}x; rounds per rollout (on) mean {statistics.mean(rounds):.2f}, max {max(rounds)}"
    )


if __name__ == "__main__":
    main()
