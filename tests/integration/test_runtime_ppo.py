"""PPO through the driver on a private local Ray: a critic group on the actor's slot, a frozen reference
(``model.ref_path: initial`` = the policy after the SFT warm-up) and a KL penalty in the reward.

Checks what only a whole run shows: KL to the reference is exactly 0 before the first update and grows
after it, the critic trains (value loss reported per rollout), and the run completes with its outputs.
The first rollouts are a critic-only warm-up: the actor's checkpointed weights equal the warmed-up
policy bit for bit and its optimizer holds no state until the warm-up ends.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.fixtures.quickstart import compile_run, final_json, metrics, train

pytestmark = pytest.mark.timeout(400)
ROLLOUTS = 4
CRITIC_ONLY = 2


def _ckpt(run, r: int, role: str) -> dict:
    import torch

    return torch.load(run / f"tasks/0/checkpoints/{r}/{role}-rank0.pt", weights_only=False)


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
        f"algorithm.critic.warmup_rollouts={CRITIC_ONLY}",
        "train.checkpoint.interval=1",
        f"train.checkpoint.keep={ROLLOUTS}",
        "data.eval=[]",
        "logging.progress=false",
    ]
    run = compile_run(tmp_path, "ppo", overrides)
    done = train(run, "--json", wandb="disabled", timeout=360)
    assert done.returncode == 0, done.stderr[-4000:]
    final = final_json(done.stdout)["final_metrics"]
    assert final["check/step0_ref_kl"] == 0.0 and 0.0 <= final["check/step0_kl"] < 1e-6
    rows = metrics(run)
    steps = rows[1:]
    assert len(steps) == ROLLOUTS
    assert steps[-1]["train/ref_kl"] > 0.0  # the policy moved away from the frozen reference
    for r in steps:
        assert r["critic/value_loss"] >= 0 and r["critic/grad_norm"] > 0 and r["train/logprob_diff"] <= 1e-3
    _critic_only_warmup_left_the_actor_alone(run, steps)
    state = json.loads((run / "tasks/0/state.json").read_text())
    assert [w["role"] for w in state["ranks"]] == ["actor", "critic"]
    assert (run / "tasks/0/ref_model/model.safetensors").is_file()
    assert {p.name for p in (run / "tasks/0/checkpoints" / str(ROLLOUTS - 1)).iterdir()} == {
        "actor-rank0.pt",
        "critic-rank0.pt",
        "state.json",
    }


def _critic_only_warmup_left_the_actor_alone(run, steps: list[dict]) -> None:
    import torch
    from safetensors.torch import load_file

    assert [r["train/critic_only"] for r in steps] == [1.0] * CRITIC_ONLY + [0.0] * (ROLLOUTS - CRITIC_ONLY)
    v = steps[0]["weight_version"]  # the engines serve the warmed-up policy; no sync while the actor waits
    assert [r["weight_version"] for r in steps] == [v] * CRITIC_ONLY + [v + i for i in range(1, ROLLOUTS - 1)]
    assert all("train/pg_loss" not in r for r in steps[:CRITIC_ONLY])
    assert all("train/pg_loss" in r for r in steps[CRITIC_ONLY:])
    warmed = load_file(run / "tasks/0/ref_model/model.safetensors")  # the policy when RL began
    for r in range(ROLLOUTS):
        actor, critic = _ckpt(run, r, "actor"), _ckpt(run, r, "critic")
        same = all(torch.equal(actor["model"][k], v) for k, v in warmed.items())
        assert set(warmed) <= set(actor["model"])
        assert critic["optimizer"]["state"], f"rollout {r}: the critic never stepped"
        if r < CRITIC_ONLY:
            assert same and actor["optimizer"]["state"] == {}, f"rollout {r}: the actor moved during the warm-up"
        else:
            assert not same and actor["optimizer"]["state"], f"rollout {r}: the actor did not train"
