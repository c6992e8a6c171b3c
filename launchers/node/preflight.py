"""The gating preflight: run on the Ray head after every node joined, before any training.

Checks, each naming the node and the fix (decisions in ``preflight_checks``): ``ray_nodes``, ``auth`` (the head
refuses a call without the job's secret), ``gpu_count`` / ``cuda_visible_devices``, ``cuda`` (a probe in every GPU
bundle), ``ray_resources``, ``bundles`` / ``placement`` / ``roles`` (the placement group the runtime will use),
``collective`` (gloo across nodes), ``collective_nccl`` and ``external_engine`` (``preflight_external``). The
collective's go-ahead comes first, so it runs while the placement group is made and probed; a single CPU-only node
skips it. ``cluster.fake_gpus`` skips the CUDA probe, saying so. ``ray`` is imported lazily; :func:`write_report`
writes preflight.json and preflight.txt. Check by check: docs/design-notes.md.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from launchers.node.authcheck import auth_checks
from launchers.node.context import NodeContext
from launchers.node.preflight_checks import (
    SOLO_SKIP,
    Check,
    PreflightResult,
    cuda_checks,
    gpu_visibility,
    needs_collective,
    parse_ids,
    ray_resources,
    render_table,
    role_conflicts,
    write_report,
)
from launchers.node.preflight_external import external_checks
from launchers.node.preflight_tasks import cuda_probe, nccl_rank
from slime.core.ports import PortBlock
from slime.core.rendezvous import Rendezvous
from slime.placement import Placement, PlacementError, bundle_strategy, map_bundles, node_rank_of, reserve
from slime.spec.layout import Layout, plan_layout
from slime.spec.types import Spec

__all__ = [
    "Check",
    "PreflightResult",
    "gpu_visibility",
    "render_table",
    "role_conflicts",
    "run_preflight",
    "write_report",
]


def _ray_nodes() -> dict[int, dict[str, Any]]:
    import ray

    out = {}
    for n in ray.nodes():
        rank = node_rank_of(n.get("Resources", {})) if n.get("Alive") else None
        if rank is not None:
            out[rank] = n
    return out


def _collective_check(
    name: str, backend: str, results: list[dict[str, Any]], world: int, hosts: list[str]
) -> tuple[dict[str, Any], Check]:
    expected = world * (world + 1) / 2
    ok_results = sorted((r for r in results if "error" not in r), key=lambda r: r["rank"])
    errors = [r for r in results if "error" in r]
    missing = world - len(results)
    bad = [r for r in ok_results if r["value"] != expected]
    info = {"backend": backend, "world": world, "expected": expected, "results": ok_results, "errors": errors}
    if errors or bad or missing:
        parts = [f"{r['host']}: {r['error']}" for r in errors]
        parts += [f"{r['host']} got {r['value']:g}, expected {expected:g}" for r in bad]
        if missing:
            parts.append(f"{missing} rank(s) never answered")
        node = (errors or bad or [{"host": hosts[0] if hosts else None}])[0]["host"]
        return info, Check(
            name=name,
            ok=False,
            node=node,
            message=f"{backend} all_reduce over {world} rank(s) failed: " + "; ".join(parts),
            fix="check that the nodes reach each other on the interface Ray uses "
            "(cluster.network_interface) and that no firewall blocks the port range",
        )
    slowest = max((r["seconds"] for r in ok_results), default=0.0)
    return info, Check(
        name=name,
        ok=True,
        message=f"{backend} all_reduce over {world} rank(s) on {len(set(hosts))} node(s) = "
        f"{expected:g} as expected ({slowest:.2f} s)",
    )


def _gather_collective(rdv: Rendezvous, world: int, timeout_s: float) -> dict[int, dict[str, Any]]:
    """The nodes' collective results (``launchers.node.collective``), waiting at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = rdv.collectives(world)
        if len(got) == world or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


class _Laps:
    """Seconds per preflight stage (``report["timings"]``)."""

    def __init__(self) -> None:
        self.t0 = self.mark = time.monotonic()
        self.timings: dict[str, float] = {}

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.timings[name] = round(now - self.mark, 3)
        self.mark = now


def _host_names(ctx: NodeContext, node_meta: dict) -> dict[int, str]:
    """Each node rank's host: its rendezvous record, else the launcher's host list, else ``rank<r>``."""
    return {
        r: (node_meta.get(r) or {}).get("host") or (ctx.hostnames[r] if r < len(ctx.hostnames) else f"rank{r}")
        for r in range(ctx.num_nodes)
    }


