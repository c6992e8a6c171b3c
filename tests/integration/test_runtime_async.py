"""Async training (``train.async``) on the local CPU layout: rollout k+1 is generated with the weights of step
k-1 while the trainer trains on k, every sample records its weight version, the importance ratio of the stale
samples is not 1 (TIS reweights them), the ``perf/*`` and TensorBoard records are written; a run stopped by
SIGUSR1 saves the rollout it generated ahead and its resume trains on exactly the same samples, with the same
losses, as an uninterrupted run.

Real parts only: ``python -m slime.train`` subprocesses, Ray actors (trainer and engine on separate CPU
slots), the built-in engine over HTTP, torch training of the tiny model after a short SFT warm-up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.launcher import LocalLauncher
from slime.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)
ROLLOUTS = 6
ENGINE_EXTREMES = {"train/logprob_diff_max", "train/is_ratio_max", "train/is_ratio_min"}
OVERRIDES = [
    f"rollout.num_rollouts={ROLLOUTS}",
    "rollout.batch_size=8",
    "train.global_batch_size=64",
    "train.micro_batch_size=32",
    "algorithm.sft_warmup_steps=100",
    "train.checkpoint.interval=100",
    "data.eval[0].interval=3",
    "data.eval[0].max_prompts=64",
    "logging.progress=false",
    "train.async=true",
    'algorithm.tis={"enabled": true, "clip": 1.05, "clip_low": 0.95}',  # tight: the stale tokens get clipped
    "logging.tensorboard=true",
]


def make_run(parent: Path, name: str) -> Path:
    loaded = load_spec(REPO / "specs" / "quickstart.yaml", overrides=OVERRIDES + [f"logging.dir={parent}"])
    return create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    e.update(WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    return e


def train(run: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slime.train", str(run), *args],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "tasks/0/metrics.jsonl").read_text().splitlines() if line]


def comparable(rows: list[dict]) -> list[dict]:
    """Everything but wall-clock timings and the rates derived from them."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def scalars(run: Path, key: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tasks/0/tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(key)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = make_run(tmp_path_factory.mktemp("runs"), "straight")
    done = train(run, "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    return run


def test_rollouts_are_one_step_stale_and_tis_reweights_them(uninterrupted):
    run = uninterrupted
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert state["state"] == "succeeded"
    rows = metrics(run)
    assert [r["rollout_id"] for r in rows] == [-1, *range(ROLLOUTS)]
    first, later = rows[1], rows[2:]
    # rollout 0 is generated before any update: same weights as the trainer's, ratio 1 up to kernels
    assert first["rollout/staleness_max"] == 0 and first["rollout/weight_version"] == first["weight_version"] - 1
    assert abs(first["train/is_ratio_mean"] - 1) < 1e-4 and first["train/tis_clipfrac"] == 0
    for r in later:
        # generated with the weights of the step before the previous one, while the trainer trained
        assert r["rollout/staleness_mean"] == r["rollout/staleness_max"] == 1, r["rollout_id"]
        assert r["rollout/weight_version"] == r["weight_version"] - 2 and r["check/stale_samples"] == 0
    # stale samples: trainer and engine disagree wherever the step in between moved the weights (a rollout
    # whose groups all scored alike trains with zero advantages and leaves them as they were)
    moved = [r for prev, r in zip(rows[1:], later) if prev["train/grad_norm"] > 0]
    assert len(moved) >= len(later) - 1, [r["train/grad_norm"] for r in rows[1:]]
    stale_ratio = [max(r["train/is_ratio_max"] - 1, 1 - r["train/is_ratio_min"]) for r in moved]
    assert min(stale_ratio) > 1e-3, stale_ratio
    assert max(r["train/tis_clipfrac"] for r in later) > 0  # and clip 1.05 / 0.95 truncates some
    for r in rows[1:]:
        for key in (
            "perf/rollout_tokens_per_s",
            "perf/train_tokens_per_s",
            "perf/train_samples_per_s",
            "perf/train_tflops",
            "perf/trainer_idle_frac",
            "time/generate_s",
            "time/rollout_s",
        ):
            assert key in r, key
        assert r["perf/train_flops"] > 0 and "perf/mfu" not in r  # CPU: no peak, no MFU
    # the engines' slot is its own: 2 placement bundles on the one node
    assert len(state["ranks"]) == 1 and len(state["engines"]) == 1


def test_tensorboard_holds_the_same_records_as_metrics_jsonl(uninterrupted):
    rows = metrics(uninterrupted)
    for key in ("rollout/reward_mean", "train/loss", "train/is_ratio_mean"):
        logged = scalars(uninterrupted, key)
        expected = [(r["rollout_id"] + 1, r[key]) for r in rows if key in r]
        assert [s for s, _ in logged] == [s for s, _ in expected]
        assert [v for _, v in logged] == pytest.approx([v for _, v in expected], rel=1e-6)


def test_sigusr1_mid_run_then_resume_replays_the_prefetched_rollout_exactly(uninterrupted, tmp_path):
    run = make_run(tmp_path, "stopped")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slime.train", str(run)],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    mfile = run / "tasks/0/metrics.jsonl"
    deadline = time.monotonic() + 600
    while True:
        if mfile.exists() and len(mfile.read_text().splitlines()) >= 3:  # the -1 line and rollouts 0, 1
            proc.send_signal(signal.SIGUSR1)
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the driver did not finish rollout 1 in time (rc {proc.poll()}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-4000:]
    state = json.loads((run / "tasks/0/state.json").read_text())
    stopped_at = state["rollout_id"]
    assert state["state"] == "preempted" and 1 <= stopped_at < ROLLOUTS - 1
    ckpt = Path(state["checkpoint"])
    saved = json.loads((ckpt / "state.json").read_text())
    assert saved["prefetched"] == stopped_at + 1  # the rollout generated ahead is in the checkpoint
    ahead = json.loads((ckpt / "prefetched_rollout.json").read_text())
    assert ahead["rollout_id"] == stopped_at + 1 and len(ahead["samples"]) == 64
    assert {s["weight_version"] for s in ahead["samples"]} == {saved["weight_version"] - 1}

    resumed = train(run)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"resumed from {ckpt}" in resumed.stdout + resumed.stderr
    a, b = comparable(metrics(uninterrupted)), comparable(metrics(run))
    assert [r["rollout_id"] for r in b] == [-1, *range(ROLLOUTS)]
    for x, y in zip(a, b):
        assert set(x) == set(y), x["rollout_id"]
        for key in x:
            if isinstance(x[key], float):
                # extremes of trainer-vs-engine log-prob differences: the engine's batches form by timing, and a
                # batch's size changes its matmul's rounding (~1e-6 on a log-prob); a max picks that noise up
                tol = 2e-5 if key in ENGINE_EXTREMES else 1e-6
                assert y[key] == pytest.approx(x[key], rel=1e-5, abs=tol), (x["rollout_id"], key)
            else:
                assert y[key] == x[key], (x["rollout_id"], key)
    # TensorBoard dropped what the stopped attempt logged past its checkpoint: each step once
    logged = scalars(run, "rollout/reward_mean")
    assert [s for s, _ in logged] == list(range(1, ROLLOUTS + 1))
    assert [v for _, v in logged] == pytest.approx([r["rollout/reward_mean"] for r in b[1:]], rel=1e-6)
