"""slime.spec.layout: where actor, critic and engines land (colocated, disaggregated, CPU), and every
LayoutError with its field path, numbers and hint. The validator reports these same errors
(see test_spec_rules.py, rule layout_fits); here the placement itself is checked."""

from __future__ import annotations

import msgspec
import pytest

import slime.spec.layout as layout_module
from slime.cli.main import main
from slime.spec.layout import LayoutError, Slot, layout_counts, plan_layout
from slime.spec.resolve import resolve
from slime.spec.types import Spec
from tests.fixtures.spec_helpers import CPU_SPEC, GPU_SPEC, ROOT, load, spec


def resolved(data: dict):
    """Resolved but not validated (to reach plan_layout with layouts the rules would reject)."""
    return resolve(msgspec.convert(data, Spec), ROOT)


def gpus(slots) -> list[tuple[int, int]]:
    return [(s.node, s.gpu) for s in slots]


def test_colocated_engines_share_the_actor_gpus():
    layout = plan_layout(load(GPU_SPEC).spec)
    assert (layout.total_slots, layout.rollout_offset, layout.colocate) == (16, 0, True)
    assert gpus(layout.actor) == [(n, g) for n in range(2) for g in range(8)]
    assert [gpus(e) for e in layout.engines][:2] == [[(0, 0), (0, 1)], [(0, 2), (0, 3)]]
    assert len(layout.engines) == 8 and layout.critic == ()
    assert layout.roles_of(Slot(node=1, gpu=7)) == ["actor", "engine7"]


def test_jobs_that_start_no_engines_give_them_no_gpus():
    """A kind SFTJob without eval sets, and debug train_only, start no engines: none in the layout."""
    sft = {
        **GPU_SPEC,
        "kind": "SFTJob",
        "data": {"prompts": "/d/chat.jsonl", "input_key": "messages", "apply_chat_template": True},
    }
    sft["rollout"] = {k: v for k, v in GPU_SPEC["rollout"].items() if k not in ("n_samples_per_prompt",)}
    for data in (sft, spec(sft, **{"rollout.colocate": False})):
        s = resolved(data)
        assert s.rollout.gpus == 0 and plan_layout(s).engines == ()
    with_eval = resolved(spec(sft, **{"data.eval": [{"name": "held", "path": "/d/held.jsonl"}]}))
    assert with_eval.rollout.gpus == 16 and len(plan_layout(with_eval).engines) == 8


def test_disaggregated_engines_start_after_the_actor():
    layout = plan_layout(
        load(
            spec(
                GPU_SPEC,
                **{
                    "cluster.nodes": 1,
                    "train.gpus_per_node": 4,
                    "rollout.colocate": False,
                    "rollout.gpus": 4,
                    "train.global_batch_size": 128,
                },
            )
        ).spec
    )
    assert (layout.total_slots, layout.rollout_offset) == (8, 4)
    assert gpus(layout.actor) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert [gpus(e) for e in layout.engines] == [[(0, 4), (0, 5)], [(0, 6), (0, 7)]]
    assert layout.roles_of(Slot(node=0, gpu=5)) == ["engine0"]


def test_colocated_rollout_larger_than_the_actor_uses_more_nodes():
    layout = plan_layout(
        load(spec(GPU_SPEC, **{"train.nodes": 1, "rollout.gpus": 16, "train.global_batch_size": 128})).spec
    )
    assert layout.total_slots == 16 and len(layout.actor) == 8
    assert gpus(layout.engines[4]) == [(1, 0), (1, 1)]


def test_an_engine_may_span_whole_nodes():
    layout = plan_layout(load(spec(GPU_SPEC, **{"rollout.gpus_per_engine": 16})).spec)
    (engine,) = layout.engines
    assert gpus(engine) == [(n, g) for n in range(2) for g in range(8)]


