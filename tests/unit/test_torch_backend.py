"""The torch train backend on the built-in tiny model: parity with the engine, KL at step 0, the critic's
temperature rule, data-parallel gradients over two real gloo processes, micro-batching, save/load, export.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from slime.backends.base import TrainBatch  # noqa: E402
from slime.rl.kl import compute_kl  # noqa: E402
from slime.runtime.train_data import collate  # noqa: E402
from tests.fixtures.ranks import spawn_ranks  # noqa: E402
from tests.fixtures.torch_backend import backend, make_spec, params_of, rl_batch, samples, small_model  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def model_dir(tiny_model):
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def small_dir(tiny_model):
    return small_model(tiny_model)


# ------------------------------------------------------------------ correctness signals
def test_logprobs_match_the_engine_within_1e3(model_dir):
    from slime.backends.rollout.builtin.generator import Engine
    from slime.backends.rollout.builtin.sampling import SamplingParams

    spec = make_spec(rollout={"temperature": 0.7})
    be = backend(spec, model_dir)
    engine = Engine(model_dir, seed=0, max_running_requests=16)
    prompts = [[5 + i, 12, 77, 6 + i, 7, 85] for i in range(12)]
    done = engine.generate(prompts, SamplingParams(max_new_tokens=6, temperature=0.7, ignore_eos=True))
    data = [
        {"tokens": p + c.output_ids, "response_length": len(c.output_ids), "rollout_log_probs": c.logprobs}
        for p, c in zip(prompts, done)
    ]
    batch = collate(data)
    mine = be.log_probs(batch, temperature=0.7)
    m = batch.response_mask.bool()
    diff = (mine - batch.rollout_log_probs).abs()[m]
    assert diff.numel() == 12 * 6
    assert float(diff.max()) <= 1e-3, float(diff.max())
    # Wrong temperature must be visible: the check is sensitive to the scaling.
    wrong = (be.log_probs(batch, temperature=1.0) - batch.rollout_log_probs).abs()[m]
    assert float(wrong.mean()) > 1e-2


def test_kl_is_zero_before_the_first_update(model_dir):
    spec = make_spec(algorithm={"kl_loss_coef": 0.1}, model={"ref_path": "initial"})
    actor, ref = backend(spec, model_dir), backend(spec, model_dir, role="ref")
    data = samples(8)
    batch = rl_batch(actor, data)
    batch.ref_log_probs = ref.log_probs(batch, temperature=1.0)
    m = batch.response_mask.bool()
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        assert float(compute_kl(batch.old_log_probs, batch.ref_log_probs, kind)[m].abs().max()) == 0.0
    metrics = actor.train_step(batch, step=0)
    assert abs(metrics["approx_kl"]) < 1e-7 and abs(metrics["kl_loss"]) < 1e-7
    assert abs(metrics["ratio_mean"] - 1.0) < 1e-6
    # After the update the policy moved away from the reference.
    after = actor.log_probs(batch, temperature=1.0)
    assert float(compute_kl(after, batch.ref_log_probs, "k3")[m].mean()) > 1e-8


def test_critic_values_are_never_divided_by_the_temperature(model_dir):
    """W22: values must not be temperature-scaled. With T = 2.5 a scaled critic is off by 2.5x."""
    from slime.runtime.trainer_group import TrainerRank

    spec = make_spec(rollout={"temperature": 2.5}, algorithm={"estimator": "ppo", "kl_coef": 0.0})
    critic = backend(spec, model_dir, role="critic")
    with torch.no_grad():
        torch.manual_seed(0)
        critic.model.value_head.weight.normal_(0, 0.5)
        critic.model.value_head.bias.fill_(0.3)
    data = samples(6)
    batch = collate(data)
    got = critic.values(batch)
    with torch.no_grad():
        hidden = critic.model.backbone(input_ids=batch.tokens, attention_mask=batch.attention_mask).last_hidden_state
        expected = critic.model.value_head(hidden).squeeze(-1)[:, :-1]
    valid = batch.attention_mask[:, 1:].bool()
    assert torch.allclose(got[valid], expected[valid], atol=1e-5)
    assert not torch.allclose(got[valid], expected[valid] / 2.5, atol=1e-3)
    # The runtime's path (a critic rank, built as the runtime builds it) hands the same unscaled values to GAE,
    # and keeps them with the batch as the old values of the critic's own steps.
    rank = TrainerRank(spec, "critic", 0, 1, threads=torch.get_num_threads(), gpu_slot=False)
    with pytest.raises(RuntimeError, match="train_critic\\(\\) called before values\\(\\)"):
        rank.train_critic(torch.zeros_like(got), 1, 0)
    rank.init("127.0.0.1", 0, str(model_dir))
    rank.backend.model.load_state_dict(critic.model.state_dict())
    assert torch.equal(rank.values(data), got)
    (m,) = rank.train_critic(torch.ones_like(got), 1, 0)  # returns of 1 against values near 0.3: a real loss
    assert m["value_loss"] > 0.1 and rank.batch is None


# ------------------------------------------------------------------ data parallel
_RANK_SCRIPT = r"""
import json, sys, torch
from msgspec.structs import replace
sys.path.insert(0, {repo!r})
sys.path.insert(0, {here!r})
from tests.fixtures.torch_backend import make_spec, samples, rl_batch, backend
from test_torch_backend import configs
from slime.backends.base import RankInfo
rank, port, model_dir, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
info = RankInfo(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port, device="cpu")
result = {{}}
for name, spec in configs().items():
    be = backend(spec, model_dir, rank=info)
    data = samples(12, seed=5)
    full = rl_batch(backend(spec, model_dir), data)  # old log-probs / advantages of the whole batch
    half = full.select(slice(rank * 6, rank * 6 + 6))
    m = be.train_step(half, step=0)
    params = {{k: v.flatten()[:64].tolist() for k, v in be.model.state_dict().items()}}
    grads = {{k: p.grad.flatten()[:64].tolist() for k, p in be.model.named_parameters()}}
    result[name] = {{"metrics": m, "params": params, "grads": grads}}
