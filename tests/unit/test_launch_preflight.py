"""Preflight decisions that need no Ray: GPU visibility, role/GPU conflicts, the report and table.

The probes' inputs are what a node reports (environment variables, nvidia-smi/torch counts); the
placement rows are what ``slime.placement`` maps. The checks with Ray run in
tests/integration/test_local_launcher.py and tests/e2e/test_slurm_e2e.py.
"""

from __future__ import annotations

import json

import pytest

from launchers.node.preflight_checks import (
    cuda_checks,
    gpu_visibility,
    needs_collective,
    ray_resources,
    render_table,
    role_conflicts,
    write_report,
)
from slime.core.paths import TaskPaths
from slime.placement import bundle_specs, node_rank_of, placement_from_infos
from slime.spec.layout import Layout, Slot, plan_layout
from tests.fixtures.spec_helpers import GPU_SPEC, load, spec


def _checks(checks):
    return {c.name: c for c in checks}


CI_NODE = {"cuda_visible_devices": "0,1", "slurm_gpus_on_node": "2", "slurm_gpus": "0,1", "nvidia_smi": None}


def test_gres_gpus_without_cuda_fail_naming_the_node_unless_fake_gpus_is_set():
    """The CI cluster's nodes: SLURM GRES gives 2 GPUs, torch sees none. A failure, not a pass on GRES."""
    c = _checks(gpu_visibility("sn1", 2, dict(CI_NODE, torch_cuda=0)))
    assert not c["gpu_count"].ok and c["gpu_count"].node == "sn1"
    assert "no CUDA on this node although SLURM GRES gives it 2 GPU(s)" in c["gpu_count"].message
    assert "cluster.fake_gpus: true" in c["gpu_count"].fix and "cluster.slurm.exclude" in c["gpu_count"].fix
    c = _checks(gpu_visibility("sn1", 2, dict(CI_NODE, torch_cuda=0), fake_gpus=True))
    assert c["gpu_count"].ok and "SLURM GRES" in c["gpu_count"].message
    assert "fake GPUs (cluster.fake_gpus): CUDA not checked" in c["gpu_count"].message
    assert c["cuda_visible_devices"].ok
    c = _checks(gpu_visibility("sn1", 4, CI_NODE, fake_gpus=True))
    assert not c["gpu_count"].ok and c["gpu_count"].node == "sn1" and "spec wants 4" in c["gpu_count"].message
    # A driver present but torch without CUDA (a CPU wheel on a GPU node): named, with the CUDA fix.
    c = _checks(gpu_visibility("g1", 2, dict(CI_NODE, nvidia_smi=2, torch_cuda=0)))
    assert not c["gpu_count"].ok and "torch.cuda sees 0" in c["gpu_count"].message
    assert "cluster.fake_gpus" in c["gpu_count"].fix


def test_cuda_probe_answers_become_one_check_per_bad_node():
    bundles = [(0, "sn1"), (1, "sn1"), (2, "sn2"), (3, "sn2")]
    good = [{"bundle": i, "host": h, "gpu_ids": [str(i % 2)], "device_name": "NVIDIA H200"} for i, h in bundles]
    (ok,) = cuda_checks(good, bundles)
    assert ok.ok and ok.name == "cuda" and "all 4 GPU slot(s) on 2 node(s) (NVIDIA H200)" in ok.message
    broken = [dict(good[0]), dict(good[1], error="torch.cuda.is_available() is False"), good[2]]  # bundle 3: silent
    bad = cuda_checks(broken, bundles)
    assert [(c.name, c.ok, c.node) for c in bad] == [("cuda", False, "sn1"), ("cuda", False, "sn2")]
    assert "bundle 1 (GPU 1): torch.cuda.is_available() is False" in bad[0].message
    assert "bundle 3: no answer within the timeout" in bad[1].message
    assert all("cluster.fake_gpus: true" in c.fix for c in bad)