def test_ppo_critic_reuses_the_actor_slots():
    layout = plan_layout(load(spec(GPU_SPEC, **{"algorithm.estimator": "ppo"})).spec)
    assert layout.critic == layout.actor
    assert layout.roles_of(Slot(node=0, gpu=0)) == ["actor", "critic", "engine0"]


def test_cpu_layout_one_rank_per_node_and_round_robin_engines():
    layout = plan_layout(
        resolved(
            spec(
                CPU_SPEC,
                **{"cluster.nodes": 2, "cluster.launcher": "slurm", "train.nodes": 2, "rollout.num_engines": 3},
            )
        )
    )
    assert layout.cpu_only and [str(s) for s in layout.actor] == ["node0:cpu", "node1:cpu"]
    assert [[str(s) for s in e] for e in layout.engines] == [["node0:cpu"], ["node1:cpu"], ["node0:cpu"]]
    assert [str(s) for s in layout.all_slots()] == ["node0:cpu", "node1:cpu"]


def test_async_cpu_layout_splits_each_node_into_a_trainer_and_an_engine_slot(monkeypatch):
    import slime.placement
    from slime.placement import bundle_specs, placement_options, torch_threads

    data = spec(
        CPU_SPEC,
        **{"cluster.nodes": 2, "cluster.launcher": "slurm", "train.nodes": 2, "rollout.num_engines": 3},
        **{"train.async": True, "cluster.cpus_per_node": 5},
    )
    layout = plan_layout(resolved(data))
    assert layout.cpu_only and layout.cpu_split
    assert [str(s) for s in layout.actor] == ["node0:cpu", "node1:cpu"]
    assert [[str(s) for s in e] for e in layout.engines] == [["node0:cpu1"], ["node1:cpu1"], ["node0:cpu1"]]
    assert [str(s) for s in layout.all_slots()] == ["node0:cpu", "node0:cpu1", "node1:cpu", "node1:cpu1"]
    assert layout.total_slots == 4 and len(bundle_specs(layout)) == 4
    assert layout.roles_of(Slot(node=0, gpu=None)) == ["actor"]
    assert layout.roles_of(Slot(node=0, gpu=None, part=1)) == ["engine0", "engine2"]
    # each actor has its slot to itself (no 0.49 shares as when trainer and engines share a node's slot)
    assert placement_options(layout, None, layout.actor[0])["num_cpus"] == 0.99
    # 5 cores: engines 2 (node 0 holds two engines: one each), trainer 3; shared, each kind gets all 5
    monkeypatch.setattr(slime.placement.os, "cpu_count", lambda: 8)
    assert torch_threads(layout, layout.actor[0], "train", 5) == 3
    assert torch_threads(layout, layout.engines[1][0], "engine", 5) == 2
    assert torch_threads(layout, layout.engines[0][0], "engine", 5) == 1
    assert (
        torch_threads(layout, layout.actor[0], "train", 2)
        == torch_threads(layout, layout.engines[1][0], "engine", 2)
        == 1
    )
    shared = plan_layout(resolved({**data, "train": {**data["train"], "async": False}}))
    assert not shared.cpu_split and [str(s) for s in shared.all_slots()] == ["node0:cpu", "node1:cpu"]
    assert torch_threads(shared, shared.actor[0], "train", 5) == 5


def test_layout_counts():
    colocated = layout_counts(resolved(spec(GPU_SPEC, **{"rollout.gpus": 12})))
    assert (colocated.actor_gpus, colocated.rollout_gpus, colocated.total, colocated.offset, colocated.available) == (
        16,
        12,
        16,
        0,
        16,
    )
    split = layout_counts(resolved(spec(GPU_SPEC, **{"rollout.colocate": False, "rollout.gpus": 4})))
    assert (split.total, split.offset) == (20, 16)


