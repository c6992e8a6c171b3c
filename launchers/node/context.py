"""Who and where this node is (from the launcher's node environment), and its IP address.

The launcher plug-in's ``node_env`` says rank, hosts and what was allocated (SLURM: from its step's
variables; local: node 0 of 1 with the spec's counts).
Addresses (no public DNS probe, no packet sent): ``cluster.network_interface`` wins when set;
otherwise the head takes the local address on the route to another node of the job (or a
non-loopback address of its own hostname, or of any interface, when alone), and a worker takes
the local address on the route to the head, found with a connected UDP socket (``connect`` on
UDP only consults the routing table).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from slime.core.errors import InfraError
from slime.core.nodes import NodeContext
from slime.core.registry import load_object
from slime.spec.plugin import default_profile, selected
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


def detect_node(task: int, spec: Spec, *, local: bool = False) -> NodeContext:
    """This node's context from the spec's launcher's node environment (``Profile.node_env``); outside
    the launcher's allocation (it answers None), or with ``local``, a single local node."""
    if not local:
        env = selected(spec, "launcher").node_env
        ctx = load_object(env)(task, spec) if env else None
        if ctx is not None:
            return ctx
    return load_object(default_profile("launcher").node_env)(task, spec)


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
