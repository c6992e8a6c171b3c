"""``kind: SFTJob`` end to end on the embedded default: ``specs/sft.yaml`` (scaled down) lowers its held-out
loss, and a run stopped after a checkpoint resumes exactly: the same transcripts, losses, evals and final
step as a run that was never stopped (``extended``: CI's smoke of specs/sft.yaml stops and resumes too).

Real parts only: the local launcher's dry run and run dir, ``python -m slime.train`` subprocesses with their
own Ray, the built-in engine serving the held-out generations, torch training of the tiny model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.launcher import LocalLauncher
from slime.runtime.driver import STOP_AFTER_ENV
from slime.spec import load_spec
from tests.fixtures.quickstart import metrics, train_env

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "specs" / "sft.yaml"
OVERRIDES = [
    "rollout.epochs=null",
    "rollout.num_rollouts=4",
    "rollout.batch_size=32",
    "train.global_batch_size=16",  # two optimizer steps per rollout
    "train.micro_batch_size=16",
    "train.optimizer.warmup_steps=2",
    "train.checkpoint.interval=100",
    "data.eval[0].interval=2",
    "data.eval[0].max_prompts=16",
    "data.eval[1].interval=2",
    "data.eval[1].max_prompts=16",
    "logging.progress=false",
]


def _run(parent: Path, name: str, *, stop_after: int | None = None) -> tuple[Path, subprocess.CompletedProcess]:
    loaded = load_spec(SFT, overrides=[*OVERRIDES, f"logging.dir={parent}"])
    run = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name=name)).request).root
    env = train_env("disabled")
    if stop_after is not None:
        env[STOP_AFTER_ENV] = str(stop_after)
    cmd = [sys.executable, "-m", "slime.train", str(run)]
    return run, subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run, done = _run(tmp_path_factory.mktemp("runs"), "straight")
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def test_an_sft_job_trains_the_assistant_turns_and_lowers_the_held_out_loss(straight):
    rows = metrics(straight)
    first, last = rows[0], rows[-1]
    assert first["rollout_id"] == -1 and last["rollout_id"] == 3 and last["step"] == 8
    for name in ("heldout", "sum"):
        assert last[f"eval/{name}/loss"] < first[f"eval/{name}/loss"] - 0.5, (first, last)
    assert all(r["train/tokens"] > 0 and r["train/sft_loss"] > 0 for r in rows[1:])
    lrs = [r["train/lr"] for r in rows[1:]]  # the spec's cosine schedule, not the warm-up's constant lr
    assert lrs == sorted(lrs, reverse=True) and lrs[0] > lrs[-1], lrs
    summary = json.loads((straight / "tasks" / "0" / "summary.json").read_text())
    assert summary["eval/loss_initial"] == first["eval/loss"] and summary["eval/loss"] == last["eval/loss"]
    assert (straight / "tasks" / "0" / "final_model" / "config.json").is_file()


@pytest.mark.extended  # two more runs; CI's smoke of specs/sft.yaml stops and resumes one too
def test_a_stopped_sft_job_resumes_exactly(straight, tmp_path):
    run, stopped = _run(tmp_path, "resumed", stop_after=1)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    _, resumed = _run_again(run)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert _comparable(metrics(run)) == _comparable(metrics(straight))


def _run_again(run: Path) -> tuple[Path, subprocess.CompletedProcess]:
    cmd = [sys.executable, "-m", "slime.train", str(run)]
    env = train_env("disabled")
    return run, subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
