"""``slime-submit clusters check NAME`` for SLURM: does the cluster match what the profile says?

Asks slurmctld (``scontrol show partition`` / ``node``, what ``sinfo`` summarises) whether each
partition the profile names exists, its nodes have the GPUs (and GRES type) and CPUs the profile
says, and the profile's time limit is within the partition's MaxTime. One row per fact, each naming
the profile field and its file:line. Not checked: account/QoS/reservation access (sacctmgr needs
slurmdbd) or that the container runtime and modules exist on the nodes.
"""

from __future__ import annotations

from launchers.slurm.cluster import NodeInfo, partition_nodes, scontrol_records
from launchers.slurm.hooks import seconds
from slime.core.errors import InfraError
from slime.spec.clusters import Site, SiteCheck

__all__ = ["check_site"]


def _row(site: Site, check: str, rel: tuple, want: object, have: str, ok: bool) -> SiteCheck:
    field = ".".join(("clusters", site.name, *rel))
    return SiteCheck(check=check, field=field, at=str(site.at(*rel)), want=str(want), have=have, ok=ok)


def _per_node(site: Site, rel: tuple, what: str, want: int, nodes: list[NodeInfo], attr: str) -> SiteCheck:
    seen = ", ".join(f"{n.name}: {getattr(n, attr)}" for n in nodes) or "no nodes"
    ok = bool(nodes) and min(getattr(n, attr) for n in nodes) >= want
    return _row(site, f"{what} per node", rel, want, seen, ok)


def _partition_rows(site: Site, name: str, rel: tuple, gpus: int, cpus: int | None) -> list[SiteCheck]:
    """Exists; every node has ``gpus`` GRES GPUs (of the profile's type) and ``cpus`` CPUs."""
    shape = rel[0] == "partitions"
    try:
        _, nodes = partition_nodes(name)
    except InfraError as exc:
        known = str(exc).rpartition("partitions: ")[2]
        return [_row(site, "partition exists", rel, name, f"no such partition (partitions: {known})", False)]
    names = ", ".join(n.name for n in nodes) or "no nodes"
    rows = [_row(site, "partition exists", rel, name, names, bool(nodes))]
    rows.append(
        _per_node(
            site,
            (*rel, "gpus_per_node") if shape else ("cluster", "gpus_per_node"),
            "GPUs (GRES gpu)",
            gpus,
            nodes,
            "gpus",
        )
    )
    gpu_type = site.cluster.slurm.gpu_type if site.cluster.slurm else None
    if gpu_type and gpus:
        gres = "; ".join(f"{n.name}: {n.gres or 'none'}" for n in nodes)
        ok = all(f"gpu:{gpu_type}:" in n.gres for n in nodes)
        rows.append(_row(site, f"GRES type of {name}", ("cluster", "slurm", "gpu_type"), gpu_type, gres, ok))
    if cpus:
        rows.append(
            _per_node(
                site, (*rel, "cpus_per_node") if shape else ("cluster", "cpus_per_node"), "CPUs", cpus, nodes, "cpus"
            )
        )
    return rows


def check_site(site: Site) -> list[SiteCheck]:
    """Every check of ``site`` against the cluster (InfraError when slurmctld cannot be asked)."""
    c, sl = site.cluster, site.cluster.slurm
    partition = sl.partition if sl else None
    if partition is None:
        default = next((p for p in scontrol_records("partition") if p.get("Default") == "YES"), {})
        partition = default.get("PartitionName")
    shapes = dict(site.profile.partitions)
    rows: list[SiteCheck] = []
    if partition is not None and partition not in shapes:
        rows += _partition_rows(site, partition, ("cluster", "slurm", "partition"), c.gpus_per_node, c.cpus_per_node)
    for name, shape in shapes.items():
        rows += _partition_rows(site, name, ("partitions", name), shape.gpus_per_node, shape.cpus_per_node)
    if sl and sl.time_limit and partition is not None:
        rows += _time_row(site, partition, sl.time_limit)
    return rows


def _time_row(site: Site, partition: str, limit: str) -> list[SiteCheck]:
    """The limit within the partition's MaxTime (nothing to compare with when the partition is missing)."""
    rec = next((p for p in scontrol_records("partition") if p.get("PartitionName") == partition), None)
    if rec is None:
        return []
    max_time = rec.get("MaxTime", "UNLIMITED")
    ok = max_time in ("UNLIMITED", "INFINITE") or seconds(limit) <= seconds(max_time)
    rel = ("cluster", "slurm", "time_limit")
    return [_row(site, f"time limit within {partition}'s", rel, limit, f"MaxTime={max_time}", ok)]
