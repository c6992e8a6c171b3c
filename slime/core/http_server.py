"""An aiohttp application served from a background thread: the one lifecycle our HTTP servers share.

The built-in engine and the agent adapters serve HTTP from processes that do other work, so they
cannot own the main thread's loop. The socket is bound in ``__init__`` (a clash is reported with
the address before any thread starts); ``start()`` returns once listening or raises; ``stop()``
stops the loop, runs the subclass's ``aclose()`` on it, joins the thread and closes the socket.
Subclasses provide ``build_app()``. Not guaranteed: in-flight requests finish before ``stop()``
returns (callers that need it, like the adapters' sessions, drain first).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from slime.core.net import bind_listener

__all__ = ["BackgroundHTTPServer"]


class BackgroundHTTPServer:
    """Serve ``build_app()`` on ``host:port`` (0 = a free port) from a daemon thread."""

    what = "HTTP server"  # named in errors

    def __init__(self, host: str, port: int, *, thread_name: str) -> None:
        self.host = host
        self._sock = bind_listener(host, port, what=self.what)
        self.port = self._sock.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"{thread_name}-{self.port}", daemon=True)

    def build_app(self) -> web.Application:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Async cleanup on the server's loop after the site has stopped."""

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> Any:
        self._thread.start()
        self._ready.wait(timeout)
        if self._error is not None:
            raise RuntimeError(f"{self.what} failed to start: {self._error}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = web.AppRunner(self.build_app(), access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            self._loop.run_until_complete(web.SockSite(self._runner, self._sock).start())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.run_until_complete(self.aclose())
        self._loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop, clean up, join the thread and close the listener."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
