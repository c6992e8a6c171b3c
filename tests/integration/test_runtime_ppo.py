"""PPO through the driver on a private local Ray: a critic group on the actor's slot, a frozen reference
(``model.ref_path: initial`` = the policy after the SFT warm-up) and a KL penalty in the reward.

Checks what only a whole run shows: KL to the reference is exactly 0 before the first update and grows
after it, the critic trains (value loss reported per rollout), and the run completes with its outputs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from launchers.base import SubmitOptions, create_run_dir
from launchers.local.launcher import LocalLauncher
from slime.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(400)
ROLLOUTS = 4


def test_ppo_with_critic_reference_and_kl_penalty(tmp_path):
    overrides = [
        f"rollout.num_rollouts={ROLLOUTS}",
        "rollout.batch_size=8",
        "train.global_batch_size=64",
        "train.micro_batch_size=64",
        "algorithm.sft_warmup_steps=60",
        "algorithm.estimator=ppo",
        "model.ref_path=initial",
        "algorithm.kl_coef=0.05",
        "algorithm.lambda=0.95",
        "algorithm.critic.lr=1e-4",
        "data.eval=[]",
        "logging.progress=false",
        f"logging.dir={tmp_path}",
    ]
    loaded = load_spec(REPO / "specs" / "quickstart.yaml", overrides=overrides)
    run = create_run_dir(LocalLauncher().dryrun(loaded, SubmitOptions(run_name="ppo")).request).root
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["WANDB_MODE"] = "disabled"
    done = subprocess.run(
        [sys.executable, "-m", "slime.train", str(run), "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    final = json.loads(done.stdout[done.stdout.index("{") :])["final_metrics"]
    assert final["check/step0_ref_kl"] == 0.0 and abs(final["check/step0_kl"]) < 1e-6
    rows = [json.loads(line) for line in (run / "tasks/0/metrics.jsonl").read_text().splitlines()]
    steps = rows[1:]
    assert len(steps) == ROLLOUTS
    assert steps[-1]["train/ref_kl"] > 0.0  # the policy moved away from the frozen reference
    for r in steps:
        assert r["critic/value_loss"] >= 0 and r["critic/grad_norm"] > 0 and r["train/logprob_diff"] <= 1e-3
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert [w["role"] for w in state["ranks"]] == ["actor", "critic"]
    assert (run / "tasks/0/ref_model/model.safetensors").is_file()
    assert {p.name for p in (run / "tasks/0/checkpoints" / str(ROLLOUTS - 1)).iterdir()} == {
        "actor-rank0.pt",
        "critic-rank0.pt",
        "state.json",
    }
