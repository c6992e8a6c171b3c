"""``slime.spec.smoke.scale_down``: every example spec (and random valid variations of a GPU spec)
scales down to a spec that validates as the embedded CPU default, keeps what the smoke promises to
keep, and lists every change (exactly: each field that differs, nothing else) with its reason and what the
changes leave untested."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from slime.cli.smoke_driver import STOP_AFTER_ENV as DRIVER_ENV
from slime.spec import SpecError, load_spec, load_spec_text
from slime.spec.smoke import MAX_PROMPTS, MAX_SAMPLES, TINY_CONTEXT, scale_down
from tests.fixtures.spec_helpers import DELETE, GPU_SPEC, change_list_gaps, load, spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("specs/*.yaml"))


def _scaled(resolved, rollouts=2, tasks=1):
    plan = scale_down(resolved, rollouts=rollouts, logging_dir="/tmp/smoke-runs", tasks=tasks)
    again = load_spec_text(plan.yaml, file="scaled.yaml", base_dir=ROOT).tasks[0].spec
    return plan, again


def _kept(before, after):
    """What the smoke promises to keep, as plain data."""

    def pick(s):
        optimizer = {k: v for k, v in msgspec.to_builtins(s.train.optimizer).items() if k != "distributed"}
        return msgspec.to_builtins(
            (s.data.prompts, s.data.input_key, s.data.label_key, s.data.apply_chat_template, s.data.shuffle)
            + (s.reward, s.agent, optimizer, s.train.dynamic_batch.enabled, s.rollout.colocate, s.train.seed)
            + (s.rollout.temperature, s.rollout.top_p, s.rollout.top_k, s.rollout.stop, s.cluster.secrets)
        )

    alg = {k: v for k, v in msgspec.to_builtins(before.algorithm).items() if k != "sft_warmup_steps"}
    assert alg == {k: v for k, v in msgspec.to_builtins(after.algorithm).items() if k != "sft_warmup_steps"}
    assert pick(before) == pick(after)
    assert [e.name for e in before.data.eval] == [e.name for e in after.data.eval]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_scales_down_to_the_cpu_default_and_validates(path):
    loaded = load_spec(path)
    plan, again = _scaled(loaded.tasks[0].spec, tasks=len(loaded.tasks))
    assert again == plan.spec  # resolving the written spec again changes nothing
    s = plan.spec
    assert (s.cluster.launcher, s.cluster.nodes, s.cluster.gpus_per_node) == ("local", 1, 0)
    assert (s.train.backend, s.rollout.backend, s.model.builtin, s.model.path) == ("torch", "builtin", "tiny", None)
    assert s.rollout.num_rollouts == 2 and s.rollout.epochs is None
    assert s.rollout.batch_size <= MAX_PROMPTS and s.rollout.n_samples_per_prompt <= MAX_SAMPLES
    assert s.rollout.max_prompt_len + s.rollout.max_response_len <= TINY_CONTEXT
    assert s.rollout.weight_sync in ("disk", "nccl") and s.rollout.gpus_per_engine == 1
    assert s.logging.dir == "/tmp/smoke-runs" and s.logging.wandb.mode == "disabled"
    assert s.cluster.env["WANDB_MODE"] == "disabled"
    assert s.train.checkpoint.dir is None and s.train.checkpoint.load is None
    _kept(loaded.tasks[0].spec, s)
    for c in plan.changes:
        assert c.before != c.after and c.reason, c
    # the "changed to fit a CPU" list is exact: every field that differs, under a listed path, and no other
    assert change_list_gaps(loaded.tasks[0].spec, s, [c.path for c in plan.changes]) == ([], [])
    assert plan.untested[-1].startswith("full-size batches")


def test_a_gpu_spec_lists_what_the_smoke_cannot_show():
    loaded = load_spec(ROOT / "specs" / "grpo-multinode.yaml")
    plan, scaled = _scaled(loaded.spec)
    changed = {c.path: (c.before, c.after) for c in plan.changes}
    assert changed["train.backend"] == ("megatron", "torch")
    assert changed["train.parallel.tensor"] == (2, 1)
    # the plug-ins the smoke replaces drop their sections whole (the embedded defaults' own are filled)
    assert changed["cluster.launcher"] == ("slurm", "local")
    assert changed["cluster.slurm"][0].partition == "gpu" and changed["cluster.slurm"][1] is None
    assert changed["train.megatron"][0].args["recompute-granularity"] == "full" and changed["train.megatron"][1] is None
    assert changed["rollout.sglang"][0].args["mem-fraction-static"] == 0.7 and changed["rollout.sglang"][1] is None
    assert (scaled.cluster.slurm, scaled.train.megatron, scaled.rollout.sglang) == (None, None, None)
    assert scaled.rollout.builtin is not None and scaled.rollout.builtin.args == {}
    assert changed["rollout.max_response_len"] == (8192, 64)
    text = "\n".join(plan.untested)
    assert "Megatron-core training: parallel sizes (tensor 2)" in text and "megatron.args recompute-granularity" in text
    assert "SGLang engines: gpus_per_engine 2" in text and "sglang.args mem-fraction-static" in text
    assert "SLURM submission: sbatch, the allocation, requeues" in text
    assert "2 node(s) x 8 GPU(s): the GPU preflight" in text and "/models/Qwen2.5-7B-Instruct" in text


def test_steps_per_rollout_over_sampling_and_the_reference_keep_their_meaning(tmp_path):
    ref = tmp_path / "ref"
    ref.mkdir()
    data = spec(
        GPU_SPEC,
        **{
            "rollout.batch_size": 24,
            "rollout.n_samples_per_prompt": 8,
            "train.global_batch_size": 48,  # 4 optimizer steps per rollout
            "train.micro_batch_size": 3,
            "rollout.weight_sync": "delta",
            "rollout.colocate": False,
            "rollout.gpus": 8,
            "train.gpus_per_node": 4,
            "model.ref_path": str(ref),
            "algorithm.kl_loss_coef": 0.01,
            "train.checkpoint.load": "/ckpt/old",
        },
    )
    plan, _ = _scaled(load(data).spec)
    s = plan.spec
    assert s.train.num_steps_per_rollout == 4 and s.train.global_batch_size == 4  # 4 x 4 samples / 4 steps
    assert s.train.micro_batch_size == 2  # at most 3, dividing 4
    # over-sampling beyond batch_size is refused today (no dynamic filter); when it runs, it keeps its proportion
    resolved = load(data).spec
    oversampled = replace(resolved, rollout=replace(resolved.rollout, over_sampling_batch_size=36))
    assert scale_down(oversampled, logging_dir="/x").spec.rollout.over_sampling_batch_size == 6  # 36/24 of 4
    assert s.rollout.weight_sync == "disk" and "delta weight sync (disk sync ran instead)" in plan.untested
    assert s.model.ref_path == "initial" and s.algorithm.kl_loss_coef == 0.01
    reasons = {c.path: c.reason for c in plan.changes}
    assert "your reference checkpoint" in reasons["model.ref_path"]
    assert reasons["train.checkpoint.load"] == "your checkpoint is for your model"


def test_one_rollout_is_allowed_and_zero_is_not():
    resolved = load_spec(ROOT / "specs" / "quickstart.yaml").spec
    assert scale_down(resolved, rollouts=1, logging_dir="/x").spec.rollout.num_rollouts == 1
    with pytest.raises(ValueError, match="at least 1 rollout"):
        scale_down(resolved, rollouts=0, logging_dir="/x")


def test_the_driver_and_the_runtime_agree_on_the_stop_variable():
    from slime.runtime.driver import STOP_AFTER_ENV

    assert DRIVER_ENV == STOP_AFTER_ENV == "SLIME_STOP_AFTER_ROLLOUT"


# Random valid variations of a GPU job: whatever validates there scales down to a spec that validates.
_VARIATIONS = st.fixed_dictionaries(
    {
        "train.parallel.tensor": st.sampled_from([1, 2, 4]),
        "train.parallel.pipeline": st.sampled_from([1, 2]),
        "train.parallel.sequence_parallel": st.booleans(),
        "train.micro_batch_size": st.sampled_from([1, 2]),
        "train.num_steps_per_rollout": st.sampled_from([1, 2]),
        "rollout.batch_size": st.sampled_from([64, 128]),  # divisible by micro x dp (16) x steps
        "rollout.n_samples_per_prompt": st.sampled_from([1, 2, 8]),
        "rollout.max_prompt_len": st.sampled_from([64, 250, 1024]),
        "rollout.max_response_len": st.sampled_from([4, 200, 8192]),
        "rollout.colocate": st.booleans(),
        "rollout.weight_sync": st.sampled_from([None, "disk", "nccl", "delta"]),
        "algorithm.estimator": st.sampled_from(["grpo", "ppo", "gspo", "reinforce_plus_plus"]),
        "algorithm.sft_warmup_steps": st.sampled_from([0, 5]),
        "data.eval[0].n_samples_per_prompt": st.sampled_from([1, 16]),
    }
)


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_VARIATIONS)
def test_whatever_validates_on_a_gpu_cluster_scales_down_to_a_valid_cpu_spec(edits):
    edits = {**edits, "train.global_batch_size": DELETE}
    edits["train.parallel.sequence_parallel"] &= edits["train.parallel.tensor"] > 1
    if edits["rollout.colocate"]:  # collective syncs are for engines on their own GPUs
        edits["rollout.weight_sync"] = "disk" if edits["rollout.weight_sync"] in ("nccl", "delta") else None
    else:
        edits.update({"rollout.gpus": 8, "train.gpus_per_node": 4})
    if edits["train.parallel.pipeline"] > 1 and edits["rollout.weight_sync"] == "nccl":
        edits["rollout.weight_sync"] = "disk"  # nccl needs the whole policy on trainer rank 0
    try:
        resolved = load(spec(GPU_SPEC, **edits)).spec
    except SpecError as exc:
        pytest.fail(f"the variation does not validate: {exc}")  # the strategy draws valid GPU specs only
    plan, again = _scaled(resolved, rollouts=1)
    assert again == plan.spec
    _kept(resolved, plan.spec)
    assert change_list_gaps(resolved, plan.spec, [c.path for c in plan.changes]) == ([], [])


def test_secrets_that_do_not_resolve_here_are_dropped_and_listed_as_not_checked(monkeypatch, tmp_path):
    """A smoke runs in CI, where production secrets do not belong: an unset one is left out, and said."""
    from slime.cli.smoke import _missing

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("REWARD_TOKEN", "t")
    (tmp_path / "hf").write_text("x\n")
    resolved = load(
        spec(
            GPU_SPEC,
            **{
                "cluster.secrets": {
                    "WANDB_API_KEY": {"env": "WANDB_API_KEY"},
                    "REWARD_TOKEN": {"env": "REWARD_TOKEN"},
                    "HF_TOKEN": {"file": str(tmp_path / "hf")},
                    "DB": {"file": str(tmp_path / "absent")},
                }
            },
        )
    ).spec
    missing = _missing(resolved)
    assert missing == {"WANDB_API_KEY", "DB"}
    plan = scale_down(resolved, logging_dir="/tmp/x", missing_secrets=missing)
    assert set(plan.spec.cluster.secrets) == {"REWARD_TOKEN", "HF_TOKEN"}
    assert [u for u in plan.untested if u.startswith("secret ")] == [
        "secret DB (not set here; the smoke ran without it)",
        "secret WANDB_API_KEY (not set here; the smoke ran without it)",
    ]
    change = next(c for c in plan.changes if c.path == "cluster.secrets")
    assert "DB, WANDB_API_KEY" in change.reason
    load_spec_text(plan.yaml)  # still a valid spec