def _gloo_collective(solo: bool, probes: dict, hosts: dict[int, str], world: int) -> tuple[dict, Check]:
    """The gloo all_reduce's report entry and check; skipped when no collective ran (``solo``)."""
    if solo:
        skipped = {"backend": "gloo", "world": 1, "skipped": SOLO_SKIP}
        return skipped, Check(name="collective", ok=True, message=f"skipped: {SOLO_SKIP}")
    return _collective_check(
        "collective", "gloo", _collective_results(probes, hosts), world, [hosts[r] for r in sorted(hosts)]
    )


def _result(
    ctx: NodeContext, lap: _Laps, checks: list[Check], fake, *, ray_nodes, nodes, slots, collective, cuda, nccl
):
    """The PreflightResult and its ``preflight.json`` report."""
    ok = all(c.ok for c in checks)
    report = {
        "ok": ok,
        "task": ctx.task,
        "job_id": ctx.job_id,
        "instance": ctx.instance,
        "created": time.time(),
        "seconds": round(time.monotonic() - lap.t0, 3),
        "ray_nodes": ray_nodes,
        "nodes": nodes,
        "slots": slots,
        "collective": collective,
        "checks": [asdict(c) for c in checks],
        "timings": lap.timings,
        "fake_gpus": fake,
        "cuda": cuda,
    }
    if nccl is not None:
        report["nccl"] = nccl
    result = PreflightResult(ok=ok, checks=checks, report=report)
    report["bad_nodes"] = result.bad_nodes
    if not ok:
        report["error"] = result.error
    return result


def run_preflight(
    spec: Spec, ctx: NodeContext, *, rdv: Rendezvous, ports: PortBlock, timeout_s: float
) -> PreflightResult:
    """Run every check (never stopping at the first failure where later ones still make sense).

    ``rdv``: the job's rendezvous (the nodes' records: host, CPUs/GPUs given to Ray, SLURM's GPU
    variables; the collective's go-ahead and results); ``ports``: the job's port block (the NCCL
    rendezvous port is in it). Needs a connected Ray driver. Writes nothing: see ``write_report``.
    """
    lap = _Laps()
    layout = plan_layout(spec)
    node_meta = rdv.nodes(ctx.num_nodes)
    nodes = _ray_nodes()
    world = ctx.num_nodes
    hosts = _host_names(ctx, node_meta)
    checks = [
        Check(
            name="ray_nodes",
            ok=len(nodes) == world,
            message=f"Ray sees {len(nodes)} of {world} node(s)",
            node=next((hosts[r] for r in range(world) if r not in nodes), None),
        )
    ]
    checks += auth_checks((node_meta.get(0) or {}).get("ip") or ctx.hostname, ports, hosts[0])
    coll_timeout = min(timeout_s, 60.0)
    solo = not needs_collective(world, spec.cluster.gpus_per_node)
    if not solo:
        rdv.go()  # the nodes' collective subprocesses (torch already imported) join the gloo all_reduce now
    fake = spec.cluster.fake_gpus
    pg, placement, rows, cuda_refs = _placement_stage(layout, node_meta, nodes, checks, lap, timeout_s, fake)

    # solo: the bootstrap started no collective subprocess (see needs_collective), so there is nothing to gather
    probes = {} if solo else _gather_collective(rdv, world, coll_timeout + 10)
    if not solo:
        lap("collective")
    checks += _node_checks(spec, layout, node_meta, nodes, probes, hosts)  # also names hosts as the probes did
    if solo:
        checks.append(Check(name="gpu_count", ok=True, node=hosts[0], message="spec wants 0 GPU(s): not probed"))
    collective, check = _gloo_collective(solo, probes, hosts, world)
    checks.append(check)

    cuda, nccl = _gpu_stage(layout, placement, cuda_refs, checks, lap, ports, coll_timeout, fake)
    external, ext_checks = external_checks(spec)  # engines the job did not start: reachable, right model, updates
    checks += ext_checks
    if pg is not None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(pg)

    nodes_rows = [_node_row(r, hosts, nodes, probes, node_meta, rows, spec, checks) for r in range(world)]
    parts = dict(ray_nodes=len(nodes), nodes=nodes_rows, slots=rows, collective=collective, cuda=cuda, nccl=nccl)
    result = _result(ctx, lap, checks, fake, **parts)
    if external:
        result.report["external"] = external
    return result


