"""The SLURM node environment: this node's place in the job, from its step's variables.

Job facts come from submitit's ``SlurmJobEnvironment`` (node rank, host-list expansion such as
``gpu[01-04,07]``, job and array ids) rather than a hand-written parser: submitit is already a
dependency and its expansion is tested against SLURM's formats. GPU and CPU counts come from what
SLURM allocated on this node, never from the machine.
"""

from __future__ import annotations

import os
import socket

from slime.core.nodes import NodeContext

__all__ = ["slurm_node"]


def _int_env(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name, "").strip()
    # SLURM_CPUS_ON_NODE is a plain count; SLURM_GPUS_ON_NODE too. Anything else: default.
    return int(value) if value.isdigit() else default


def slurm_node(task: int, spec) -> NodeContext | None:
    """This node's context inside a SLURM job step; None outside one."""
    if not (os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_NODEID") is not None):
        return None
    from submitit.slurm.slurm import SlurmJobEnvironment

    env = SlurmJobEnvironment()
    return NodeContext(
        task=task,
        rank=env.node,
        num_nodes=env.num_nodes,
        hostnames=tuple(env.hostnames),
        hostname=socket.gethostname().split(".")[0],
        job_id=env.raw_job_id,
        restart=_int_env("SLURM_RESTART_COUNT", 0) or 0,
        in_slurm=True,
        gpus=_int_env("SLURM_GPUS_ON_NODE", 0) or 0,
        cpus=_int_env("SLURM_CPUS_ON_NODE") or _int_env("SLURM_CPUS_PER_TASK") or os.cpu_count() or 1,
        mem_mb=_int_env("SLURM_MEM_PER_NODE"),
    )