def test_real_gpus_use_cuda_visible_devices_checked_against_nvidia_smi_and_torch():
    good = {
        "cuda_visible_devices": "2,3",
        "slurm_gpus_on_node": "2",
        "slurm_gpus": "2,3",
        "nvidia_smi": 8,
        "torch_cuda": 2,
    }
    assert all(c.ok for c in gpu_visibility("g1", 2, good))
    renumbered = dict(good, cuda_visible_devices="0,1")  # device cgroups renumber from 0
    assert all(c.ok for c in gpu_visibility("g1", 2, renumbered))
    c = _checks(gpu_visibility("g1", 2, dict(good, torch_cuda=1)))
    assert not c["gpu_count"].ok and "torch.cuda sees 1" in c["gpu_count"].message and c["gpu_count"].fix
    c = _checks(gpu_visibility("g1", 2, dict(good, cuda_visible_devices="0,5")))
    assert not c["cuda_visible_devices"].ok and "SLURM allocated GPUs 2,3" in c["cuda_visible_devices"].message
    c = _checks(gpu_visibility("g1", 2, dict(good, cuda_visible_devices=None)))
    assert not c["cuda_visible_devices"].ok


def test_no_gpus_anywhere_is_fine_for_a_cpu_job_only():
    assert all(
        c.ok
        for c in gpu_visibility(
            "vm", 0, {"cuda_visible_devices": None, "slurm_gpus_on_node": None, "slurm_gpus": None, "nvidia_smi": None}
        )
    )
    assert not all(c.ok for c in gpu_visibility("vm", 1, {"cuda_visible_devices": None, "nvidia_smi": None}))


def test_only_several_nodes_or_gpus_need_the_collective_subprocess():
    assert not needs_collective(1, 0)  # one CPU node: nothing to all_reduce across, no GPU to count
    assert needs_collective(2, 0) and needs_collective(1, 1) and needs_collective(4, 8)


def test_ray_resources_against_bootstrap_spec_and_slots():
    ok = ray_resources("sn1", {"CPU": 2.0, "GPU": 2.0}, {"num_cpus": 2, "num_gpus": 2}, 2, 2)
    assert ok.ok and ok.message == "Ray registered CPU 2, GPU 2"
    bad = ray_resources("sn1", {"CPU": 1.0, "GPU": 1.0}, {"num_cpus": 2, "num_gpus": 2}, 2, 2)
    assert not bad.ok and bad.node == "sn1" and "cpus_per_node" in bad.fix
    for part in (
        "GPU 1 != cluster.gpus_per_node 2",
        "GPU 1 != the 2 the bootstrap gave Ray",
        "CPU 1 != the 2 the bootstrap gave Ray",
        "CPU 1 < the 2 slot(s)",
    ):
        assert part in bad.message


def _rows(layout, phys):
    return [
        {
            "slot": str(s),
            "node": s.node,
            "host": phys[s][0],
            "gpu": phys[s][1],
            "roles": layout.roles_of(s),
            "bundle": i,
            "ip": "10.0.0.1",
        }
        for i, s in enumerate(layout.all_slots())
    ]


def _layout(actor, engines, colocate=False, total=4):
    return Layout(
        nodes=2,
        gpus_per_node=2,
        colocate=colocate,
        actor=tuple(actor),
        critic=(),
        engines=tuple(tuple(e) for e in engines),
        total_slots=total,
        rollout_offset=0 if colocate else 2,
    )