def _gpu_stage(
    layout: Layout,
    placement: Placement | None,
    cuda_refs: list[Any],
    checks: list[Check],
    lap: _Laps,
    ports: PortBlock,
    timeout_s: float,
    fake: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The CUDA probes' results and checks, then NCCL once every GPU bundle has working CUDA (checks
    appended to ``checks``). Returns ``(cuda results, nccl report or None)``."""
    cuda: list[dict[str, Any]] = []
    if cuda_refs and placement is not None:
        cuda = _gather(cuda_refs, timeout_s)
        checks += cuda_checks(cuda, [(b.bundle, b.host) for b in placement.bundles])
        lap("cuda")
    elif fake and not layout.cpu_only:
        checks.append(
            Check(
                name="cuda",
                ok=True,
                message=f"not checked: cluster.fake_gpus (the {len(layout.all_slots())} GPU slot(s) are "
                "placeholders; trainers and engines run on CPU)",
            )
        )
    nccl: dict[str, Any] | None = None
    if cuda and placement is not None and all(c.ok for c in checks if c.name == "cuda"):
        nccl, check = _nccl(placement, ports, timeout_s)
        checks.append(check)
        lap("nccl")
    return cuda, nccl


def _placement_stage(
    layout: Layout,
    node_meta: dict[int, dict[str, Any]],
    nodes: dict[int, dict[str, Any]],
    checks: list[Check],
    lap: _Laps,
    timeout_s: float,
    fake: bool,
) -> tuple[Any, Placement | None, list[dict[str, Any]], list[Any]]:
    """Reserve the layout's placement group, map its bundles and check them (appended to ``checks``);
    starts the CUDA probes (they run while the collective is gathered). Returns
    ``(pg, placement, slot rows, CUDA probe refs)``; ``pg``/``placement`` are None if it cannot be placed."""
    pg = placement = None
    rows: list[dict[str, Any]] = []
    cuda_refs: list[Any] = []
    try:
        pg = reserve(layout, timeout_s=timeout_s)
        lap("placement_group")
        placement = map_bundles(pg, layout, timeout_s=timeout_s)
        lap("bundle_probes")
        rows = placement.to_json()
        if not layout.cpu_only and not fake:
            cuda_refs = _start_cuda_probes(placement)
        checks.append(_bundle_check(layout, placement, node_meta, nodes))
        checks += role_conflicts(layout, rows)
    except PlacementError as exc:
        checks.append(
            Check(
                name="placement",
                ok=False,
                message=str(exc),
                node=None,
                fix="raise cluster.cpus_per_node (one CPU per slot), or check the nodes' GPUs",
            )
        )
    return pg, placement, rows, cuda_refs


def _bundle_check(
    layout: Layout, placement: Placement, node_meta: dict[int, dict[str, Any]], nodes: dict[int, dict[str, Any]]
) -> Check:
    """Each bundle on its pinned node, with exactly one of that node's visible GPUs (GPU layouts)."""
    wrong: list[tuple[str, str]] = []  # (host, what is wrong)
    for b in placement.bundles:
        cvd = parse_ids((node_meta.get(b.node_rank) or {}).get("env", {}).get("CUDA_VISIBLE_DEVICES"))
        if nodes.get(b.node_rank, {}).get("NodeID") != b.node_id:
            wrong.append((b.host, f"bundle {b.bundle} is on {b.host}, not on node {b.node_rank}"))
        elif not layout.cpu_only and (len(b.gpu_ids) != 1 or (cvd and b.gpu_ids[0] not in cvd)):
            wrong.append(
                (
                    b.host,
                    f"bundle {b.bundle} on {b.host} got GPU(s) {list(b.gpu_ids)} (node's "
                    f"CUDA_VISIBLE_DEVICES: {','.join(cvd) or 'unset'})",
                )
            )
    return Check(
        name="bundles",
        ok=not wrong,
        node=wrong[0][0] if wrong else None,
        message="; ".join(w for _, w in wrong)
        if wrong
        else f"{len(placement.bundles)} bundle(s) on their pinned nodes"
        + ("" if layout.cpu_only else " with one of the node's GPUs each"),
    )


