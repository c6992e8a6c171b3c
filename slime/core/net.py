"""Small socket helpers shared by the HTTP servers we run (built-in engine, agent adapters)."""

from __future__ import annotations

import socket

__all__ = ["bind_listener"]


def bind_listener(host: str, port: int, *, what: str = "server") -> socket.socket:
    """A bound, listening, non-blocking TCP socket (port 0 = pick a free one).

    Binding before the event loop starts lets the caller learn the real port and
    fail with a message naming ``what`` and the address instead of a traceback.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock
