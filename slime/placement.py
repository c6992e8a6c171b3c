"""Placement: the layout's slots as a Ray placement group, each bundle mapped to (node, GPU).

Shared by the preflight (which checks it) and the runtime (which places ranks and engines with it),
so both see the same slot -> bundle mapping: :func:`bundle_specs`, :func:`reserve` (bounded wait;
the error compares requested and registered resources per node), :func:`map_bundles` /
:func:`map_cpu_bundles`, :func:`create_placement`, the per-actor options, and :func:`slot_device`
(a GPU slot without CUDA is an ``InfraError``, never a silent CPU run, unless ``cluster.fake_gpus``).
Actors sharing a slot split its bundle evenly; CPU threads are divided among actors of one kind.
``ray`` is imported lazily. Shares and thread rules: docs/design-notes.md.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from slime.spec.layout import Layout, Slot, plan_layout
from slime.spec.types import Spec

__all__ = [
    "NODE_RESOURCE",
    "BundleInfo",
    "Placement",
    "PlacementError",
    "bundle_info",
    "bundle_specs",
    "bundle_strategy",
    "create_placement",
    "map_bundles",
    "map_cpu_bundles",
    "node_rank_of",
    "node_resource",
    "normal_priority",
    "placement_from_infos",
    "placement_options",
    "reserve",
    "slot_device",
    "torch_threads",
]

NODE_RESOURCE = "slime_node_"
PIN = 0.001  # share of a node's marker resource one bundle takes (up to 1000 bundles per node)


class PlacementError(RuntimeError):
    """The placement group could not be created or mapped; the message lists every number involved."""


def node_resource(rank: int) -> str:
    return f"{NODE_RESOURCE}{rank}"


def node_rank_of(resources: dict[str, float]) -> int | None:
    """The node rank a Ray node registered (its ``slime_node_<rank>`` resource), if any."""
    for key in resources:
        if key.startswith(NODE_RESOURCE) and key[len(NODE_RESOURCE) :].isdigit():
            return int(key[len(NODE_RESOURCE) :])
    return None


def bundle_specs(layout: Layout) -> list[dict[str, float]]:
    """One bundle per slot, in ``layout.all_slots()`` order, pinned to the slot's node."""
    out = []
    for slot in layout.all_slots():
        bundle: dict[str, float] = {"CPU": 1.0, node_resource(slot.node): PIN}
        if not layout.cpu_only:
            bundle["GPU"] = 1.0
        out.append(bundle)
    return out


@dataclass(frozen=True, kw_only=True, slots=True)
class BundleInfo:
    """What the probe task in one bundle saw."""

    bundle: int  # index in the placement group
    node_rank: int  # the node the bundle was pinned to
    host: str
    ip: str
    node_id: str
    gpu_ids: tuple[str, ...]  # Ray's GPU ids for the bundle (physical ids on the node)
    cuda_visible_devices: str | None

    @property
    def gpu(self) -> str | None:
        return self.gpu_ids[0] if self.gpu_ids else None

    def to_json(self) -> dict[str, Any]:
        return {
            "bundle": self.bundle,
            "node_rank": self.node_rank,
            "host": self.host,
            "ip": self.ip,
            "node_id": self.node_id,
            "gpu_ids": list(self.gpu_ids),
            "cuda_visible_devices": self.cuda_visible_devices,
        }


def bundle_info() -> dict[str, Any]:
    """Where the calling Ray task runs: host, IP, node id, its GPU ids and CUDA_VISIBLE_DEVICES."""
    import ray

    ctx = ray.get_runtime_context()
    return {
        "host": socket.gethostname().split(".")[0],
        "ip": ray.util.get_node_ip_address(),
        "node_id": ctx.get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "pid": os.getpid(),
    }


def _gpu_key(info: BundleInfo) -> tuple[int, int | str]:
    g = info.gpu
    if g is None:
        return (info.node_rank, -1)
    return (info.node_rank, int(g) if g.isdigit() else g)


@dataclass(kw_only=True)
class Placement:
    """The placement group plus the slot → bundle mapping."""

    layout: Layout
    pg: Any  # ray.util.placement_group.PlacementGroup
    bundles: tuple[BundleInfo, ...]  # ordered by (node rank, GPU id)
    slot_bundle: dict[Slot, int] = field(default_factory=dict)  # slot -> bundle index in the group

    def bundle_of(self, slot: Slot) -> BundleInfo:
        index = self.slot_bundle[slot]
        return next(b for b in self.bundles if b.bundle == index)

    def strategy(self, slot: Slot) -> Any:
        """The Ray scheduling strategy that puts a task/actor in ``slot``'s bundle."""
        return bundle_strategy(self.pg, self.slot_bundle[slot])

    def to_json(self) -> list[dict[str, Any]]:
        rows = []
        for slot in self.layout.all_slots():
            b = self.bundle_of(slot)
            rows.append(
                {
                    "slot": str(slot),
                    "node": slot.node,
                    "slot_gpu": slot.gpu,
                    "host": b.host,
                    "ip": b.ip,
                    "gpu": b.gpu,
                    "bundle": b.bundle,
                    "roles": self.layout.roles_of(slot),
                }
            )
        return rows

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)


