"""The sandbox contract shared by every backend (local bubblewrap, E2B).

``exec`` never raises for a failing or timed-out command: it returns an :class:`ExecResult`
(a timed-out command is killed with its processes: ``returncode == TIMEOUT_RC`` (124) and
``timed_out=True``; check ``timed_out``, since a command may exit 124 itself). It raises
:class:`SandboxError` only when the sandbox cannot do its job, :class:`IsolationUnavailable` when
it cannot isolate as promised. Paths are inside the sandbox. Arguments holding a NUL or a lone
surrogate are refused. :class:`BaseSandbox` holds what every backend does alike (id, lifecycle
checks, ``exec`` argument checks); the :class:`Sandbox` protocol is what callers type against.
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
    "file_bytes",
    "text_problem",
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


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be passed to a process (argv, env, a file's text), or None.

    A NUL byte ends a C string, and a lone surrogate (e.g. ``"\\ud800"`` from a
    JSON escape) has no UTF-8 encoding; both would otherwise fail deep in a backend.
    """
    if "\0" in text:
        return f"contains a NUL byte (\\x00) at position {text.index(chr(0))}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains {text[exc.start]!r} at position {exc.start}, a lone surrogate that is not valid Unicode text"
    return None


def check_exec_args(cmd: str | Sequence[str], timeout: float, env: Mapping[str, str] | None) -> list[str] | str:
    """Validate ``exec`` arguments the same way for every backend."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"exec timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("exec cmd is an empty string")
        if (problem := text_problem(cmd)) is not None:
            raise ValueError(f"exec cmd {problem}; pass text without NUL bytes or lone surrogates")
        out: list[str] | str = cmd
    else:
        argv = list(cmd)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"exec cmd must be a string or a non-empty list of strings, got {cmd!r}")
        for i, arg in enumerate(argv):
            if (problem := text_problem(arg)) is not None:
                raise ValueError(f"exec cmd[{i}] {problem}; pass text without NUL bytes or lone surrogates")
        out = argv
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or text_problem(key) is not None:
            raise ValueError(f"exec env: invalid variable name {key!r}")
        if not isinstance(value, str) or text_problem(value) is not None:
            raise ValueError(f"exec env: value of {key} must be a string without NUL bytes or lone surrogates")
    return out


def file_bytes(path: str, data: bytes | bytearray | memoryview | str) -> bytes:
    """``write_file``'s payload: bytes as given, text as UTF-8; anything else is a TypeError
    (``bytes(5)`` would silently write five NUL bytes, ``bytes([104, 105])`` ``b"hi"``)."""
    if isinstance(data, str):
        try:
            return data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"write_file({path!r}): the text contains {data[exc.start]!r} at position "
                f"{exc.start}, a lone surrogate that is not valid Unicode text; pass valid text "
                "or bytes"
            ) from None
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"write_file({path!r}): data must be bytes or str, got {type(data).__name__}")


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
            raise SandboxError(f"sandbox {self._id} is not started; use 'async with {type(self).__name__}(...)'")

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
