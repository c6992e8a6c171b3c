"""Who and where this node is: rank, hosts, allocation (SLURM or local), and its IP address.

Inside a SLURM step the job facts come from submitit's ``SlurmJobEnvironment`` (node rank
``SLURM_NODEID``, host list expansion of ``SLURM_JOB_NODELIST`` such as ``gpu[01-04,07]``,
job and array ids) rather than a hand-written parser: submitit is already a dependency and its
expansion is tested against SLURM's formats. GPU and CPU counts come from what SLURM allocated on
this node (``SLURM_GPUS_ON_NODE``, ``SLURM_CPUS_ON_NODE``), never from the machine. Outside
SLURM (the local launcher) this is node 0 of 1 and the counts come from the spec.

Addresses (no public DNS probe, no packet sent): ``cluster.network_interface`` wins when set;
otherwise the head takes the local address on the route to another node of the job (or a
non-loopback address of its own hostname, or of any interface, when alone), and a worker takes
the local address on the route to the head, found with a connected UDP socket (``connect`` on
UDP only consults the routing table).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from slime.core.errors import InfraError
from slime.spec.types import Spec

__all__ = [
    "NodeContext",
    "detect_node",
    "head_ip",
    "interface_ipv4",
    "interface_of",
    "interfaces",
    "resolve_ipv4",
    "route_source",
    "worker_ip",
]

_SIOCGIFADDR = 0x8915


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


def _int_env(name: str, default: int | None = None) -> int | None:
    value = os.environ.get(name, "").strip()
    # SLURM_CPUS_ON_NODE is a plain count; SLURM_GPUS_ON_NODE too. Anything else: default.
    return int(value) if value.isdigit() else default


def detect_node(task: int, spec: Spec, *, local: bool = False) -> NodeContext:
    """This node's context: from SLURM inside a job step (unless ``local``), else a single local node."""
    if not local and os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_NODEID") is not None:
        from submitit.slurm.slurm import SlurmJobEnvironment

        env = SlurmJobEnvironment()
        hosts = tuple(env.hostnames)
        return NodeContext(
            task=task,
            rank=env.node,
            num_nodes=env.num_nodes,
            hostnames=hosts,
            hostname=socket.gethostname().split(".")[0],
            job_id=env.raw_job_id,
            restart=_int_env("SLURM_RESTART_COUNT", 0) or 0,
            in_slurm=True,
            gpus=_int_env("SLURM_GPUS_ON_NODE", 0) or 0,
            cpus=_int_env("SLURM_CPUS_ON_NODE") or _int_env("SLURM_CPUS_PER_TASK") or os.cpu_count() or 1,
            mem_mb=_int_env("SLURM_MEM_PER_NODE"),
        )
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


# --------------------------------------------------------------------------- addresses
def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of interface ``name``, or None if it has none / does not exist."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interfaces() -> list[tuple[str, str]]:
    """(name, IPv4) of every interface that has an IPv4 address, in kernel index order."""
    out = []
    for _, name in socket.if_nameindex():
        ip = interface_ipv4(name)
        if ip:
            out.append((name, ip))
    return out


def interface_of(ip: str) -> str | None:
    """The interface holding ``ip`` (used to pin gloo/NCCL to the same network as Ray)."""
    return next((name for name, addr in interfaces() if addr == ip), None)


def resolve_ipv4(host: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    seen: list[str] = []
    for info in infos:
        ip = info[4][0]
        if ip not in seen:
            seen.append(ip)
    return seen


def route_source(dest_ip: str) -> str | None:
    """The local address the kernel would use to reach ``dest_ip`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((dest_ip, 9))
            return s.getsockname()[0]
        except OSError:
            return None


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip).is_loopback


def _named_interface(spec: Spec) -> str | None:
    name = spec.cluster.network_interface
    if not name:
        return None
    ip = interface_ipv4(name)
    if ip is None:
        have = ", ".join(f"{n} ({a})" for n, a in interfaces()) or "none"
        raise InfraError(
            f"cluster.network_interface {name!r} has no IPv4 address on {socket.gethostname()} "
            f"(interfaces here: {have}). Fix: set cluster.network_interface to one of them, or remove it"
        )
    return ip


def head_ip(ctx: NodeContext, spec: Spec) -> str:
    """The address the Ray head binds and advertises."""
    named = _named_interface(spec)
    if named:
        return named
    for other in ctx.hostnames[1:]:
        for ip in resolve_ipv4(other):
            src = route_source(ip)
            if src and not _loopback(src):
                return src
    if ctx.num_nodes > 1:
        raise InfraError(
            f"cannot find this node's address towards the other nodes ({', '.join(ctx.hostnames[1:])}): "
            "their hostnames do not resolve to a routable address here. Fix: set "
            "cluster.network_interface to the interface of the cluster network"
        )
    own = [ip for ip in resolve_ipv4(ctx.hostname) if not _loopback(ip)]
    if own:
        return own[0]
    return next((ip for _, ip in interfaces() if not _loopback(ip)), "127.0.0.1")


def worker_ip(ctx: NodeContext, spec: Spec, head: str) -> str:
    """The address a worker node advertises: the one on its route to the head."""
    named = _named_interface(spec)
    if named:
        return named
    src = route_source(head)
    if not src or _loopback(src):
        raise InfraError(
            f"node {ctx.hostname} has no route to the Ray head at {head} ({ctx.head_host}). "
            "Fix: set cluster.network_interface to the interface of the cluster network"
        )
    return src
