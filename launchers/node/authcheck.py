"""The preflight's ``auth`` check: the job's Ray refuses whoever does not hold the job's secret.

From the head, as any other process on the network would: a gRPC call without credentials to
the GCS (``ip:gcs``) must fail ``UNAUTHENTICATED`` (Ray's token auth), and so must the Ray client
server's port (``ip:client_server``) where it listens. Both checks name the open port, so a
failure reads as "this port answers strangers" (the preflight then fails: exit 3). Engines do not
exist yet at preflight time; the runtime checks the first one as it starts (``slime.runtime.job``).
With ``SLIME_JOB_AUTH=off`` the check says it was skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launchers.node.preflight_checks import Check
from slime.core.auth import AUTH_ENV, auth_enabled, job_secret
from slime.core.ports import PortBlock

__all__ = ["auth_checks", "grpc_refused"]


def _gcs_call(channel: Any, timeout: float) -> None:
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
    stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout)


def _client_call(channel: Any, timeout: float) -> None:
    from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc

    ping = ray_client_pb2.ClusterInfoRequest(type=ray_client_pb2.ClusterInfoType.PING)
    ray_client_pb2_grpc.RayletDriverStub(channel).ClusterInfo(ping, timeout=timeout)


def grpc_refused(address: str, call: Callable[[Any, float], None] = _gcs_call, timeout: float = 5.0) -> str | None:
    """None when ``address`` refuses ``call`` (default: the GCS's cluster id) without credentials."""
    import grpc

    channel = grpc.insecure_channel(address)
    try:
        call(channel, timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            return None
        return f"{address} answered {exc.code().name} ({exc.details()}), not UNAUTHENTICATED"
    finally:
        channel.close()
    return f"{address} answered a call without credentials"


def _client_port_refused(address: str, timeout: float = 5.0) -> str | None:
    """The Ray client server (ray[client]) checks tokens too; a closed port is fine as well."""
    import socket

    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError:
        return None  # nothing listens there
    return grpc_refused(address, _client_call, timeout)


def auth_checks(ip: str, ports: PortBlock, host: str) -> list[Check]:
    """The ``auth`` check of the head at ``ip`` (``host`` names it)."""
    if not auth_enabled() or job_secret() is None:
        return [Check(name="auth", ok=True, node=host, message=f"skipped: {AUTH_ENV}=off or no job secret")]
    gcs = f"{ip}:{ports.gcs}"
    problems = [p for p in (grpc_refused(gcs), _client_port_refused(f"{ip}:{ports.client_server}")) if p]
    if not problems:
        return [Check(name="auth", ok=True, node=host, message=f"Ray at {gcs} refuses calls without the job's secret")]
    return [
        Check(
            name="auth",
            ok=False,
            node=host,
            message="open to anyone on the network: " + "; ".join(problems),
            fix="Ray must run with RAY_AUTH_MODE=token (set by the bootstrap); check the port's owner",
        )
    ]
