"""The sandbox contract shared by every backend (local bubblewrap, E2B).

A sandbox is an async context manager that runs agent commands somewhere the
agent cannot hurt the host. ``exec`` never raises for a failing or timed-out
command: it returns an :class:`ExecResult`. It raises :class:`SandboxError`
only when the sandbox itself cannot do its job (not started, closed, backend
unreachable), and :class:`IsolationUnavailable` (a subclass) when a backend
cannot provide the isolation it promises.

Timeout contract: a command that outlives ``timeout`` seconds is killed with
every process it started and the result has ``returncode == TIMEOUT_RC`` (124,
the value coreutils ``timeout`` uses) and ``timed_out=True``. A command may
itself exit with 124, so check ``timed_out`` to tell the two apart.

Paths given to ``write_file``/``read_file`` and ``workdir`` are paths *inside*
the sandbox; relative paths are relative to the sandbox's working directory.

Backends subclass :class:`BaseSandbox`, which owns what every backend does the
same way: a stable ``sandbox_id``, ``async with`` = ``start()`` then
``close()``, the started/closed state checks (one wording for their errors),
and ``exec``'s argument checks before the backend's ``_exec``. The
:class:`Sandbox` protocol stays the contract callers type against.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, runtime_checkable

__all__ = [
    "TIMEOUT_RC",
    "BaseSandbox",
    "ExecRequest",
    "ExecResult",
    "IsolationUnavailable",
    "Sandbox",
    "SandboxError",
    "check_exec_args",
]

# Return code of a command killed because it outlived its time budget.
TIMEOUT_RC = 124


class SandboxError(RuntimeError):
    """The sandbox could not run the request (as opposed to the command failing)."""


class IsolationUnavailable(SandboxError):
    """The backend cannot isolate commands here (missing tool, no user namespaces)."""


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command; unpacks as ``rc, stdout, stderr``."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool = False
    output_truncated: bool = False  # stdout or stderr exceeded the backend's cap

    def __iter__(self) -> Iterator[int | str]:
        return iter((self.returncode, self.stdout, self.stderr))

    def __len__(self) -> int:
        return 3

    def __getitem__(self, index: int) -> int | str:
        return (self.returncode, self.stdout, self.stderr)[index]

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@runtime_checkable
class Sandbox(Protocol):
    """What the agent runtime needs from a sandbox backend."""

    @property
    def sandbox_id(self) -> str: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        idempotent: bool = False,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes to ``/bin/sh -c``; a list is argv).

        ``idempotent`` tells backends that retry transient failures that running
        the command twice is harmless; without it they never retry ``exec``.
        """
        ...

    async def write_file(self, path: str, data: bytes | str) -> None: ...

    async def read_file(self, path: str) -> bytes: ...


def check_exec_args(
    cmd: str | Sequence[str], timeout: float, env: Mapping[str, str] | None
) -> list[str] | str:
    """Validate ``exec`` arguments the same way for every backend."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"exec timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("exec cmd is an empty string")
        out: list[str] | str = cmd
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(
                f"exec cmd must be a string or a non-empty list of strings, got {cmd!r}"
            )
        out = argv
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"exec env: invalid variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"exec env: value of {key} must be a string without NUL bytes")
    return out


@dataclass(frozen=True)
class ExecRequest:
    """One checked ``exec`` call as a backend's ``_exec`` receives it."""

    cmd: list[str] | str  # a string goes to /bin/sh -c
    timeout: float
    env: Mapping[str, str] | None = None
    workdir: str | None = None
    idempotent: bool = False


class BaseSandbox(ABC):
    """The lifecycle and checks every backend shares (see the module docstring).

    A subclass implements ``start`` (raise :class:`SandboxError` on failure),
    ``close`` (idempotent, must not raise for a failed cleanup), ``_started``,
    ``_exec`` (arguments already checked, the sandbox running),
    ``write_file`` and ``read_file``; it calls :meth:`_require_started` before
    touching the sandbox and :meth:`_check_startable` at the top of ``start``.
    """

    def __init__(self, id_prefix: str) -> None:
        self._id = f"{id_prefix}-{uuid.uuid4().hex[:12]}"
        self._closed = False

    @property
    def sandbox_id(self) -> str:
        return self._id

    async def __aenter__(self) -> BaseSandbox:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @property
    @abstractmethod
    def _started(self) -> bool:
        """Whether ``start`` completed (and ``close`` has not undone it)."""

    def _check_startable(self) -> None:
        if self._started:
            raise SandboxError(f"sandbox {self._id} was already started")
        if self._closed:
            raise SandboxError(f"sandbox {self._id} is closed")

    def _require_started(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self._id} is closed")
        if not self._started:
            raise SandboxError(
                f"sandbox {self._id} is not started; use 'async with {type(self).__name__}(...)'"
            )

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        idempotent: bool = False,
    ) -> ExecResult:
        """See :meth:`Sandbox.exec`: checks the arguments, then runs the backend's ``_exec``."""
        checked = check_exec_args(cmd, timeout, env)
        self._require_started()
        return await self._exec(ExecRequest(checked, float(timeout), env, workdir, idempotent))

    @abstractmethod
    async def _exec(self, req: ExecRequest) -> ExecResult: ...

    @abstractmethod
    async def write_file(self, path: str, data: bytes | str) -> None: ...

    @abstractmethod
    async def read_file(self, path: str) -> bytes: ...
