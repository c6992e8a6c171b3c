"""A variable sample count per rollout: uneven shards over two real gloo ranks take the one-process step.

Two ``TrainerRank`` processes (the runtime's rank body: collate, old log-probs, advantages with moments
all-reduced over the ranks, the backend's optimizer steps) train on the shards of a ``StepPlan`` of an
odd number of samples in uneven groups; one ``TrainerRank`` in this process trains on all of them with
the same step boundaries. Their per-step losses and gradient norms, final gradients and parameters must
agree (fp32 CPU: the differences are float summation order only).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from msgspec.structs import replace  # noqa: E402

from slime.models.tiny import build_tiny_model  # noqa: E402
from slime.runtime.step_plan import plan_steps  # noqa: E402
from slime.runtime.train_data import sequence_scores  # noqa: E402
from slime.runtime.trainer_group import TrainerRank  # noqa: E402
from slime.spec import load_spec  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)
N = 11  # samples: groups of 4, 4 and 3 (a rollout after filtering / partial rollout / forked episodes)
TARGET = 5  # train.global_batch_size: 11 / 5 -> 2 steps of 6 and 5 samples; per rank 3+3 and 3+2


def configs() -> dict[str, dict]:
    return {
        "grpo_token_mean": {"estimator": "grpo", "loss_agg": "token_mean", "tokens": False},
        "rpp_whitened_seq_mean": {
            "estimator": "reinforce_plus_plus",
            "loss_agg": "seq_mean_token_mean",
            "tokens": False,
        },
        "grpo_by_tokens_dynamic": {"estimator": "grpo", "loss_agg": "token_mean", "tokens": True},
    }


def make_spec(cfg: dict):
    s = load_spec(REPO / "specs" / "quickstart.yaml").spec
    train = replace(s.train, micro_batch_size=2, optimizer=replace(s.train.optimizer, clip_grad=0.0))
    if cfg["tokens"]:
        train = replace(train, dynamic_batch=replace(train.dynamic_batch, enabled=True, max_tokens_per_gpu=24))
    return replace(
        s,
        train=train,
        algorithm=replace(s.algorithm, estimator=cfg["estimator"], loss_agg=cfg["loss_agg"], normalize_std=True),
    )


def rollout(cfg: dict) -> tuple[list[dict], list[float], object]:
    """The samples (what ``train_inputs`` gives a rank), their sequence scores and the step plan."""
    g = torch.Generator().manual_seed(11)
    inputs, rewards, groups = [], [], []
    for i in range(N):
        p, r = int(torch.randint(3, 7, (1,), generator=g)), int(torch.randint(1, 6, (1,), generator=g))
        mask = [1] * r
        if r >= 3 and i % 3 == 0:
            mask[1] = 0
        inputs.append(
            {"tokens": torch.randint(5, 90, (p + r,), generator=g).tolist(), "response_length": r, "loss_mask": mask}
        )
        rewards.append(float(torch.rand(1, generator=g) > 0.5))
        groups.append(min(i // 4, 2))
    scores = sequence_scores(rewards, estimator=cfg["estimator"], normalize_std=True, group_ids=groups)
    lengths = [len(x["tokens"]) for x in inputs]
    return inputs, scores, lengths


def run_rank(cfg: dict, model_dir: str, rank: int, world: int, port: int) -> dict:
    torch.set_num_threads(1)
    inputs, scores, lengths = rollout(cfg)
    plan = plan_steps(lengths, dp_size=world, target=TARGET, balance_tokens=cfg["tokens"])
    r = TrainerRank(make_spec(cfg), "actor", rank, world, threads=1, gpu_slot=False)
    r.init("127.0.0.1", port, model_dir)
    prep, _ = r.prepare(plan.take(inputs, rank), plan.take(scores, rank))
    steps = r.train(plan.sizes(rank), 0)
    model = r.backend.model
    return {
        "sizes": plan.sizes(rank),
        "prepare": {k: v for k, v in prep.items() if not k.startswith("time/")},
        "steps": [{k: m[k] for k in ("loss", "pg_loss", "grad_norm")} for m in steps],
        "grads": {k: p.grad.flatten()[:64].tolist() for k, p in model.named_parameters()},
        "params": {k: v.flatten()[:64].tolist() for k, v in model.state_dict().items()},
    }


_RANK_SCRIPT = r"""
import json, sys
sys.path.insert(0, {repo!r})
sys.path.insert(0, {here!r})
from test_runtime_variable_batch import configs, run_rank
from tests.fixtures.ranks import end_group
rank, port, model_dir, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
result = {{}}
for i, (name, cfg) in enumerate(configs().items()):
    result[name] = run_rank(cfg, model_dir, rank, 2, port + i)
    end_group()
json.dump(result, open(out, "w"))
"""


def _free_ports(n: int) -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n < 65535:
            return base


def test_uneven_shards_on_two_gloo_ranks_take_the_one_process_step(tmp_path):
    model_dir = build_tiny_model(tmp_path / "small", seed=3, hidden=32, layers=2, heads=2, kv_heads=1)
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT.format(repo=str(REPO), here=str(Path(__file__).parent)))
    port = _free_ports(len(configs()))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(port), str(model_dir), str(tmp_path / f"r{r}.json")],
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    for name, cfg in configs().items():
        sizes = [r[name]["sizes"] for r in ranks]
        if not cfg["tokens"]:
            assert sizes == [[3, 3], [3, 2]], sizes  # uneven shards: the point of the test
        assert sum(map(sum, sizes)) == N and sizes[0] != sizes[1]
        single = run_rank(cfg, str(model_dir), 0, 1, 0)
        assert [sum(s) for s in zip(*sizes)] == single["sizes"] == [6, 5]  # same step boundaries
        for r in ranks:
            mine = r[name]
            for key, want in single["prepare"].items():
                assert mine["prepare"][key] == pytest.approx(want, rel=1e-5, abs=1e-7), (name, key)
            for got, want in zip(mine["steps"], single["steps"]):
                for key in want:
                    assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (name, key)
            for k, want in single["grads"].items():
                got = torch.tensor(mine["grads"][k])
                assert torch.allclose(got, torch.tensor(want), atol=1e-7, rtol=1e-4), (name, k)
            for k, want in single["params"].items():
                assert torch.allclose(torch.tensor(mine["params"][k]), torch.tensor(want), atol=2e-6, rtol=1e-5)