def test_disaggregated_roles_must_not_share_a_physical_gpu():
    s = lambda n, g: Slot(node=n, gpu=g)  # noqa: E731
    ok = _layout([s(0, 0), s(0, 1)], [[s(1, 0)], [s(1, 1)]])
    phys = {sl: (f"sn{sl.node + 1}", str(sl.gpu)) for sl in ok.all_slots()}
    assert all(c.ok for c in role_conflicts(ok, _rows(ok, phys)))
    # An actor on GPU 0 of both nodes with engines from linear slot 2 on: engine 0 lands on sn2 GPU 0 too.
    clash = _layout([s(0, 0), s(1, 0)], [[s(1, 0)], [s(1, 1)]])
    bad = [c for c in role_conflicts(clash, _rows(clash, phys)) if not c.ok]
    assert bad and bad[0].name == "roles" and bad[0].node == "sn2" and "engine 0 shares GPU" in bad[0].message


def test_prefill_decode_groups_are_named_in_the_placement_rows_and_the_roles_check():
    s = lambda n, g: Slot(node=n, gpu=g)  # noqa: E731
    base = _layout([s(0, 0), s(0, 1)], [[s(1, 0)], [s(1, 1)]])
    lay = Layout(
        **{f: getattr(base, f) for f in base.__slots__ if f != "engine_roles"}, engine_roles=("prefill", "decode")
    )
    phys = {sl: (f"sn{sl.node + 1}", str(sl.gpu)) for sl in lay.all_slots()}
    rows = _rows(lay, phys)
    assert [r["roles"] for r in rows if r["node"] == 1] == [["engine0:prefill"], ["engine1:decode"]]
    (ok,) = [c for c in role_conflicts(lay, rows) if c.name == "roles"]
    assert ok.ok and ok.message.endswith("engine groups: prefill 1 engine(s), 1 GPU(s), decode 1 engine(s), 1 GPU(s)")


def test_duplicate_physical_gpus_and_engines_straddling_nodes_are_reported():
    s = lambda n, g: Slot(node=n, gpu=g)  # noqa: E731
    lay = _layout([s(0, 0), s(0, 1), s(1, 0), s(1, 1)], [[s(0, 1), s(1, 0)]], colocate=True)
    phys = {sl: (f"sn{sl.node + 1}", str(sl.gpu)) for sl in lay.all_slots()}
    names = {c.name: c for c in role_conflicts(lay, _rows(lay, phys)) if not c.ok}
    assert "spans nodes" in names["roles"].message
    phys[s(0, 1)] = ("sn1", "0")  # Ray gave two bundles the same GPU
    names = {c.name: c for c in role_conflicts(lay, _rows(lay, phys)) if not c.ok}
    assert names["placement"].node == "sn1" and "('sn1', '0')" in names["placement"].message


def test_bundles_are_pinned_to_their_node_and_ask_one_gpu_each():
    s = lambda n, g: Slot(node=n, gpu=g)  # noqa: E731
    lay = _layout([s(0, 0), s(0, 1), s(1, 0)], [], total=3)
    assert bundle_specs(lay) == [
        {"CPU": 1.0, "GPU": 1.0, "slime_node_0": 0.001},
        {"CPU": 1.0, "GPU": 1.0, "slime_node_0": 0.001},
        {"CPU": 1.0, "GPU": 1.0, "slime_node_1": 0.001},
    ]
    cpu = Layout(
        nodes=2,
        gpus_per_node=0,
        colocate=False,
        actor=(Slot(node=0, gpu=None),),
        critic=(),
        engines=(),
        total_slots=2,
        rollout_offset=0,
    )
    assert bundle_specs(cpu) == [{"CPU": 1.0, "slime_node_0": 0.001}, {"CPU": 1.0, "slime_node_1": 0.001}]
    assert node_rank_of({"CPU": 4.0, "slime_node_3": 1.0}) == 3 and node_rank_of({"CPU": 1.0}) is None


