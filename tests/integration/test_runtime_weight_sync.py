"""The runtime's weight-sync modes end to end: disk, collective (``rollout.weight_sync: nccl``, over gloo on
CPU) and colocated (engine memory released after each rollout, resumed around the next sync).

Real parts only: ``python -m slime.train`` subprocesses on a private local Ray, the built-in engine over
HTTP, torch training of the tiny model. The three runs share seeds and data, so a correct sync gives the
same rollouts, rewards and losses whatever the transport: the collective run's engines must hold exactly
the trainer's weights at every version (any missing or corrupted tensor would change the samples), and
the colocated run's engines, whose weights and KV cache are dropped while the trainer steps, must come
back to the same state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import compile_run, metrics, train

pytestmark = pytest.mark.timeout(600)
ROLLOUTS = 3
OVERRIDES = [
    f"rollout.num_rollouts={ROLLOUTS}",
    "rollout.batch_size=8",
    "train.global_batch_size=64",
    "train.micro_batch_size=32",
    "algorithm.sft_warmup_steps=40",
    "train.checkpoint.interval=100",
    "data.eval[0].interval=3",
    "data.eval[0].max_prompts=32",
    "logging.progress=false",
]


def _run(parent: Path, name: str, extra: list[str]) -> tuple[list[dict], str, Path]:
    run = compile_run(parent, name, OVERRIDES + extra)
    done = train(run, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    return metrics(run), done.stderr, run


def _same(a: list[dict], b: list[dict], what: str) -> None:
    assert [r["rollout_id"] for r in b] == [r["rollout_id"] for r in a] == [-1, *range(ROLLOUTS)]
    for x, y in zip(a, b):
        for key, value in x.items():
            if key.startswith(("time/", "perf/")):  # wall-clock timings and the rates derived from them
                continue
            if isinstance(value, float):
                assert y[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (what, x["rollout_id"], key)
            else:
                assert y[key] == value, (what, x["rollout_id"], key)


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("runs"), "disk", [])


def test_collective_sync_matches_disk(disk, tmp_path):
    rows, stderr, run = _run(tmp_path, "nccl", ["rollout.weight_sync=nccl"])
    _same(disk[0], rows, "nccl")
    assert not (run / "tasks/0/weights").exists() or not any((run / "tasks/0/weights").iterdir()), (
        "the collective sync must not write checkpoints for the engines"
    )
    for r in rows[1:]:
        assert r["check/stale_samples"] == 0 and r["rollout/weight_version"] == r["weight_version"] - 1
        assert r["train/logprob_diff"] <= 1e-3
    assert rows[1]["check/step0_logprob_diff"] <= 1e-3
    assert (run / "tasks/0/final_model/model.safetensors").is_file()  # exported once at the end


def test_colocated_release_and_resume_matches_disk(disk, tmp_path):
    rows, stderr, _ = _run(tmp_path, "colocated", ["rollout.colocate=true"])
    assert "colocated: engine memory released for training: Released ['cuda_graph', 'kv_cache', 'weights']" in stderr
    _same(disk[0], rows, "colocated")
