"""``rollout.external`` on a GPU cluster: the spec validates without ``rollout.gpus``, the engines are
one per address, their weights come from disk, and the layout places only the trainer."""

from __future__ import annotations

from slime.spec.layout import plan_layout
from tests.fixtures.spec_helpers import CPU_SPEC, DELETE, GPU_SPEC, load, problems, spec

EXTERNAL = {"rollout.external": ["serve-1:30000", "serve-2:30000"], "rollout.colocate": False}


def test_external_engines_take_no_slot_of_a_gpu_job():
    data = spec(GPU_SPEC, **EXTERNAL)
    assert problems(data) == []
    s = load(data).spec
    assert (s.rollout.gpus, s.rollout.num_engines, s.rollout.weight_sync) == (0, 2, "disk")
    layout = plan_layout(s)
    assert layout.engines == () and {r for sl in layout.all_slots() for r in layout.roles_of(sl)} == {"actor"}
    own = plan_layout(load(spec(GPU_SPEC, **{"rollout.colocate": False, "rollout.gpus": 4, "train.nodes": 1})).spec)
    assert len(own.engines) == 2  # the same job starting its own engines places them


def test_external_engines_take_no_slot_of_a_cpu_job():
    s = load(spec(CPU_SPEC, **{**EXTERNAL, "model.builtin": DELETE, "model.path": "/m"})).spec
    assert plan_layout(s).engines == () and s.rollout.num_engines == 2
