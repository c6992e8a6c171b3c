"""Spec fields whose effect no other test showed (found by the field-coverage audit, tests/fixtures/field_coverage.py):
each test changes the field and watches what reads it change — or, for a combination nothing honours,
the rule that refuses it (message asserted, and the passing variant).

Real parts: the spec loader, the launchers' pure functions, the torch backend on a tiny model, the
reward factory. One stand-in: W&B's ``wandb.init`` is replaced by a recorder (W&B's own offline files
are a binary log); what is checked is what slime-submit hands to it.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest
from msgspec.structs import replace

from slime.core.paths import TaskPaths
from slime.spec import load_spec
from tests.fixtures.spec_helpers import CPU_SPEC, GPU_SPEC, errors_at, load, problems, spec

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "specs" / "quickstart.yaml"
C, G = CPU_SPEC, GPU_SPEC


def _quickstart(**sets: str):
    return load_spec(QUICKSTART, overrides=[f"{k}={v}" for k, v in sets.items()]).spec


# ----------------------------------------------------------------------------- where the job runs
def test_the_job_name_names_the_run_dir(tmp_path):
    from launchers.base import SubmitOptions, default_run_dir

    loaded = load(spec(C, **{"name": "my-job", "logging.dir": str(tmp_path / "runs")}))
    run_dir = default_run_dir(loaded, SubmitOptions())
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("my-job-")


@pytest.mark.parametrize("launcher", ["local", "slurm"])
def test_the_launcher_is_the_one_named(launcher):
    from slime.cli.commands import _dryrun

    args = argparse.Namespace(spec=str(QUICKSTART), overrides=[f"cluster.launcher={launcher}"])
    _, chosen, dry = _dryrun(args, preview=True)
    assert chosen.name == launcher and dry.request.launcher == launcher


def test_env_and_secrets_reach_a_local_job(tmp_path, monkeypatch):
    from launchers.local.launcher import job_env

    (tmp_path / "token").write_text("from-a-file\nsecond line\n")
    monkeypatch.setenv("SMOKE_TEST_SECRET", "from-the-env")
    s = load(
        spec(
            C,
            **{
                "cluster.env": {"PLAIN": "1"},
                "cluster.secrets": {
                    "A_KEY": {"env": "SMOKE_TEST_SECRET"},
                    "B_TOKEN": {"file": str(tmp_path / "token")},
                },
            },
        )
    ).spec
    env = job_env(s)
    assert (env["PLAIN"], env["A_KEY"], env["B_TOKEN"]) == ("1", "from-the-env", "from-a-file")


_SLURM_SECTION = ("cluster.slurm", "holds settings of the slurm launcher, but cluster.launcher is 'local'")


@pytest.mark.parametrize(
    ("edit", "path", "words", "hint"),
    [
        *(
            ({f"cluster.slurm.{name}": value}, *_SLURM_SECTION, "cluster.launcher: slurm")
            for name, value in [
                ("time_limit", "01:00:00"),
                ("mem", "4G"),
                ("account", "proj"),
                ("qos", "high"),
                ("constraint", "h100"),
                ("reservation", "maint"),
                ("exclude", ["n1"]),
                ("on_preflight_failure", "requeue_excluding"),
                ("max_requeues", 2),
                ("max_failures", 1),
                ("signal_grace_s", 60),
            ]
        ),
        (
            {"cluster.slurm.depends_on": [{"job": "123", "when": "any"}]},
            "cluster.slurm.depends_on",
            "cannot wait for another job",
            "`slime-submit chain A.yaml B.yaml`",
        ),
        (
            {"sweep": {"grid": {"train.seed": [1, 2]}, "max_parallel": 2}},
            "sweep.max_parallel",
            "runs sweep tasks one after another",
            "a launcher for a cluster (cluster.launcher)",
        ),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, dict) else "",
)
def test_the_local_launcher_refuses_what_only_slurm_does(edit, path, words, hint):
    """SLURM's settings are the slurm launcher's section (cluster.slurm): the local launcher refuses the
    section, and runs sweep tasks one at a time. Each is accepted with launcher: slurm."""
    (p,) = errors_at(problems(spec(C, **edit)), path)
    assert words in p.message and hint in p.hint
    assert not errors_at(problems(spec(C, **{**edit, "cluster.launcher": "slurm"})), path)


# ----------------------------------------------------------------------------- the model and trainer
def test_the_model_comes_from_model_path_or_the_builtin(tmp_path):
    from slime.runtime.job import model_dir

    tp = TaskPaths(tmp_path, 0)
    own = tmp_path / "my-model"
    own.mkdir()
    assert model_dir(replace(_quickstart(), model=replace(_quickstart().model, builtin=None, path=str(own))), tp) == own
    built = model_dir(_quickstart(), tp)
    assert built.is_relative_to(tp.model_cache) and (built / "config.json").is_file()


def test_the_train_backend_is_the_one_named():
    from slime.backends.base import TRAIN_BACKENDS

    assert TRAIN_BACKENDS.get("torch").__name__ == "TorchTrainBackend"
    assert TRAIN_BACKENDS.get("megatron").__name__ == "MegatronTrainBackend"


def test_megatron_args_carry_the_parallel_sizes():
    from slime.backends.megatron.render import render_megatron_args

    s = load(spec(G, **{"train.parallel": {"tensor": 2, "pipeline": 2, "context": 2, "sequence_parallel": True}})).spec
    text = render_megatron_args(s)
    for arg in ("pipeline_model_parallel_size=2", "context_parallel_size=2", "sequence_parallel=True"):
        assert arg in text, arg
    plain = render_megatron_args(load(G).spec)
    assert "pipeline_model_parallel_size=1" in plain and "sequence_parallel=False" in plain


def test_a_sharded_optimizer_is_megatrons_and_derived_there():
    from slime.backends.megatron.config import ddp_config_kwargs, optimizer_config_kwargs

    megatron = load(G).spec
    assert megatron.train.optimizer.distributed is True  # derived
    assert optimizer_config_kwargs(megatron.train)["use_distributed_optimizer"] is True
    off = load(spec(G, **{"train.optimizer.distributed": False})).spec
    assert optimizer_config_kwargs(off.train)["use_distributed_optimizer"] is False
    assert ddp_config_kwargs(off.train)["use_distributed_optimizer"] is False
    assert load(C).spec.train.optimizer.distributed is False  # derived for torch


def test_the_torch_backend_refuses_megatron_only_settings():
    (p,) = errors_at(problems(spec(C, **{"train.megatron.args": {"recompute-granularity": "full"}})), "train.megatron")
    assert "settings of the megatron train backend, but train.backend is 'torch'" in p.message
    assert "train.backend: megatron" in p.hint
    (p,) = errors_at(problems(spec(C, **{"train.optimizer.distributed": True})), "train.optimizer.distributed")
    assert "cannot shard it" in p.message and "a sharding train backend" in p.hint
    assert not problems(spec(C, **{"train.optimizer.distributed": False}))


def test_half_precision_needs_gpus():
    (p,) = errors_at(problems(spec(C, **{"train.precision": "bf16"})), "train.precision")
    assert "computes in fp32 on CPU" in p.message and "fp32" in p.hint
    assert not errors_at(problems(spec(G, **{"train.precision": "bf16"})), "train.precision")


def test_over_sampling_needs_a_filter_or_partial_rollout():
    """Over-sampling draws more groups than a rollout trains on: only a filter (which drops some) or partial
    rollout (which keeps the rest for later) uses them, so without either it is refused; below the batch too."""
    over = {"rollout.over_sampling_batch_size": 8}  # the CPU spec's batch_size is 4
    (p,) = errors_at(problems(spec(C, **over)), "rollout.over_sampling_batch_size")
    assert "8 > batch_size 4" in p.message and "the extra groups would be generated and thrown away" in p.message
    assert "set rollout.dynamic_sampling.filter or rollout.partial: true" in p.hint
    assert not problems(spec(C, **over, **{"rollout.dynamic_sampling": {"filter": "nonzero_std"}}))
    assert not problems(spec(C, **over, **{"rollout.partial": True}))
    assert load(spec(C, **over, **{"rollout.partial": True})).spec.rollout.over_sampling_batch_size == 8
    (low,) = errors_at(problems(spec(C, **{"rollout.over_sampling_batch_size": 2})), "rollout.over_sampling_batch_size")
    assert "over_sampling_batch_size 2 < batch_size 4" in low.message and "at least rollout.batch_size" in low.hint
    assert not problems(spec(C, **{"rollout.over_sampling_batch_size": 4}))  # = batch_size: no over-sampling


# ----------------------------------------------------------------------------- the torch backend's maths
torch = pytest.importorskip("torch")
from tests.fixtures.torch_backend import backend, make_spec, rl_batch, samples, small_model  # noqa: E402


@pytest.fixture(scope="module")
def small_dir(tiny_model):
    return small_model(tiny_model)


def _step(spec, path, batch, **kw):
    be = backend(spec, path, **kw)
    before = {k: v.detach().clone() for k, v in be.model.state_dict().items()}
    metrics = be.train_step(batch, step=0)
    moved = sum(float((v - before[k]).abs().sum()) for k, v in be.model.state_dict().items())
    return be, metrics, moved


def test_dynamic_batch_packs_micro_batches_by_tokens(small_dir):
    from slime.runtime.train_data import collate

    batch = collate(samples(8, seed=2))
    fixed = backend(make_spec(train={"micro_batch_size": 8}), small_dir)
    assert len(fixed._micro_batches(batch)) == 1
    packed = backend(
        make_spec(train={"micro_batch_size": 8, "dynamic_batch": {"enabled": True, "max_tokens_per_gpu": 12}}),
        small_dir,
    )
    assert len(packed._micro_batches(batch)) > 2  # rows of up to 10 tokens, 12 padded tokens per micro-batch


def test_the_optimizer_and_its_schedule_follow_the_spec(small_dir):
    opt = {"lr": 2e-3, "betas": (0.8, 0.9), "eps": 1e-5, "weight_decay": 0.05}
    be = backend(make_spec(train={"optimizer": opt}), small_dir)
    group = be.optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (2e-3, (0.8, 0.9), 1e-5, 0.05)
    batch = rl_batch(be, samples(8, seed=4))
    sched = {"lr": 1e-3, "min_lr": 1e-4, "lr_schedule": "cosine", "warmup_steps": 2}
    warm = backend(make_spec(train={"optimizer": sched}, rollout={"num_rollouts": 5}), small_dir)  # 5 steps
    lrs = [warm.train_step(rl_batch(warm, samples(8, seed=4)), step=i)["lr"] for i in range(5)]
    assert lrs[0] < lrs[1] == pytest.approx(1e-3)  # linear warm-up over 2 steps
    assert lrs[2] > lrs[3] > lrs[4] >= 1e-4  # then the cosine decay towards min_lr
    _, clipped, small = _step(make_spec(train={"optimizer": {"lr": 1e-2, "clip_grad": 1e-6}}), small_dir, batch)
    _, free, large = _step(make_spec(train={"optimizer": {"lr": 1e-2, "clip_grad": 0.0}}), small_dir, batch)
    assert clipped["grad_norm"] == pytest.approx(free["grad_norm"]) and small < 0.5 * large


def test_clipping_settings_change_the_policy_loss(small_dir):
    be = backend(make_spec(), small_dir)
    batch = rl_batch(be, samples(8, seed=5))

    def clipfrac(shift, eps_clip, eps_clip_high):
        shifted = replace_batch(batch, old_log_probs=batch.old_log_probs + shift * batch.response_mask)
        s = make_spec(algorithm={"eps_clip": eps_clip, "eps_clip_high": eps_clip_high})
        return _step(s, small_dir, shifted)[1]["clipfrac"]

    # ratio e^0.3 ~ 1.35: positive advantages are clipped above 1 + eps_clip_high only
    assert clipfrac(-0.3, 0.1, 0.1) > 0 and clipfrac(-0.3, 0.1, 0.5) == 0
    # ratio e^-0.3 ~ 0.74: negative advantages are clipped below 1 - eps_clip only
    assert clipfrac(0.3, 0.1, 0.5) > 0 and clipfrac(0.3, 0.5, 0.5) == 0


def replace_batch(batch, **fields):
    import copy

    out = copy.copy(batch)
    for k, v in fields.items():
        setattr(out, k, v)
    return out


def test_kl_loss_settings_change_the_policy_loss(small_dir):
    be = backend(make_spec(), small_dir)
    batch = rl_batch(be, samples(8, seed=6))
    batch.ref_log_probs = batch.old_log_probs - 0.5 * batch.response_mask
    base = _step(make_spec(), small_dir, batch)[1]
    k1 = _step(
        make_spec(model={"ref_path": "initial"}, algorithm={"kl_loss_coef": 0.5, "kl_loss_type": "k1"}),
        small_dir,
        batch,
    )[1]
    k3 = _step(
        make_spec(model={"ref_path": "initial"}, algorithm={"kl_loss_coef": 0.5, "kl_loss_type": "k3"}),
        small_dir,
        batch,
    )[1]
    assert k1["loss"] != pytest.approx(base["loss"]) and k1["loss"] != pytest.approx(k3["loss"])


def test_the_critic_takes_its_own_lr_and_value_clip(small_dir):
    from slime.runtime.train_data import collate
    from slime.spec.types import Critic

    def critic_step(value_clip):
        s = make_spec(algorithm={"estimator": "ppo", "critic": Critic(lr=7e-4, value_clip=value_clip)})
        critic = backend(s, small_dir, role="critic")
        batch = collate(samples(8, seed=6))
        batch.returns = torch.full_like(batch.response_mask, 2.0) * batch.response_mask
        batch.old_values = critic.values(batch) - 1.0  # farther from the returns than now: clipping bites
        return critic, critic.train_step(batch, step=0)

    critic, tight = critic_step(0.01)
    assert critic.optimizer.param_groups[0]["lr"] == 7e-4 and tight["lr"] == 7e-4
    _, loose = critic_step(10.0)
    assert tight["value_loss"] != pytest.approx(loose["value_loss"])


def test_the_sft_warmup_takes_its_own_lr(small_dir):
    from slime.runtime.train_data import collate

    be = backend(make_spec(algorithm={"sft_warmup_lr": 3e-3}), small_dir)
    m = be.train_step(collate(samples(4, seed=8), kind="sft"), step=0)
    assert m["lr"] == 3e-3 and be.sft_optimizer.param_groups[0]["lr"] == 3e-3


def test_normalize_std_scales_group_scores():
    from slime.runtime.train_data import sequence_scores

    rewards = [0.0, 1.0, 1.0, 1.0]
    plain = sequence_scores(rewards, estimator="grpo", group_size=4, normalize_std=False)
    scaled = sequence_scores(rewards, estimator="grpo", group_size=4, normalize_std=True)
    assert plain == pytest.approx([-0.75, 0.25, 0.25, 0.25]) and scaled[0] == pytest.approx(-0.75 / 0.5, rel=0.2)


def test_gamma_and_lambda_reach_the_advantages():
    from slime.runtime.train_data import token_advantages

    mask = torch.ones(1, 4)
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]])

    def adv(gamma, lambd):
        return token_advantages(torch.tensor([1.0]), mask, estimator="ppo", values=values, gamma=gamma, lambd=lambd)[0]

    assert not torch.allclose(adv(1.0, 1.0), adv(0.5, 1.0)) and not torch.allclose(adv(1.0, 1.0), adv(1.0, 0.5))


def test_evals_are_due_on_their_interval_and_at_the_end():
    from slime.runtime.driver import due_evals

    s = _quickstart(**{"rollout.num_rollouts": "7", "data.eval[0].interval": "3"})
    assert [r for r in range(7) if due_evals(s, r)] == [2, 5, 6]


# ----------------------------------------------------------------------------- rollouts, rewards, agents
def test_sampling_params_come_from_the_rollout_and_eval_settings():
    from slime.runtime.rollout_manager import RolloutManager

    s = _quickstart(
        **{"rollout.top_p": "0.9", "rollout.top_k": "7", "rollout.stop": "['###']", "rollout.max_response_len": "5"}
    )
    mgr = RolloutManager(s, [], "unused")  # construction only records; sampling_params reads the spec
    p = mgr.sampling_params(temperature=s.rollout.temperature, seed=11)
    assert p == {
        "max_new_tokens": 5,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 7,
        "stop": ["###"],
        "sampling_seed": 11,
    }
    # an eval set without its own settings takes the rollout's (derived at load) ...
    inherited = s.data.eval[0]
    assert (inherited.max_response_len, inherited.top_p, inherited.top_k) == (5, 0.9, 7)
    greedy = mgr.sampling_params(temperature=inherited.temperature, seed=11, e=inherited)
    assert greedy["temperature"] == 0.0 and "sampling_seed" not in greedy
    assert (greedy["max_new_tokens"], greedy["top_p"], greedy["top_k"]) == (5, 0.9, 7)
    # ... and one with its own uses them
    own = _quickstart(**{"data.eval[0].max_response_len": "3", "data.eval[0].top_p": "0.5", "data.eval[0].top_k": "2"})
    e = own.data.eval[0]
    q = RolloutManager(own, [], "unused").sampling_params(temperature=0.5, seed=3, e=e)
    assert (q["max_new_tokens"], q["top_p"], q["top_k"], q["sampling_seed"]) == (3, 0.5, 2, 3)


def test_the_seed_orders_the_prompts_and_seeds_every_request(small_dir):
    """``train.seed`` shuffles the prompt order and seeds each request's sampling (what a seed does inside
    the engine: tests/integration/test_engine_api.py). A recorder stands in for the engine (an HTTP process):
    it answers every request with an empty completed response and keeps the sampling dicts it was sent."""
    from slime.rl.sample import SampleStatus
    from slime.runtime.rollout_manager import RolloutManager, _collect

    class Engine:
        def __init__(self) -> None:
            self.params: list[dict] = []

        async def run(self, group, position, params):
            self.params += params
            for s in group.samples:
                s.status = SampleStatus.COMPLETED

        async def abort(self) -> int:
            return 0

    def rollout(seed):
        s = _quickstart(
            **{
                "train.seed": str(seed),
                "rollout.temperature": "0.7",
                "rollout.batch_size": "4",
                "train.global_batch_size": "32",
                "train.micro_batch_size": "32",
            }
        )
        mgr = RolloutManager(s, [], str(small_dir))
        mgr.setup()
        engine = Engine()
        mgr.generator = lambda tag, max_new_tokens: engine
        try:
            samples, _ = mgr._run(_collect(mgr, 0, None))
        finally:
            mgr.close()
        return [x.prompt for x in samples], engine.params

    prompts, params = rollout(1)
    assert len(params) == 4 * 8 and {p["temperature"] for p in params} == {0.7}  # rollout.temperature
    seeds = [p["sampling_seed"] for p in params]
    assert len(set(seeds)) == len(seeds)  # one seed per request
    assert rollout(1) == (prompts, params)  # the same seed: the same prompts and requests
    other_prompts, other_params = rollout(2)
    assert other_prompts != prompts and not set(seeds) & {p["sampling_seed"] for p in other_params}


def test_a_remote_reward_gets_its_url_timeout_and_retries():
    from slime.rl.rewards import reward_from_spec

    s = _quickstart(reward="{type: remote, url: 'http://rm:8000/score', timeout_s: 4, max_retries: 1}")
    fn = reward_from_spec(s)
    assert (fn.url, fn.timeout_s, fn.max_retries) == ("http://rm:8000/score", 4.0, 1)


def _agent_spec(**sandbox):
    return load(
        spec(
            C,
            **{
                "cluster.secrets": {"E2B_KEY": {"env": "E2B_API_KEY"}},
                "rollout.max_prompt_len": 100,
                "rollout.max_response_len": 50,
                "agent": {"adapter": "anthropic", "max_turns": 2, "tools": ["calculator"], "sandbox": sandbox},
            },
        )
    ).spec


def test_the_agent_section_reaches_the_agent_loop():
    from slime.agent.generate import AgentConfig

    cfg = AgentConfig.from_spec(_agent_spec(timeout_s=3, allow_unisolated=True))
    assert (cfg.protocol, cfg.max_turns, cfg.tools, cfg.tool_timeout_s) == ("anthropic", 2, ("calculator",), 3)
    assert cfg.max_length == 256 and cfg.sandbox_kwargs["allow_unisolated"] is True  # model.max_context_len


def test_an_e2b_sandbox_gets_its_template_network_and_key():
    from slime.agent.generate import sandbox_kwargs

    s = _agent_spec(backend="e2b", image="tpl-123", network=True, api_key_secret="E2B_KEY")  # see _agent_spec
    backend_name, kwargs = sandbox_kwargs(s.agent.sandbox)
    assert backend_name == "e2b" and (kwargs["template"], kwargs["network"]) == ("tpl-123", True)
    assert kwargs["api_key_ref"] == "env:E2B_KEY"


def test_an_agent_generate_plug_in_is_the_one_called(monkeypatch):
    import asyncio

    from slime.agent.context import GenerateContext
    from slime.agent.generate import fill_samples
    from slime.rl.sample import Sample, SampleStatus

    seen = []

    async def my_loop(ctx, sample, params):
        seen.append((sample.prompt, params["max_new_tokens"]))
        sample.tokens, sample.response_length, sample.loss_mask = [1, 2, 3], 1, [1]
        sample.status, sample.reward = SampleStatus.COMPLETED, 1.0
        return sample

    plugin = types.ModuleType("smoke_test_agent_plugin")
    plugin.my_loop = my_loop
    monkeypatch.setitem(sys.modules, "smoke_test_agent_plugin", plugin)
    s = load(spec(C, agent={"generate": "smoke_test_agent_plugin:my_loop", "tools": []})).spec
    from slime.backends.rollout.client import EngineClient

    unused = EngineClient("http://127.0.0.1:9")  # the plug-in talks to no engine
    ctx = GenerateContext(clients=(unused,), tokenizer=None, spec=s, reward_fn=None)
    batch = [Sample(group_index=0, index=i, prompt=f"p{i}", tokens=[1]) for i in range(2)]
    asyncio.run(fill_samples(ctx, batch, [{"max_new_tokens": 4}] * 2))
    assert seen == [("p0", 4), ("p1", 4)] and all(x.reward == 1.0 for x in batch)


# ----------------------------------------------------------------------------- logging
class _Recorder(types.ModuleType):
    """Stands in for the ``wandb`` module: records what ``init`` is given."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.calls: list[dict] = []
        self.Settings = lambda **kw: kw

    def init(self, **kwargs):
        self.calls.append(kwargs)
        return None


