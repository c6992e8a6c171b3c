"""The SGLang backend started the way the runtime starts it: with a real Ray placement group.

SGLang needs GPUs, so a stand-in replaces it: the command builder returns commands
that run the built-in engine server (same ``/health`` and HTTP API), each behind a
``sh -c`` that first logs the process's ``CUDA_VISIBLE_DEVICES`` and ``--base-gpu-id``.
Everything else is real: a local Ray with 4 logical GPUs and the resources of two
slime nodes (``slime_node_0``/``_1``: the two layout nodes share this machine, so node 1's
slots get physical GPU ids 2 and 3 while their slot indices are 0 and 1), the placement
group and bundle probe (``slime.placement.reserve`` / ``map_bundles``), one process actor per
engine node, the per-job port block, the log dir and ``stop``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")

from slime.backends.sglang import launch  # noqa: E402
from slime.backends.sglang.backend import SGLangRolloutBackend  # noqa: E402
from slime.placement import map_bundles, reserve  # noqa: E402
from slime.spec.layout import Layout, Slot  # noqa: E402
from slime.spec.load import load_spec  # noqa: E402
from tests.fixtures.tiny_models import SMALL  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)

LAYOUT = Layout(
    nodes=2,
    gpus_per_node=2,
    colocate=False,
    actor=(Slot(node=0, gpu=0),),
    critic=(),
    engines=((Slot(node=0, gpu=1),), (Slot(node=1, gpu=0),), (Slot(node=1, gpu=1),)),
    total_slots=4,
    rollout_offset=1,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def ray_init_kwargs():
    """The module's Ray (tests/fixtures/local_ray.py): 4 logical GPUs and two slime nodes' resources."""
    return {"num_cpus": 4, "num_gpus": 4, "resources": {"slime_node_0": 1.0, "slime_node_1": 1.0}}


@pytest.fixture(scope="module")
def tiny(tiny_model) -> Path:
    return tiny_model(**SMALL)


def test_engines_start_through_node_actors_with_node_ips_gpus_ports_and_logs(local_ray, tiny, tmp_path):
    spec = load_spec(ROOT / "specs" / "quickstart.yaml").tasks[0].spec
    placement = map_bundles(reserve(LAYOUT, timeout_s=60), LAYOUT)
    built = {}

    def stand_in(spec, layout, hosts=None, port_base=launch.ENGINE_PORT_BASE):
        """launch.engine_commands' shape (hosts, ports, --base-gpu-id), the built-in engine as the server.

        Ports count engines job-wide, not per node: both layout nodes are this machine (one IP)."""
        cmds = []
        for i, slots in enumerate(layout.engines):
            node = slots[0].node
            port = port_base + launch.PORT_STRIDE * i
            script = (
                'echo "CVD=$CUDA_VISIBLE_DEVICES BASE=$2"; exec "$3" -m slime.backends.rollout.builtin.server '
                f"--model-path {tiny} --host {hosts[node]} --port {port} --num-threads 1 --seed 0"
            )
            argv = ("sh", "-c", script, "sh", "--base-gpu-id", str(slots[0].gpu), sys.executable)
            cmds.append(
                launch.EngineCommand(
                    engine=i,
                    node_rank=0,
                    nnodes=1,
                    node=node,
                    host=hosts[node],
                    gpus=tuple(s.gpu for s in slots),
                    port=port,
                    ports=(port, port + 1),
                    argv=argv,
                )
            )
        built.update(hosts=hosts, port_base=port_base)
        return cmds

    log_dir = tmp_path / "run" / "engines"
    backend = SGLangRolloutBackend(command_builder=stand_in, router=False)
    pids: list[int] = []
    try:
        urls = backend.start(spec, LAYOUT, placement, tiny, log_dir=log_dir)
        ip = {b.node_rank: b.ip for b in placement.bundles}
        assert built["hosts"] == [ip[0], ip[1]]
        base = built["port_base"] - launch.PORT_STRIDE  # the router's port: the job's block base
        assert base == next(launch.port_blocks(str(log_dir)))
        assert urls == [f"http://{ip[0]}:{base + 10}", f"http://{ip[1]}:{base + 20}", f"http://{ip[1]}:{base + 30}"]
        assert backend.health() == dict.fromkeys(urls, True)
        assert sorted(backend.nodes) == [0, 1] and backend.processes == []  # nothing started by the driver
        pids = [pid for a in backend.nodes.values() for pid in ray.get(a.start.remote([], str(log_dir), 1))]
        assert len(pids) == 3
        for i, slots in enumerate(LAYOUT.engines):
            name = f"engine{i}"
            first = (log_dir / f"{name}.log").read_text().splitlines()[1]
            physical = ",".join(g for s in slots for g in placement.bundle_of(s).gpu_ids)
            assert first == f"CVD={physical} BASE=0", (name, first)
        # node 1's slots 0,1 sit on physical GPUs 2,3 here: the slot index is not the id
        assert {placement.bundle_of(s).gpu for s in (LAYOUT.engines[1][0], LAYOUT.engines[2][0])} == {"2", "3"}
    finally:
        backend.stop()
        placement.remove()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
    assert backend.nodes == {}


# train.async on two CPU nodes: the trainer's slot (part 0) and the engines' (part 1) on each node
CPU_LAYOUT = Layout(
    nodes=2,
    gpus_per_node=0,
    colocate=False,
    actor=(Slot(node=0, gpu=None), Slot(node=1, gpu=None)),
    critic=(),
    engines=((Slot(node=0, gpu=None, part=1),), (Slot(node=1, gpu=None, part=1),)),
    total_slots=4,
    rollout_offset=0,
    cpu_split=True,
)


def test_a_cpu_layout_is_mapped_from_the_placement_table_as_the_probes_map_it(local_ray):
    """The runtime maps a CPU-only layout's bundles from Ray's placement group table (no probe task); the
    result is the probes' mapping: the same slot -> bundle, node ids, hosts and IPs, and no GPU ids."""
    from slime.placement import map_cpu_bundles

    assert CPU_LAYOUT.cpu_only
    pg = reserve(CPU_LAYOUT, timeout_s=60)
    try:
        probed, read = map_bundles(pg, CPU_LAYOUT), map_cpu_bundles(pg, CPU_LAYOUT)
        assert read.slot_bundle == probed.slot_bundle and len(read.slot_bundle) == 4
        assert read.to_json() == probed.to_json()
        assert [(b.bundle, b.node_rank, b.node_id, b.host, b.ip, b.gpu_ids) for b in read.bundles] == [
            (b.bundle, b.node_rank, b.node_id, b.host, b.ip, ()) for b in probed.bundles
        ]
    finally:
        read.remove()
    with pytest.raises(ValueError, match="GPU slots"):
        map_cpu_bundles(None, LAYOUT)
