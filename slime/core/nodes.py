"""Who and where one node of a job is (``NodeContext``): made by the launcher's node environment."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NodeContext"]


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeContext:
    """This node's place in the job."""

    task: int
    rank: int
    num_nodes: int
    hostnames: tuple[str, ...]
    hostname: str
    job_id: str
    restart: int = 0
    in_slurm: bool = False
    gpus: int = 0
    cpus: int = 1
    mem_mb: int | None = None

    @property
    def head_host(self) -> str:
        return self.hostnames[0]

    @property
    def key(self) -> str:
        """Unique per job and task: seeds the port block and names the Ray temp dir."""
        return f"{self.job_id}-{self.task}"

    @property
    def instance(self) -> str:
        """Unique per run of the job (a requeue is a new instance): names rendezvous files."""
        return f"{self.job_id}.{self.restart}"