def test_wandb_gets_project_group_entity_and_the_description_as_notes(tmp_path, monkeypatch):
    from slime.runtime.metrics import WandbSink

    recorder = _Recorder()
    monkeypatch.setitem(sys.modules, "wandb", recorder)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    s = load(
        spec(
            C,
            **{
                "description": "what this run is for",
                "logging.wandb": {"mode": "offline", "project": "proj", "group": "grp", "entity": "team"},
            },
        )
    ).spec
    sink = WandbSink(s, TaskPaths(tmp_path, 0), resume=False)
    sink._ready()
    (kw,) = recorder.calls
    assert (kw["project"], kw["group"], kw["entity"], kw["notes"], kw["mode"]) == (
        "proj",
        "grp",
        "team",
        "what this run is for",
        "offline",
    )
    recorder.calls.clear()
    WandbSink(
        replace(s, logging=replace(s.logging, wandb=replace(s.logging.wandb, mode="disabled"))),
        TaskPaths(tmp_path, 1),
        resume=False,
    )
    assert not recorder.calls


@pytest.mark.parametrize("enabled", [True, False])
def test_a_progress_bar_only_with_logging_progress(enabled, monkeypatch):
    from slime.runtime.progress import Progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    bar = Progress(10, enabled=enabled)
    try:
        assert (bar._bar is not None) == enabled
    finally:
        bar.close()
