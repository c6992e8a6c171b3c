"""Saved rollouts and the debug modes, end to end through ``python -m slime.train`` on a private Ray:

* run A trains with dynamic sampling (a variable number of samples per rollout) and saves its rollouts and
  the trainer's log-probs of them (sidecars; DP2: two trainer ranks, one sidecar each);
* run B (``debug.mode: train_only``, ``debug.load_rollouts`` = A's) starts no engines and reproduces A's
  training metrics step for step, exactly (fp32 on CPU is deterministic for the same computation);
* run C (``debug.mode: rollout_only``) starts no trainer ranks and never updates the weights; its first
  rollout is A's first rollout, sample for sample (log-probs to float rounding; later rollouts differ:
  A's policy has moved).

Real parts only: subprocesses, Ray actors, the built-in engine over HTTP, torch training of the tiny model.
The reward is ``tests/fixtures/parity_reward.py:one_in_five`` (mixed and flat groups from an untrained policy).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.launcher import LocalLauncher
from slime.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)
ROLLOUTS = 3
OVERRIDES = [
    f"rollout.num_rollouts={ROLLOUTS}",
    "rollout.batch_size=6",
    "rollout.n_samples_per_prompt=4",
    "rollout.over_sampling_batch_size=9",
    "rollout.dynamic_sampling.filter=nonzero_std",
    "rollout.dynamic_sampling.max_rounds=1",  # often short: a varying sample count
    "train.global_batch_size=8",
    "train.micro_batch_size=8",
    "algorithm.sft_warmup_steps=0",
    "reward.type=custom",
    "reward.custom=tests.fixtures.parity_reward:one_in_five",
    "data.eval=[]",
    "train.checkpoint.interval=100",
    "logging.progress=false",
]


def run(parent: Path, name: str, *extra: str) -> Path:
    loaded = load_spec(REPO / "specs" / "quickstart.yaml", overrides=[*OVERRIDES, *extra, f"logging.dir={parent}"])
    run_dir = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(
        WANDB_MODE="offline",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [sys.executable, "-m", "slime.train", str(run_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return run_dir


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "tasks/0/metrics.jsonl").read_text().splitlines() if x]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    return run(tmp_path_factory.mktemp("runs"), "a", "debug.save_rollouts=true")


def test_a_train_only_replay_reproduces_the_training_metrics_exactly(run_a, tmp_path):
    saved = run_a / "tasks/0/rollouts"
    assert sorted(p.name for p in saved.glob("rollout_*")) == [f"rollout_{r:06d}.parquet" for r in range(ROLLOUTS)]
    b = run(tmp_path, "b", "debug.mode=train_only", f"debug.load_rollouts={saved}")
    rows_a, rows_b = metrics(run_a)[1:], metrics(b)[1:]
    assert [r["rollout_id"] for r in rows_b] == list(range(ROLLOUTS))
    assert any(r["rollout/groups_dropped"] for r in rows_a)  # the filter dropped groups ...
    assert len({r["rollout/samples"] for r in rows_a} | {24}) > 1  # ... and some rollout trained on fewer than 6 x 4
    compared = 0
    for x, y in zip(rows_a, rows_b):
        assert y["step"] == x["step"] and y["rollout/samples"] == x["rollout/samples"]
        for key, value in x.items():
            if key.startswith(("train/", "check/")) and key != "check/stale_samples":
                assert y[key] == value, (x["rollout_id"], key, value, y[key])  # exact: same fp32 computation
                compared += 1
    assert compared > 20
    assert not (b / "tasks/0/logs/engines").exists() or not list((b / "tasks/0/logs/engines").iterdir())
    assert (b / "tasks/0/final_model/model.safetensors").is_file()


def test_a_saved_its_trainers_log_probs_beside_each_rollout_and_the_report_shows_them(run_a, tmp_path):
    pytest.importorskip("matplotlib")  # the report's figures
    from slime.cli.report import write_report
    from slime.runtime.rollout.saved import read_rollout, trainer_log_probs

    task = run_a / "tasks/0"
    saved = task / "rollouts"
    # one data-parallel rank here: one sidecar per rollout, every trained sample in it
    assert sorted(p.name for p in saved.glob("trainer_*")) == [f"trainer_{r:06d}.r0.parquet" for r in range(ROLLOUTS)]
    for row in metrics(run_a)[1:]:
        samples = read_rollout(saved, row["rollout_id"])
        trainer = trainer_log_probs(saved, row["rollout_id"], samples)
        assert all(t is not None for t in trainer) and len(samples) == row["rollout/samples"]
        # the values the run compared with the engine's (train/logprob_diff[_max], before this rollout's
        # update): the same mean and max |trainer - engine| over the trained tokens; relative tolerance (fp32
        # rounding), as an absolute one as large as these differences would pass a sidecar equal to the engine
        diffs = [
            abs(t - e)
            for s, lps in zip(samples, trainer)
            for t, e, m in zip(lps, s.rollout_log_probs, s.loss_mask)
            if m
        ]
        assert sum(diffs) / len(diffs) == pytest.approx(row["train/logprob_diff"], rel=1e-4, abs=1e-12)
        assert max(diffs) == pytest.approx(row["train/logprob_diff_max"], rel=1e-4, abs=1e-12)
    # the report's rollout viewer: engine vs trainer per token, for every embedded sample
    page = write_report([run_a], tmp_path / "report.html").read_text()
    blocks = dict(re.findall(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.S))
    assert json.loads(blocks["rv-meta"])["sources"][0]["trainer_lp"] is True
    shown = [d for k, v in blocks.items() if k.startswith("rv-chunk-") for d in json.loads(v)]
    assert len(shown) == sum(r["rollout/samples"] for r in metrics(run_a)[1:])
    assert all(d["tlp"] is not None and len(d["dlp"]) == len(d["lp"]) == len(d["ids"]) for d in shown)


def test_two_data_parallel_ranks_each_save_their_own_samples(tmp_path):
    import pyarrow.parquet as pq

    from slime.runtime.rollout.saved import read_rollout, trainer_log_probs

    two_ranks = ("cluster.gpus_per_node=2", "cluster.fake_gpus=true", "rollout.colocate=true")
    d = run(tmp_path, "dp2", "debug.save_rollouts=true", "rollout.num_rollouts=1", *two_ranks)
    saved = d / "tasks/0/rollouts"
    names = sorted(p.name for p in saved.glob("trainer_*"))
    assert names == ["trainer_000000.r0.parquet", "trainer_000000.r1.parquet"]  # one per data-parallel rank
    samples = read_rollout(saved, 0)
    assert all(t is not None for t in trainer_log_probs(saved, 0, samples))
    rows = [pq.read_table(saved / name, columns=["row"]).column("row").to_pylist() for name in names]
    assert rows[0] and rows[1] and sorted(rows[0] + rows[1]) == list(range(len(samples)))  # each its own


def test_rollout_only_generates_what_a_generated_first_without_training(run_a, tmp_path):
    import pyarrow.parquet as pq

    c = run(tmp_path, "c", "debug.mode=rollout_only", "debug.save_rollouts=true")
    rows = metrics(c)[1:]
    assert [r["rollout_id"] for r in rows] == list(range(ROLLOUTS))
    assert not [k for r in rows for k in r if k.startswith("train/")]
    assert all(r["weight_version"] == 0 and r["rollout/weight_version"] == 0 for r in rows)
    first_a = pq.read_table(run_a / "tasks/0/rollouts/rollout_000000.parquet").to_pylist()
    first_c = pq.read_table(c / "tasks/0/rollouts/rollout_000000.parquet").to_pylist()
    assert len(first_c) == len(first_a) > 0
    for x, y in zip(first_a, first_c):  # same prompts, tokens, rewards, groups, masks, versions
        lp_a, lp_c = x.pop("rollout_log_probs"), y.pop("rollout_log_probs")
        assert y == x
        # the engine's log-probs agree to float rounding: its batch shapes depend on when requests arrive
        assert lp_c == pytest.approx(lp_a, abs=1e-5)
    assert not list((c / "tasks/0").glob("checkpoints/*/actor-rank*.pt"))  # no trainer ranks: no rank state
    state = json.loads((c / "tasks/0/state.json").read_text())
    assert state["state"] == "succeeded"
