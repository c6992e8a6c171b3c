"""The local launcher's rules, derived values and node environment (one machine, no scheduler)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

from msgspec.structs import replace

from slime.core.nodes import NodeContext
from slime.spec.plugin import Finding

__all__ = ["RULES", "local_node", "resolve"]


def one_machine(s) -> Iterator[Finding]:
    if s.cluster.nodes != 1:
        yield (
            "cluster.nodes",
            f"the local launcher runs on this one machine, got cluster.nodes={s.cluster.nodes}",
            "set cluster.nodes: 1, or use a launcher for a cluster (cluster.launcher)",
        )
    if s.sweep is not None and (s.sweep.max_parallel or 1) > 1:
        yield (
            "sweep.max_parallel",
            f"the local launcher runs sweep tasks one after another, not {s.sweep.max_parallel} at once",
            "remove sweep.max_parallel, or use a launcher for a cluster (cluster.launcher)",
        )


def no_dependencies(s) -> Iterator[Finding]:
    """A local job runs in the foreground now: there is no queue in which it could wait for another job."""
    sl = s.cluster.slurm
    if sl is not None and sl.depends_on:
        yield (
            "cluster.slurm.depends_on",
            "the local launcher starts the job at once in the foreground; it cannot wait for another job",
            "run the specs one after another with `slime-submit chain A.yaml B.yaml`, or use cluster.launcher: slurm",
        )


RULES = (one_machine, no_dependencies)


def resolve(spec):
    """CPUs per node: this machine's."""
    c = spec.cluster
    if c.cpus_per_node is None:
        spec = replace(spec, cluster=replace(c, cpus_per_node=os.cpu_count() or 1))
    return spec


def local_node(task: int, spec) -> NodeContext:
    """This machine as node 0 of 1; the counts come from the spec."""
    host = socket.gethostname().split(".")[0]
    c = spec.cluster
    return NodeContext(
        task=task,
        rank=0,
        num_nodes=1,
        hostnames=(host,),
        hostname=host,
        job_id=f"local{os.getpid()}",
        gpus=c.gpus_per_node,
        cpus=c.cpus_per_node or os.cpu_count() or 1,
    )