json.dump(result, open(out, "w"))
"""


def configs():
    return {
        "token_mean": make_spec(train={"micro_batch_size": 2, "optimizer": {"clip_grad": 0.0}}),
        "seq_mean_dynamic": make_spec(
            train={"micro_batch_size": 4, "dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 20}},
            algorithm={"loss_agg": "seq_mean_token_mean"},
        ),
    }


def test_two_gloo_ranks_take_the_same_step_as_one_process(small_dir, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT.format(repo=str(REPO), here=str(Path(__file__).parent)))
    spawn_ranks(
        lambda r, port: [sys.executable, str(script), str(r), str(port), str(small_dir), str(tmp_path / f"r{r}.json")],
        2,
        timeout=150,
    )
    ranks = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in (0, 1)]
    for name, spec in configs().items():
        single = backend(spec, small_dir)
        batch = rl_batch(backend(spec, small_dir), samples(12, seed=5))
        m = single.train_step(batch, step=0)
        # the all-reduced gradients (after the same global-norm clip) equal the one-process gradients ...
        for k, p in single.model.named_parameters():
            want = p.grad.flatten()[:64]
            for r in ranks:
                got = torch.tensor(r[name]["grads"][k])
                assert torch.allclose(got, want, atol=1e-7, rtol=1e-4), (name, k, float((got - want).abs().max()))
        # ... and so do the parameters after the optimizer step
        for k, v in single.model.state_dict().items():
            want = v.flatten()[:64]
            for r in ranks:
                got = torch.tensor(r[name]["params"][k])
                assert torch.allclose(got, want, atol=2e-6, rtol=1e-5), (name, k)
        for r in ranks:
            assert r[name]["metrics"]["loss"] == pytest.approx(m["loss"], rel=1e-4, abs=1e-6), name
            assert r[name]["metrics"]["grad_norm"] == pytest.approx(m["grad_norm"], rel=1e-4), name


# ------------------------------------------------------------------ micro-batching, losses, state
@pytest.mark.parametrize(
    "train",
    [{"micro_batch_size": 1}, {"micro_batch_size": 3}, {"dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 16}}],
)
def test_micro_batching_does_not_change_the_step(small_dir, train):
    whole = make_spec(train={"micro_batch_size": 64})
    split = make_spec(train=train)
    data = samples(10, seed=2)
    a, b = backend(whole, small_dir), backend(split, small_dir)
    ma = a.train_step(rl_batch(a, data), step=0)
    mb = b.train_step(rl_batch(b, data), step=0)
    assert mb["loss"] == pytest.approx(ma["loss"], rel=1e-5, abs=1e-7)
    for (k, va), vb in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.allclose(va, vb, atol=1e-6), k


@pytest.mark.parametrize(
    "algorithm",
    [
        {"estimator": "grpo", "entropy_coef": 0.01, "dual_clip_c": 3.0},
        {"estimator": "gspo"},
        {"estimator": "cispo"},
        {"estimator": "reinforce_plus_plus"},
        {"estimator": "reinforce_plus_plus_baseline", "kl_loss_coef": 0.05, "kl_loss_type": "k2"},
        {"estimator": "ppo"},
    ],
)
def test_every_estimator_takes_a_finite_step(small_dir, algorithm):
    spec = make_spec(algorithm=algorithm, model={"ref_path": "initial"})
    be = backend(spec, small_dir)
    before = params_of(be.model)
    batch = rl_batch(be, samples(8, seed=4))
    batch.ref_log_probs = batch.old_log_probs.clone()
    m = be.train_step(batch, step=0)
    assert all(v == v and abs(v) < 1e6 for v in m.values()), m
    assert m["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in be.model.state_dict().items())
    if algorithm.get("entropy_coef"):
        assert m["entropy"] > 0
    if algorithm.get("dual_clip_c"):
        assert "dual_clipfrac" in m


def test_tis_weights_scale_the_policy_loss_through_micro_batches(small_dir):
    """A batch's ``tis_weights`` reach every micro-batch's loss: weights of 2 double the policy loss and the
    update direction is the same as with weights of 1 (Adam normalises the step, so compare losses)."""
    spec = make_spec(train={"micro_batch_size": 3})
    data = samples(8, seed=5)
    plain, weighted = backend(spec, small_dir), backend(spec, small_dir)
    b1, b2 = rl_batch(plain, data), rl_batch(weighted, data)
    b2.tis_weights = torch.full_like(b2.response_mask, 2.0)
    m1, m2 = plain.train_step(b1, step=0), weighted.train_step(b2, step=0)
    assert m1["pg_loss"] != 0
    assert m2["pg_loss"] == pytest.approx(2 * m1["pg_loss"], rel=1e-5)
    assert m2["grad_norm"] == pytest.approx(2 * m1["grad_norm"], rel=1e-4)


def test_critic_step_fits_returns(small_dir):
    from slime.spec.types import Critic

    spec = make_spec(algorithm={"estimator": "ppo", "critic": Critic(lr=3e-3, value_clip=0.5)})
    critic = backend(spec, small_dir, role="critic")
    batch = collate(samples(8, seed=6))
    batch.returns = torch.full_like(batch.response_mask, 0.7) * batch.response_mask
    losses = []
    for step in range(15):
        batch.old_values = critic.values(batch)
        losses.append(critic.train_step(batch, step=step)["value_loss"])
    assert losses[-1] < 0.5 * losses[0]


def test_sft_steps_lower_the_loss_with_their_own_optimizer(small_dir):
    spec = make_spec()
    be = backend(spec, small_dir)
    batch = collate(samples(8, seed=7), kind="sft")
    losses = [be.train_step(batch, step=i)["sft_loss"] for i in range(8)]
    assert losses[-1] < losses[0]
    assert be.sft_optimizer is not None and not be.optimizer.state  # the RL optimizer is untouched


def test_save_load_round_trip_continues_exactly(small_dir, tmp_path):
    spec = make_spec()
    be = backend(spec, small_dir)
    data = samples(8, seed=8)
    be.train_step(rl_batch(be, data, seed=1), step=0)
    be.save(tmp_path)
    be.train_step(rl_batch(be, data, seed=2), step=1)
    expected = params_of(be.model)
    again = backend(spec, small_dir)
    again.load(tmp_path)
    again.train_step(rl_batch(again, data, seed=2), step=1)
    for k, v in again.model.state_dict().items():
        assert torch.equal(v, expected[k]), k


@pytest.mark.parametrize(
    "cut", [lambda b: b"", lambda b: b[: len(b) // 2], lambda b: b[:-10]], ids=["empty", "half", "tail"]
)
def test_loading_a_truncated_checkpoint_file_is_a_checkpoint_error_naming_it(small_dir, tmp_path, cut):
    from slime.core.errors import ExitCode
    from slime.runtime.checkpoint import CheckpointError
    from slime.runtime.failures import classify

    spec = make_spec()
    be = backend(spec, small_dir)
    be.save(tmp_path)
    path = tmp_path / "actor-rank0.pt"
    data = path.read_bytes()
    path.write_bytes(cut(data))  # torch raises EOFError, RuntimeError and OSError for these
    with pytest.raises(CheckpointError, match="truncated, corrupted or unreadable") as info:
        backend(spec, small_dir).load(tmp_path)
    assert f"cannot load {path}" in str(info.value) and classify(info.value) == ExitCode.SPEC


def test_exported_weights_load_into_the_engine(model_dir, tmp_path):
    from slime.backends.rollout.builtin.generator import Engine
    from slime.backends.rollout.builtin.sampling import SamplingParams

    spec = make_spec()
    be = backend(spec, model_dir)
    data = samples(8, seed=9)
    for step in range(3):
        be.train_step(rl_batch(be, data, seed=step), step=step)
    out = be.export_weights(tmp_path / "v1")
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    engine = Engine(model_dir, seed=0, max_running_requests=8)
    fut = engine.update_weights_from_disk(str(out), weight_version="1")
    while not fut.done():
        engine.step()
    assert fut.result()[0], fut.result()
    prompts = [d["tokens"][:4] for d in data]
    done = engine.generate(prompts, SamplingParams(max_new_tokens=4, temperature=1.0, ignore_eos=True))
    assert {c.weight_version for c in done} == {"1"}
    batch = collate(
        [
            {"tokens": p + c.output_ids, "response_length": 4, "rollout_log_probs": c.logprobs}
            for p, c in zip(prompts, done)
        ]
    )
    diff = (be.log_probs(batch, temperature=1.0) - batch.rollout_log_probs).abs()[batch.response_mask.bool()]
    assert float(diff.max()) <= 1e-3


def test_train_batch_select_keeps_every_field():
    b = collate(samples(4, seed=1))
    b.advantages = torch.ones_like(b.response_mask)
    sub = b.select(slice(1, 3))
    assert isinstance(sub, TrainBatch) and sub.size == 2 and sub.advantages.shape[0] == 2
    assert torch.equal(sub.tokens, b.tokens[1:3])