def _node_checks(
    spec: Spec,
    layout: Layout,
    node_meta: dict[int, dict[str, Any]],
    nodes: dict[int, dict[str, Any]],
    probes: dict[int, dict[str, Any]],
    hosts: dict[int, str],
) -> list[Check]:
    """Per node: the GPUs it shows (nvidia-smi, torch, SLURM's variables) and what it gave Ray.
    Updates ``hosts`` with the names the nodes' probes reported."""
    checks: list[Check] = []
    slots_per_node = {r: sum(1 for s in layout.all_slots() if s.node == r) for r in hosts}
    for r in hosts:
        meta, p = node_meta.get(r) or {}, probes.get(r, {})
        host = hosts[r] = p.get("host") or hosts[r]
        env = meta.get("env", {})
        if "nvidia_smi" in p or "torch_cuda" in p:
            seen = {
                **p,
                "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
                "slurm_gpus_on_node": env.get("SLURM_GPUS_ON_NODE"),
                "slurm_gpus": env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"),
            }
            checks += gpu_visibility(host, spec.cluster.gpus_per_node, seen, fake_gpus=spec.cluster.fake_gpus)
        if r in nodes:
            checks.append(
                ray_resources(host, nodes[r].get("Resources", {}), meta, spec.cluster.gpus_per_node, slots_per_node[r])
            )
    return checks


def _collective_results(probes: dict[int, dict[str, Any]], hosts: dict[int, str]) -> list[dict[str, Any]]:
    """Every node's collective result, a node that sent none as an error naming its log."""
    results = [dict(p, host=hosts[r]) for r, p in probes.items()]
    for r in hosts:
        if r not in probes:
            results.append(
                {
                    "rank": r,
                    "host": hosts[r],
                    "error": f"no result from this node's collective process (see {hosts[r]}'s log)",
                }
            )
    return results


def _start_cuda_probes(placement: Placement) -> list[Any]:
    """One ``cuda_probe`` task per GPU bundle (refs; see :func:`_gather`)."""
    import ray

    task = ray.remote(cuda_probe)
    return [
        task.options(num_cpus=1, num_gpus=1, scheduling_strategy=bundle_strategy(placement.pg, b.bundle)).remote(
            bundle=b.bundle
        )
        for b in placement.bundles
    ]


def _gather(refs: list[Any], timeout_s: float) -> list[dict[str, Any]]:
    """The answers of the tasks that finished within ``timeout_s`` (the others are cancelled)."""
    import ray

    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in pending:
        ray.cancel(ref, force=True)
    return [ray.get(r) for r in ready]


def _nccl(placement: Placement, ports: PortBlock, timeout_s: float) -> tuple[dict[str, Any], Check]:
    import ray

    members = list(placement.bundles)  # ordered by node, then GPU: rank 0 is on node 0 (the head)
    task = ray.remote(nccl_rank)
    refs = [
        task.options(num_cpus=1, num_gpus=1, scheduling_strategy=bundle_strategy(placement.pg, b.bundle)).remote(
            rank=i, world=len(members), addr=members[0].ip, port=ports.nccl, timeout_s=timeout_s
        )
        for i, b in enumerate(members)
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s + 30)
    results = [ray.get(r) for r in ready]
    return _collective_check("collective_nccl", "nccl", results, len(members), [b.host for b in members])


def _node_row(
    r: int,
    hosts: dict[int, str],
    nodes: dict[int, Any],
    probes: dict[int, Any],
    meta: dict[int, Any],
    rows: list[dict[str, Any]],
    spec: Spec,
    checks: list[Check],
) -> dict[str, Any]:
    p = probes.get(r, {})
    env = (meta.get(r) or {}).get("env", {})
    res = nodes.get(r, {}).get("Resources", {})
    mine = [row for row in rows if row["node"] == r]
    return {
        "rank": r,
        "host": hosts.get(r),
        "ip": p.get("ip") or (meta.get(r) or {}).get("ip"),
        "gpus_expected": spec.cluster.gpus_per_node,
        "gpus": [row["gpu"] for row in mine if row["gpu"] is not None],
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "slurm_gpus": env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"),
        "nvidia_smi": p.get("nvidia_smi"),
        "torch_cuda": p.get("torch_cuda"),
        "ray": {"CPU": res.get("CPU"), "GPU": res.get("GPU", 0)},
        "roles": {(row["gpu"] if row["gpu"] is not None else "cpu"): row["roles"] for row in mine},
        "cuda": _cuda_status(hosts.get(r), spec, checks),
    }


def _cuda_status(host: str | None, spec: Spec, checks: list[Check]) -> str | None:
    """The node's CUDA column: fake (cluster.fake_gpus), FAIL (its cuda or gpu_count check failed), ok; None
    for a CPU job or when the probes did not run (the placement failed)."""
    if spec.cluster.gpus_per_node == 0:
        return None
    if spec.cluster.fake_gpus:
        return "fake"
    mine = [c for c in checks if c.name in ("cuda", "gpu_count") and c.node == host]
    if any(not c.ok for c in mine):
        return "FAIL"
    return "ok" if any(c.name == "cuda" and c.ok for c in checks) else None