def _resources_by_rank() -> dict[int, dict[str, float]]:
    import ray

    out = {}
    for n in ray.nodes():
        if n.get("Alive"):
            rank = node_rank_of(n.get("Resources", {}))
            if rank is not None:
                out[rank] = {k: v for k, v in n["Resources"].items() if k in ("CPU", "GPU")}
    return out


def reserve(layout: Layout, *, timeout_s: float, name: str = "") -> Any:
    """Create the placement group for ``layout`` and wait for it (PlacementError after ``timeout_s``)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    specs = bundle_specs(layout)
    pg = placement_group(specs, strategy="PACK", name=name)
    try:
        ray.get(pg.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(pg)
        need: dict[int, dict[str, float]] = {}
        for slot, b in zip(layout.all_slots(), specs):
            per = need.setdefault(slot.node, {})
            for k in ("CPU", "GPU"):
                per[k] = per.get(k, 0) + b.get(k, 0)
        have = _resources_by_rank()
        lines = [
            f"node {r}: needs {_fmt(need[r])}, registered {_fmt(have[r]) if r in have else 'nothing (not in Ray)'}"
            for r in sorted(need)
        ]
        raise PlacementError(
            f"the placement group of {len(specs)} bundle(s) was not ready after {timeout_s:.0f} s; "
            + "; ".join(lines)
            + ". Fix: raise cluster.cpus_per_node (one CPU per slot) or check "
            "that every node gave Ray its GPUs"
        ) from None
    return pg


def _fmt(res: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(res.items())) or "nothing"


def bundle_strategy(pg: Any, index: int) -> Any:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=index)


def placement_from_infos(pg: Any, layout: Layout, raw: list[dict[str, Any]]) -> Placement:
    """The mapping from what a task in each bundle reported (``raw[i]`` from bundle ``i``)."""
    slots = layout.all_slots()
    infos = [
        BundleInfo(
            bundle=i,
            node_rank=slots[i].node,
            host=r["host"],
            ip=r["ip"],
            node_id=r["node_id"],
            gpu_ids=tuple(r["gpu_ids"]),
            cuda_visible_devices=r["cuda_visible_devices"],
        )
        for i, r in enumerate(raw)
    ]
    ordered = tuple(sorted(infos, key=_gpu_key))
    mapping: dict[Slot, int] = {}
    for node in sorted({s.node for s in slots}):
        node_slots = sorted((s for s in slots if s.node == node), key=lambda s: -1 if s.gpu is None else s.gpu)
        node_bundles = [b for b in ordered if b.node_rank == node]
        for slot, b in zip(node_slots, node_bundles):
            mapping[slot] = b.bundle
    return Placement(layout=layout, pg=pg, bundles=ordered, slot_bundle=mapping)


def map_bundles(pg: Any, layout: Layout, *, timeout_s: float = 60.0) -> Placement:
    """Run one tiny task in every bundle (asking for the bundle's GPU) and map slots to bundles.

    Tasks rather than actors, and one node's bundles probed one after another: Ray then runs them
    all in one worker process per node (it resets CUDA_VISIBLE_DEVICES per task), instead of
    starting one process per bundle, which costs far more.
    """
    import ray

    probe = ray.remote(bundle_info)
    slots = layout.all_slots()
    queues = {n: [i for i, s in enumerate(slots) if s.node == n] for n in sorted({s.node for s in slots})}

    def submit(i: int) -> Any:
        return probe.options(
            num_cpus=1, num_gpus=0 if layout.cpu_only else 1, scheduling_strategy=bundle_strategy(pg, i)
        ).remote()

    pending: dict[Any, tuple[int, int]] = {}  # ref -> (node, bundle index)
    for node, queue in queues.items():
        i = queue.pop(0)
        pending[submit(i)] = (node, i)
    raw: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            raise PlacementError(
                f"the bundle probes did not answer within {timeout_s:.0f} s ({len(raw)} of {len(slots)} answered)"
            )
        node, i = pending.pop(ready[0])
        raw[i] = ray.get(ready[0])
        if queues[node]:
            j = queues[node].pop(0)
            pending[submit(j)] = (node, j)
    return placement_from_infos(pg, layout, [raw[i] for i in range(len(slots))])


def map_cpu_bundles(pg: Any, layout: Layout) -> Placement:
    """:func:`map_bundles` for a CPU-only layout, from Ray's placement group table instead of probes.

    A CPU bundle has no GPU ids to ask a task for, so where each bundle sits (its node, that node's
    hostname and IP) is all there is to learn, and the GCS knows it. The probe would start a Python
    worker per node that then only idles. The preflight still probes every bundle.
    """
    import ray
    from ray.util.placement_group import placement_group_table

    if not layout.cpu_only:
        raise ValueError("map_cpu_bundles: the layout has GPU slots; their GPU ids need map_bundles")
    where = placement_group_table(pg).get("bundles_to_node_id") or {}
    nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    raw = []
    for i in range(len(layout.all_slots())):
        node = nodes.get(where.get(i, ""))
        if node is None:
            raise PlacementError(f"bundle {i} of the placement group is on no live Ray node ({where.get(i)!r})")
        raw.append(
            {
                "host": node["NodeManagerHostname"].split(".")[0],
                "ip": node["NodeManagerAddress"],
                "node_id": node["NodeID"],
                "gpu_ids": [],
                "cuda_visible_devices": None,
            }
        )
    return placement_from_infos(pg, layout, raw)


def create_placement(spec: Spec, *, timeout_s: float = 120.0) -> Placement:
    """Reserve and map the placement group of ``plan_layout(spec)`` (for the runtime)."""
    layout = plan_layout(spec)
    t0 = time.monotonic()
    pg = reserve(layout, timeout_s=timeout_s)
    if layout.cpu_only:
        return map_cpu_bundles(pg, layout)
    return map_bundles(pg, layout, timeout_s=max(10.0, timeout_s - (time.monotonic() - t0)))


# ----------------------------------------------------------------------------- one actor on a slot
def _share(n_roles: int) -> float:
    # Slightly under 1/n so float rounding never makes the shares exceed the bundle.
    return max(0.01, int(100 / max(1, n_roles)) / 100 - 0.01)


def placement_options(layout: Layout, placement: Placement | None, slot: Slot) -> dict[str, Any]:
    """``num_cpus`` / ``num_gpus`` / ``scheduling_strategy`` for one actor on ``slot``."""
    share = _share(len(layout.roles_of(slot)))
    opts: dict[str, Any] = {"num_cpus": share, "num_gpus": 0 if slot.gpu is None else share}
    if placement is not None:
        opts["scheduling_strategy"] = placement.strategy(slot)
    return opts


def torch_threads(layout: Layout, slot: Slot, kind: str, cpus_per_node: int | None) -> int:
    """Intra-op threads for an actor of ``kind`` ("train" or "engine") on ``slot``."""
    cpus = cpus_per_node or os.cpu_count() or 1
    cpus = min(cpus, os.cpu_count() or cpus)
    if layout.cpu_split:  # trainer and engines run at once: the node's cores are divided between them
        engine_cpus = max(1, cpus // 2)
        cpus = engine_cpus if kind == "engine" else max(1, cpus - engine_cpus)
    if kind == "engine":
        same = sum(1 for e in layout.engines if e[0].node == slot.node)
    else:
        same = sum(1 for s in layout.actor if s.node == slot.node)
    return max(1, cpus // max(1, same))


def normal_priority() -> None:
    """Undo Ray's worker niceness (15 by default) for a compute actor, when allowed.

    At nice 15 a trainer or engine gets almost no CPU as soon as anything else runs on the node
    (see docs/design-notes.md, Numbers). Raising priority back to 0
    needs CAP_SYS_NICE (root); without it the actor keeps Ray's niceness.
    """
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except (PermissionError, OSError):
        pass


def slot_device(gpu_slot: bool, *, fake_gpus: bool, what: str) -> str:
    """``"cuda:0"`` (the bundle's GPU: Ray narrows CUDA_VISIBLE_DEVICES to it) for a GPU slot, ``"cpu"`` for a
    CPU slot or with ``cluster.fake_gpus``. ``what`` names the caller in the error ("actor rank 1", "engine 0").

    Raises ``InfraError`` (exit 3) when a GPU slot has no usable CUDA: torch without CUDA, no driver, or no
    device visible to this process. The preflight catches this first; this is the guard if it was skipped.
    """
    if not gpu_slot or fake_gpus:
        return "cpu"
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda:0"
    from slime.core.errors import InfraError

    host = socket.gethostname().split(".")[0]
    try:
        import ray

        # get_gpu_ids() would start a local Ray in a process that has none (a plain script or test)
        gpus = [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
    except Exception:  # noqa: BLE001 - outside a Ray worker: no GPU ids to name
        gpus = []
    why = "torch is a CPU-only build" if torch.version.cuda is None else "no CUDA device is usable in this process"
    raise InfraError(
        f"{what} on {host} sits on a GPU slot (Ray GPU {','.join(gpus) or '?'}, CUDA_VISIBLE_DEVICES="
        f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}) but CUDA is not available there: {why}. Fix: check the "
        f"node's NVIDIA driver and torch's CUDA build, or exclude the node (cluster.slurm.exclude: [{host}]); on a "
        "test cluster whose GPUs are placeholders, set cluster.fake_gpus: true to run on CPU"
    )