@pytest.mark.parametrize(
    "edits, path, words, hint",
    [
        # Colocated: the actor always fits, so the overflow is reported at the field the user set.
        (
            {"rollout.gpus": 24},
            "rollout.gpus",
            ["rollout.gpus=24 does not fit", "needs 24 GPUs", "max(actor, rollout)", "cluster has 16"],
            "set rollout.gpus <= 16",
        ),
        ({"rollout.gpus": 32}, "rollout.gpus", ["rollout.gpus=32", "cluster has 16"], "set rollout.gpus <= 16"),
        (
            {"rollout.colocate": False, "rollout.gpus": 2},
            "rollout.gpus",
            ["needs 18 GPUs", "actor + rollout", "rollout.gpus = 2"],
            "lower",
        ),
        (
            {"train.gpus_per_node": 9},
            "train.gpus_per_node",
            ["train.gpus_per_node=9 exceeds cluster.gpus_per_node=8"],
            "<= 8",
        ),
        ({"train.nodes": 4}, "train.nodes", ["train.nodes=4 exceeds cluster.nodes=2"], "raise cluster.nodes"),
        (
            {
                "train.nodes": 1,
                "train.gpus_per_node": 6,
                "rollout.colocate": False,
                "rollout.gpus": 8,
                "rollout.gpus_per_engine": 4,
            },
            "rollout.gpus_per_engine",
            ["engine 0 (4 GPUs) would straddle nodes [0, 1]", "node0:gpu6"],
            "divide cluster.gpus_per_node",
        ),
        # gpus_per_engine 8 = cluster.gpus_per_node, but the actor (and so the engine) has 4 GPUs on each of two nodes.
        (
            {"train.gpus_per_node": 4, "rollout.gpus_per_engine": 8, "train.global_batch_size": 128},
            "rollout.gpus_per_engine",
            ["engine 0 (8 GPUs) would straddle nodes [0, 1]", "4 on node0, 4 on node1", "cover all 8 GPUs"],
            "divide cluster.gpus_per_node",
        ),
    ],
)
def test_layout_errors_name_the_numbers(edits, path, words, hint):
    with pytest.raises(LayoutError) as info:
        plan_layout(resolved(spec(GPU_SPEC, **edits)))
    err = info.value
    assert err.path == path and hint in err.hint
    for w in words:
        assert w in str(err), str(err)


def test_cpu_layout_error():
    with pytest.raises(LayoutError) as info:
        plan_layout(resolved(spec(CPU_SPEC, **{"train.nodes": 3})))
    assert info.value.path == "train.nodes" and "exceeds cluster.nodes=1" in str(info.value)


