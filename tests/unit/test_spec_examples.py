"""Every example spec in specs/ validates (parametrised over the glob, so new specs are covered),
and the named ones describe the layouts the issue asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from slime.spec import load_spec
from slime.spec.layout import plan_layout

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(ROOT.glob("specs/*.yaml"))


def test_there_are_examples():
    assert {"quickstart.yaml", "grpo-multinode.yaml"} <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_spec_validates(path):
    loaded = load_spec(path)
    assert loaded.tasks and all(t.spec is not None for t in loaded.tasks)
    assert loaded.spec.name and loaded.spec.description is not None
    for task in loaded.tasks:
        layout = plan_layout(task.spec)  # every task also places on its cluster
        assert len(layout.engines) == (task.spec.rollout.num_engines or 0)
    if path.name == "sweep.yaml":
        assert loaded.is_sweep and len(loaded.tasks) > 1


def test_quickstart_is_the_local_cpu_default():
    s = load_spec(ROOT / "specs" / "quickstart.yaml").spec
    assert (s.cluster.launcher, s.cluster.gpus_per_node, s.train.backend, s.rollout.backend, s.model.builtin) == (
        "local",
        0,
        "torch",
        "builtin",
        "tiny",
    )
    assert Path(s.data.prompts).is_absolute() and s.data.prompts.startswith(str(ROOT / "specs"))


def test_dapo_is_the_quickstart_with_dapo_settings():
    q, d = (load_spec(ROOT / "specs" / f"{n}.yaml").spec for n in ("quickstart", "dapo"))
    assert (d.cluster.launcher, d.model.builtin, d.train.backend, d.rollout.backend) == (
        "local",
        "tiny",
        "torch",
        "builtin",
    )
    assert (d.data.prompts, d.reward.type, d.algorithm.sft_warmup_steps) == (q.data.prompts, q.reward.type, 300)
    r, a = d.rollout, d.algorithm
    assert r.dynamic_sampling is not None and r.dynamic_sampling.filter == "nonzero_std"
    assert r.over_sampling_batch_size > r.batch_size  # over-sampling makes up for the dropped groups
    assert a.eps_clip_high > a.eps_clip and a.loss_agg == "token_mean" and a.estimator == "grpo"
    assert d.debug.save_rollouts  # its trained groups can be checked


def test_grpo_multinode_layout():
    s = load_spec(ROOT / "specs" / "grpo-multinode.yaml").spec
    assert (s.cluster.launcher, s.cluster.nodes, s.cluster.gpus_per_node) == ("slurm", 2, 8)
    assert (s.train.backend, s.rollout.backend, s.rollout.colocate, s.train.parallel.tensor) == (
        "megatron",
        "sglang",
        True,
        2,
    )
    layout = plan_layout(s)
    assert layout.total_slots == 16 and len(layout.actor) == 16 and len(layout.engines) == 8
    assert all(len({slot.node for slot in e}) == 1 for e in layout.engines)


def test_smoke_slurm_if_present():
    path = ROOT / "specs" / "smoke-slurm.yaml"
    if not path.exists():
        pytest.skip("specs/smoke-slurm.yaml not written yet")
    s = load_spec(path).spec
    assert (s.cluster.launcher, s.cluster.nodes, s.cluster.gpus_per_node) == ("slurm", 2, 2)
    assert (s.train.backend, s.rollout.backend, s.model.builtin) == ("torch", "builtin", "tiny")