@pytest.mark.parametrize(
    "edits",
    [
        {"train.gpus_per_node": 4, "train.global_batch_size": 128},  # colocated, half of each node
        {
            "train.gpus_per_node": 2,
            "rollout.gpus": 2,
            "rollout.colocate": False,
            "train.parallel.tensor": 1,
            "train.global_batch_size": 128,
        },  # disaggregated, actor on gpu0-1 of both nodes
    ],
)
def test_partial_node_layouts_get_bundles_on_every_node_they_use(edits):
    """train.gpus_per_node < cluster.gpus_per_node: the bundles, the preflight rows and the runtime's
    strategies cover every role's slot (node 1's too), so nothing raises KeyError after the allocation."""
    layout = plan_layout(load(spec(GPU_SPEC, **edits)).spec)
    slots = layout.all_slots()
    role_slots = {*layout.actor, *layout.critic, *(sl for e in layout.engines for sl in e)}
    assert role_slots == set(slots) and {sl.node for sl in slots} == {0, 1}
    per_node = {}
    for b in bundle_specs(layout):
        rank = node_rank_of(b)
        per_node[rank] = per_node.get(rank, 0) + 1
    assert per_node == {n: sum(1 for sl in slots if sl.node == n) for n in (0, 1)}
    # Ray reports physical GPU ids 0.. per node; the k-th slot of a node gets its k-th bundle.
    raw = [
        {
            "host": f"sn{sl.node + 1}",
            "ip": f"10.0.0.{sl.node + 1}",
            "node_id": f"n{sl.node}",
            "gpu_ids": [str(sl.gpu)],
            "cuda_visible_devices": None,
        }
        for sl in slots
    ]
    placement = placement_from_infos(None, layout, raw)
    assert set(placement.slot_bundle) == role_slots
    for sl in role_slots:
        assert placement.strategy(sl).placement_group_bundle_index == placement.slot_bundle[sl]
        assert placement.bundle_of(sl).gpu == str(sl.gpu) and placement.bundle_of(sl).node_rank == sl.node
    rows = placement.to_json()
    assert [r["slot"] for r in rows] == [str(sl) for sl in slots]
    assert all(c.ok for c in role_conflicts(layout, rows)), role_conflicts(layout, rows)


def test_report_files_and_table(tmp_path):
    report = {
        "ok": False,
        "task": 0,
        "job_id": "15",
        "ray_nodes": 2,
        "bad_nodes": ["sn2"],
        "slots": [{"slot": "node0:gpu0"}],
        "nodes": [
            {
                "rank": 0,
                "host": "sn1",
                "ip": "10.77.0.11",
                "gpus": ["0", "1"],
                "cuda": "ok",
                "roles": {"0": ["actor", "engine0"], "1": ["actor"]},
            },
            {"rank": 1, "host": "sn2", "ip": "10.77.0.12", "gpus": [], "cuda": "FAIL", "roles": {}},
        ],
        "checks": [
            {"name": "collective", "ok": False, "node": "sn2", "message": "timed out", "fix": "check the network"}
        ],
    }
    tp = TaskPaths(tmp_path, 0)
    text = write_report(tp, report)
    assert json.loads(tp.preflight_json.read_text()) == report and tp.preflight_txt.read_text() == text
    assert "preflight FAILED" in text and "10.77.0.11" in text and "gpu0: actor, engine0" in text
    assert "FAIL collective [sn2]: timed out" in text and "fix: check the network" in text
    sn2_line = next(line for line in text.splitlines() if "sn2 (rank 1)" in line)
    assert "FAIL" in sn2_line
    assert "preflight PASSED" in render_table(dict(report, ok=True, bad_nodes=[], checks=[]))
    header = next(line for line in text.splitlines() if "node" in line and "IP" in line)
    assert header.index("GPUs") < header.index("CUDA") < header.index("roles")
    sn1_line = next(line for line in text.splitlines() if "sn1 (rank 0)" in line)
    assert "│ ok " in sn1_line and "│ FAIL " in sn2_line
    assert "fake GPUs" not in text
    fake = render_table(dict(report, ok=True, bad_nodes=[], checks=[], fake_gpus=True))
    assert "fake GPUs: running on CPU (cluster.fake_gpus: " in fake
