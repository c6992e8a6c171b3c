"""Engine server processes: start with a log file, wait for ``/health`` (bounded), stop by process group.

Works for any server command (SGLang, sglang-router, the built-in engine), given a
:class:`ProcessSpec`. Guaranteed: ports are checked free first; each process runs in its own
session with its output in ``<log_dir>/<name>.log``; startup is bounded and a failure raises
:class:`EngineStartError` (process, URL, log tail) after stopping what this call started;
:meth:`ManagedProcess.stop` signals only its own process group. Health polling uses ``urllib``.
"""

from __future__ import annotations

import errno
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slime.core.errors import InfraError
from slime.diagnosis.beats import beat

__all__ = ["EngineStartError", "ManagedProcess", "ProcessSpec", "busy_ports", "start_processes", "stop_all"]


class EngineStartError(InfraError):
    """An engine process failed to start or become healthy."""

    def __init__(self, message: str, *, name: str, url: str | None, log_path: Path, tail: str) -> None:
        self.name, self.url, self.log_path, self.tail = name, url, log_path, tail
        super().__init__(f"{message}\n  log: {log_path}\n  last log lines:\n{tail}")
        self._message = message

    def __reduce__(self):  # keyword-only fields: the default pickling (Ray actors → driver) would drop them
        return _rebuild_start_error, (self._message, self.name, self.url, self.log_path, self.tail)


def _rebuild_start_error(message, name, url, log_path, tail) -> EngineStartError:
    return EngineStartError(message, name=name, url=url, log_path=log_path, tail=tail)


@dataclass(frozen=True, kw_only=True)
class ProcessSpec:
    """What to run: ``name`` (e.g. 'engine3'), argv, the base URL whose ``/health`` signals readiness."""

    name: str
    argv: Sequence[str]
    url: str | None = None
    ports: tuple[int, ...] = ()
    bind_host: str = "0.0.0.0"
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


def busy_ports(ports: Sequence[int], host: str = "0.0.0.0") -> list[int]:
    """The ports of ``ports`` that cannot be bound on ``host`` right now."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            # Servers set SO_REUSEADDR too; without it, TIME_WAIT leftovers would read as busy.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    busy.append(port)
                else:
                    raise
    return busy


def _healthy(url: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ManagedProcess:
    """One started server process and its log."""

    def __init__(self, spec: ProcessSpec, log_dir: str | Path) -> None:
        self.spec = spec
        self.log_path = Path(log_dir) / f"{spec.name}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"$ {shlex.join(self.spec.argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                list(self.spec.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.spec.env},
                cwd=self.spec.cwd,
                start_new_session=True,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 2.0) -> bool:
        return self.alive() and self.spec.url is not None and _healthy(self.spec.url, timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_bytes()[-65536:].decode(errors="replace")
        except OSError:
            return "    (no log)"
        return "\n".join("    " + line for line in text.splitlines()[-lines:]) or "    (empty log)"

    def error(self, message: str) -> EngineStartError:
        return EngineStartError(
            f"{self.spec.name} ({self.spec.url or 'no URL'}): {message}",
            name=self.spec.name,
            url=self.spec.url,
            log_path=self.log_path,
            tail=self.log_tail(),
        )

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop this process's group; return its exit code (None if it was never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=grace_s)
        else:
            self._signal(signal.SIGKILL)  # children the server left behind in its group
        return self.proc.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)  # start_new_session: its pgid is its pid
        except (ProcessLookupError, PermissionError):
            pass


def stop_all(processes: Sequence[ManagedProcess], grace_s: float = 10.0) -> None:
    """Stop in reverse start order (router before engines)."""
    for p in reversed(processes):
        p.stop(grace_s)


def _log_bytes(processes: Sequence[ManagedProcess]) -> int:
    total = 0
    for p in processes:
        try:
            total += p.log_path.stat().st_size
        except OSError:
            pass
    return total


def start_processes(
    specs: Sequence[ProcessSpec], log_dir: str | Path, *, timeout_s: float = 600.0, interval_s: float = 0.5
) -> list[ManagedProcess]:
    """Start every process, then wait until each with a URL answers ``/health`` with 200.

    All-or-nothing: on any failure every process started here is stopped before
    :class:`EngineStartError` is raised.
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"process names must be unique (they name the log files): {names}")
    for s in specs:
        busy = busy_ports(s.ports, s.bind_host)
        if busy:
            raise EngineStartError(
                f"{s.name} ({s.url or 'no URL'}): port(s) {busy} already in use on this node; "
                f"stop what holds them or change the port base",
                name=s.name,
                url=s.url,
                log_path=Path(log_dir) / f"{s.name}.log",
                tail="    (not started)",
            )
    started: list[ManagedProcess] = []
    try:
        for s in specs:
            started.append(ManagedProcess(s, log_dir).start())
        deadline = time.monotonic() + timeout_s
        waiting = [p for p in started if p.spec.url]
        logged = 0
        while True:
            for p in started:
                if not p.alive():
                    raise p.error(f"exited with code {p.proc.returncode} during startup")
            if (now := _log_bytes(started)) != logged:  # a server that logs (shards loaded, graphs captured) moves
                logged = now
                beat("engine start")
            waiting = [p for p in waiting if not p.healthy(timeout=min(2.0, max(0.1, interval_s)))]
            if not waiting:
                return started
            if time.monotonic() > deadline:
                raise waiting[0].error(
                    f"not healthy after {timeout_s:g} s (GET {waiting[0].spec.url}/health); "
                    f"{len(waiting)} of {len(started)} process(es) still starting"
                )
            time.sleep(interval_s)
    except BaseException:
        stop_all(started)
        raise