def test_fitting_layouts_raise_nothing():
    for edits in ({}, {"rollout.gpus": 16}, {"rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 6}):
        plan_layout(resolved(spec(GPU_SPEC, **edits)))


def test_disaggregated_partial_nodes_never_share_a_gpu():
    """train.gpus_per_node < cluster.gpus_per_node: engines fill the actor's leftover GPUs, no overlap."""
    from slime.spec import load_spec_text
    from slime.spec.layout import plan_layout

    text = """apiVersion: slime/v2
kind: RLJob
name: x
cluster: {launcher: slurm, nodes: 2, gpus_per_node: 2}
model: {builtin: tiny}
train: {nodes: 2, gpus_per_node: 1, global_batch_size: 8, micro_batch_size: 1}
rollout: {gpus: 2, batch_size: 2, n_samples_per_prompt: 4, num_rollouts: 1, max_prompt_len: 8, max_response_len: 4}
data: {prompts: p.jsonl}
"""
    layout = plan_layout(load_spec_text(text).spec)
    engine_slots = {s for e in layout.engines for s in e}
    assert not engine_slots & set(layout.actor)
    assert len(engine_slots) == 2 and {s.node for s in engine_slots} == {0, 1}


def flat(n: int, gpn: int = 8) -> list[tuple[int, int]]:
    return [(i // gpn, i % gpn) for i in range(n)]


@pytest.mark.parametrize(
    "edits, slots",
    [
        # colocated, 4 of each node's 8 GPUs: the slots are gpu0-3 of both nodes, not node0:gpu0-7
        ({"train.gpus_per_node": 4, "train.global_batch_size": 128}, [(n, g) for n in range(2) for g in range(4)]),
        # disaggregated, actor on gpu0-1 of both nodes, one 2-GPU engine after it on node 0
        (
            {
                "train.gpus_per_node": 2,
                "rollout.gpus": 2,
                "rollout.colocate": False,
                "train.parallel.tensor": 1,
                "train.global_batch_size": 128,
            },
            [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)],
        ),
        # colocated rollout larger than a partial actor: the engines also take the actor's free GPUs
        ({"train.gpus_per_node": 4, "rollout.gpus": 16, "train.global_batch_size": 128}, flat(16)),
    ],
)
def test_all_slots_are_exactly_the_roles_slots_on_their_nodes(edits, slots):
    layout = plan_layout(load(spec(GPU_SPEC, **edits)).spec)
    used = set(layout.actor) | set(layout.critic) | {s for e in layout.engines for s in e}
    assert gpus(layout.all_slots()) == slots and set(layout.all_slots()) == used
    assert layout.total_slots == len(slots)


@pytest.mark.parametrize(
    "edits, n",
    [
        ({}, 16),
        ({"rollout.gpus": 12}, 16),
        ({"train.nodes": 1, "rollout.gpus": 16, "train.global_batch_size": 128}, 16),
        ({"rollout.gpus_per_engine": 16}, 16),
        ({"algorithm.estimator": "ppo"}, 16),
        ({"rollout.colocate": False, "rollout.gpus": 4, "train.gpus_per_node": 6}, 16),
    ],
)
def test_layouts_filling_whole_nodes_keep_the_flat_slot_prefix(edits, n):
    assert gpus(plan_layout(resolved(spec(GPU_SPEC, **edits))).all_slots()) == flat(n)


def test_a_render_plans_the_layout_once(monkeypatch, capsys):
    """The validator's rule and the dry run's SGLang preview ask for the layout of the same spec object:
    one computation (before: one per caller)."""
    calls = []
    plan = layout_module._plan

    def counting(spec):
        calls.append(spec)
        return plan(spec)

    monkeypatch.setattr(layout_module, "_plan", counting)
    monkeypatch.setattr(layout_module, "_RECENT", {})
    assert main(["render", str(ROOT / "specs" / "grpo-multinode.yaml")]) == 0
    assert "python -m sglang.launch_server" in capsys.readouterr().out
    assert len(calls) == 1


def test_plan_layout_reuses_its_answer_only_for_the_same_spec_object():
    loaded = load(GPU_SPEC)
    again = load(GPU_SPEC)
    first = layout_module.plan_layout(loaded.spec)
    assert layout_module.plan_layout(loaded.spec) is first
    other = layout_module.plan_layout(again.spec)  # an equal spec, another object: computed, equal
    assert other == first and other is not first


def test_prefill_decode_groups_are_engine_roles_in_the_layout_and_its_table():
    """rollout.sglang.pd: the first engines prefill, the rest decode; roles reach the placement rows."""
    base = {"cluster.nodes": 1, "train.gpus_per_node": 4, "rollout.colocate": False, "rollout.gpus": 4}
    base["train.global_batch_size"] = 128
    layout = plan_layout(load(spec(GPU_SPEC, **base, **{"rollout.sglang.pd": {"prefill_engines": 1}})).spec)
    assert layout.engine_roles == ("prefill", "decode")
    assert layout.roles_of(Slot(node=0, gpu=4)) == ["engine0:prefill"]
    assert layout.roles_of(Slot(node=0, gpu=7)) == ["engine1:decode"]
    assert layout_module.layout_table(layout) == [
        "role    engines GPUs slots",
        "actor   -       4    node0:gpu0-3",
        "prefill 1 (0)   2    node0:gpu4-5",
        "decode  1 (1)   2    node0:gpu6-7",
    ]
    plain = plan_layout(load(spec(GPU_SPEC, **base)).spec)
    assert plain.engine_roles == () and plain.roles_of(Slot(node=0, gpu=4)) == ["engine0"]
