"""Fully-async training (``train.async: {mode: fully}``) on the local CPU layout: the engine generates groups
continuously while the trainer steps; each step trains on groups of several weight versions within the
bound and drops older ones (``rollout/stale_dropped``), each drawn group trained at most once. A run stopped
by SIGUSR1 saves the ready groups in its checkpoint and the resumed run trains (or drops) exactly those first.

Real parts only: ``python -m slime.train`` subprocesses, Ray actors (trainer and engine on separate CPU
slots), the built-in engine over HTTP, torch training of the tiny model after a short SFT warm-up.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import compile_run, metrics, start_train, train

pytestmark = pytest.mark.timeout(600)
ROLLOUTS, BATCH = 6, 8
OVERRIDES = [
    f"rollout.num_rollouts={ROLLOUTS}",
    f"rollout.batch_size={BATCH}",
    "train.global_batch_size=32",  # two optimizer steps a rollout: the engine outpaces the trainer
    "train.micro_batch_size=32",
    "algorithm.sft_warmup_steps=50",
    "train.checkpoint.interval=100",
    "data.eval[0].interval=100",
    "data.eval[0].max_prompts=32",
    "logging.progress=false",
    "debug.save_rollouts=true",
    # three rollouts' worth ahead, one version of staleness: what waits two updates is dropped
    'train.async={"mode": "fully", "max_staleness": 1, "buffer_groups": 24}',
]


def make_run(parent: Path, name: str) -> Path:
    return compile_run(parent, name, OVERRIDES)


def trained(run: Path, rollout_id: int) -> list[dict]:
    """Rollout ``rollout_id``'s samples as the run saved them (debug.save_rollouts)."""
    from slime.runtime.rollout.saved import read_rollout

    return [s.to_dict() for s in read_rollout(run / "tasks/0/rollouts", rollout_id)]


def draws(samples: list[dict]) -> list[int]:
    return sorted({s["metadata"]["draw"] for s in samples})


def test_groups_of_several_versions_are_trained_and_stale_ones_dropped(tmp_path):
    run = make_run(tmp_path, "fully")
    done = train(run)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = metrics(run)[1:]
    assert [r["rollout_id"] for r in rows] == list(range(ROLLOUTS))
    versions = Counter()
    seen: list[int] = []
    for r in rows:
        samples = trained(run, r["rollout_id"])
        assert r["rollout/groups_kept"] == BATCH and len(draws(samples)) == BATCH
        assert r["check/stale_samples"] == 0 and r["rollout/staleness_max"] <= 1  # the bound held
        policy = r["weight_version"] - 1  # the version the step trained from (one sync per step)
        assert all(0 <= policy - s["weight_version"] <= 1 for s in samples)
        versions.update(s["weight_version"] for s in samples)
        seen += draws(samples)
    assert len(seen) == len(set(seen))  # no group trained twice
    assert len(versions) >= 3, versions  # samples of several weight versions were trained
    assert sum(r["rollout/stale_dropped"] for r in rows) > 0  # and groups too old for the bound dropped
    assert sum(r["rollout/staleness_groups/1"] for r in rows) > 0


@pytest.mark.extended
def test_sigusr1_mid_run_then_resume_trains_the_saved_ready_groups_first(tmp_path):
    run = make_run(tmp_path, "stopped")
    proc = start_train(run)
    mfile, deadline = run / "tasks/0/metrics.jsonl", time.monotonic() + 300
    while not (mfile.exists() and len(mfile.read_text().splitlines()) >= 3):  # the -1 line and rollouts 0, 1
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no rollout 1 in time (rc {proc.poll()}): {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-4000:]
    state = json.loads((run / "tasks/0/state.json").read_text())
    stopped_at, ckpt = state["rollout_id"], Path(state["checkpoint"])
    assert state["state"] == "preempted" and stopped_at < ROLLOUTS - 1
    saved = json.loads((ckpt / "state.json").read_text())
    ready = {x["group"]["draw"]: x for x in saved["manager"]["stream_ready"]}  # completed, not yet trained
    before = [d for r in range(stopped_at + 1) for d in draws(trained(run, r))]

    resumed = train(run)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    rows = [r for r in metrics(run) if r["rollout_id"] > stopped_at]
    after = {r: trained(run, r) for r in range(stopped_at + 1, ROLLOUTS)}
    flat = [d for samples in after.values() for d in draws(samples)]
    assert len(before + flat) == len(set(before + flat))  # across both attempts, no group trained twice
    assert not set(ready) & set(before)
    # every saved ready group is trained by the resumed attempt with exactly the saved responses, or dropped
    by_draw: dict[int, list[dict]] = {}
    for samples in after.values():
        for s in samples:
            by_draw.setdefault(s["metadata"]["draw"], []).append(s)
    again = [d for d in ready if d in by_draw]
    for d in again:
        saved_samples = ready[d]["group"]["samples"]
        assert [s["tokens"] for s in by_draw[d]] == [s["tokens"] for s in saved_samples]
        assert [s["reward"] for s in by_draw[d]] == [s["reward"] for s in saved_samples]
    assert len(ready) - len(again) <= sum(r["rollout/stale_dropped"] for r in rows)
    assert again, "no saved ready group was trained after the resume"
