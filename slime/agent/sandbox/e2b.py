"""Run agent commands in E2B cloud sandboxes (Firecracker micro-VMs).

Built on the official ``e2b`` SDK (REST control plane and envd RPC we would otherwise
re-implement); ``tenacity`` provides the retry loop. Guaranteed: the API key is a reference,
resolved at start, masked and scrubbed from errors; transient failures are retried with full-jitter
backoff, non-idempotent calls (``exec`` by default) never; a create is idempotent per object; the
VM dies after ``lifetime_s`` even if we do; timed-out commands are killed; optional rlimits via
``ulimit`` (``exec`` returns 125 when refused). Not guaranteed: the VM's isolation (E2B's), rlimits
against an adversary (the template has ``sudo``), output past ``max_output_bytes``. See docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shlex
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from slime.agent.sandbox.base import (
    TIMEOUT_RC,
    BaseSandbox,
    ExecRequest,
    ExecResult,
    SandboxError,
    file_bytes,
)

__all__ = ["E2BSandbox", "is_transient", "resolve_secret_ref"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
_STATUS_PREFIX = re.compile(r"^\s*(\d{3})\s*:")


class _Secret:
    """A string that does not show itself in repr/str/logs."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


def resolve_secret_ref(ref: str) -> str:
    """Default resolver: ``env:NAME`` (environment) or ``file:/path`` (file content, stripped)."""
    scheme, sep, rest = ref.partition(":")
    if sep and scheme == "env" and rest:
        value = os.environ.get(rest)
        if not value:
            raise SandboxError(f"secret reference {ref!r}: environment variable {rest} is not set")
        return value
    if sep and scheme == "file" and rest:
        try:
            with open(rest, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as exc:
            raise SandboxError(f"secret reference {ref!r}: cannot read {rest}: {exc.strerror}") from None
        if not value:
            raise SandboxError(f"secret reference {ref!r}: {rest} is empty")
        return value
    raise SandboxError(
        f"secret reference {ref!r} is not understood; use 'env:NAME' or 'file:/path', "
        "or pass secret_resolver= to resolve your own references"
    )


def _status_of(exc: BaseException) -> int | None:
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    match = _STATUS_PREFIX.match(str(exc))
    return int(match.group(1)) if match else None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same idempotent request may succeed."""
    import httpx
    from e2b import exceptions as ex

    permanent = (
        ex.AuthenticationException,
        ex.InvalidArgumentException,
        ex.NotFoundException,
        ex.SandboxNotRunningException,
        ex.NotEnoughSpaceException,
        ex.TemplateException,
    )
    if isinstance(exc, permanent):
        return False
    if isinstance(exc, (ex.RateLimitException, ex.SandboxUnreachableException, httpx.TransportError)):
        return True
    if isinstance(exc, ex.SandboxException):
        if type(exc) is ex.TimeoutException:  # the request timed out, not the command
            return True
        return _status_of(exc) in _TRANSIENT_STATUS
    return isinstance(exc, (ConnectionError, TimeoutError))


def _check_args(limits: dict, lifetime_s, max_attempts, positive: dict, workdir: str) -> None:
    for name, value in limits.items():
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"E2BSandbox({name}=...) must be a positive integer or None, got {value!r}")
    if not isinstance(lifetime_s, int) or isinstance(lifetime_s, bool) or lifetime_s <= 0:
        raise ValueError(f"E2BSandbox(lifetime_s=...) must be a positive integer of seconds, got {lifetime_s!r}")
    if not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"E2BSandbox(max_attempts=...) must be >= 1, got {max_attempts!r}")
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"E2BSandbox({name}=...) must be positive, got {value!r}")
    if not workdir.startswith("/"):
        raise ValueError(f"E2BSandbox(workdir=...) must be an absolute path, got {workdir!r}")


# Exit status of a command that never ran because ulimit refused its limits.
ULIMIT_FAILED_RC = 125


def _ulimit_prefix(
    cpu_time_s: int | None, memory_mb: int | None, max_procs: int | None, max_file_mb: int | None
) -> str:
    """bash's ulimit line that sets the limits given (units: seconds, KiB, processes, KiB)."""
    flags = [
        (flag, value)
        for flag, value in (
            ("-t", cpu_time_s),
            ("-v", None if memory_mb is None else memory_mb * 1024),
            ("-u", max_procs),
            ("-f", None if max_file_mb is None else max_file_mb * 1024),
        )
        if value is not None
    ]
    if not flags:
        return ""
    opts = " ".join(f"{flag} {value}" for flag, value in [("-c", 0), *flags])
    # Its own line, so the command after it parses exactly as it would alone.
    return f"ulimit {opts} || exit {ULIMIT_FAILED_RC}\n"


class E2BSandbox(BaseSandbox):
    """One E2B sandbox VM (see the module docstring)."""

    def __init__(
        self,
        *,
        api_key_ref: str = "env:E2B_API_KEY",
        secret_resolver: Callable[[str], str] | None = None,
        template: str | None = None,
        lifetime_s: int = 3600,
        network: bool = False,
        user: str = "user",
        workdir: str = "/home/user",
        max_attempts: int = 5,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
        request_timeout_s: float = 60.0,
        max_output_bytes: int = 1024 * 1024,
        metadata: Mapping[str, str] | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        cpu_time_s: int | None = None,
        memory_mb: int | None = None,
        max_procs: int | None = None,
        max_file_mb: int | None = None,
    ) -> None:
        positive = {
            "backoff_initial_s": backoff_initial_s,
            "backoff_max_s": backoff_max_s,
            "request_timeout_s": request_timeout_s,
            "max_output_bytes": max_output_bytes,
        }
        limits = {"cpu_time_s": cpu_time_s, "memory_mb": memory_mb, "max_procs": max_procs, "max_file_mb": max_file_mb}
        _check_args(limits, lifetime_s, max_attempts, positive, workdir)
        self._ulimit = _ulimit_prefix(cpu_time_s, memory_mb, max_procs, max_file_mb)
        self.api_key_ref = api_key_ref
        self._resolver = secret_resolver or resolve_secret_ref
        self.template = template
        self.lifetime_s = lifetime_s
        self.network = network
        self.user = user
        self.workdir = workdir
        self.max_attempts = max_attempts
        self.backoff_initial_s = float(backoff_initial_s)
        self.backoff_max_s = float(backoff_max_s)
        self.request_timeout_s = float(request_timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.metadata = dict(metadata or {})
        self._endpoints = {
            k: v for k, v in (("domain", domain), ("api_url", api_url), ("sandbox_url", sandbox_url)) if v is not None
        }
        super().__init__("e2b")
        self._idempotency_key = str(uuid.uuid4())
        self._key: _Secret | None = None
        self._sdk: Any = None
        self._deadline: float | None = None

    # -- identity and lifecycle -----------------------------------------------------------

    # sandbox_id is a stable local id; the E2B VM id is remote_id, known after start.
    @property
    def _started(self) -> bool:
        return self._sdk is not None and self._deadline is not None

    @property
    def remote_id(self) -> str | None:
        return None if self._sdk is None else self._sdk.sandbox_id

    def __repr__(self) -> str:
        return f"E2BSandbox(id={self._id}, remote={self.remote_id}, template={self.template!r})"

    def _scrub(self, text: str) -> str:
        if self._key is not None and self._key.reveal():
            text = text.replace(self._key.reveal(), "<secret>")
        return text

    def _api_opts(self) -> dict[str, Any]:
        if self._key is None:
            raise SandboxError("E2B API key not resolved: use the sandbox as an async context manager")
        return {
            "api_key": self._key.reveal(),
            "retries": 0,  # one retry policy: ours
            "request_timeout": self.request_timeout_s,
            **self._endpoints,
        }

    async def start(self) -> None:
        self._check_startable()
        try:
            key = self._resolver(self.api_key_ref)
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - the resolver is the caller's; do not echo what it saw
            raise SandboxError(
                f"cannot resolve E2B API key reference {self.api_key_ref!r}: {type(exc).__name__}"
            ) from None
        if not isinstance(key, str) or not key:
            raise SandboxError(f"E2B API key reference {self.api_key_ref!r} resolved to an empty value")
        self._key = _Secret(key)
        from e2b import AsyncSandbox

        async def create() -> Any:
            return await AsyncSandbox.create(
                template=self.template,
                timeout=self.lifetime_s,
                allow_internet_access=self.network,
                metadata=self.metadata or None,
                idempotency_key=self._idempotency_key,
                **self._api_opts(),
            )

        self._sdk = await self._call("create sandbox", create, idempotent=True)
        self._deadline = time.monotonic() + self.lifetime_s

    async def close(self) -> None:
        """Kill the VM (retried); failures are logged, not raised (``__aexit__`` must not mask)."""
        if self._closed:
            return
        self._closed = True
        if self._sdk is None:
            return
        try:
            await self._call("kill sandbox", self._sdk.kill, idempotent=True)
        except SandboxError as exc:
            log.warning("sandbox %s: %s (E2B kills it at the end of its lifetime)", self._id, exc)

    def _require_running(self) -> float:
        """Seconds of lifetime left; raises if not started, closed or past the lifetime."""
        self._require_started()
        left = (self._deadline or 0.0) - time.monotonic()
        if left <= 0:
            raise SandboxError(f"sandbox {self._id} reached its lifetime of {self.lifetime_s}s")
        return left

    # -- retries ---------------------------------------------------------------------------

    def _log_retry(self, op: str) -> Callable[[RetryCallState], None]:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            wait = state.next_action.sleep if state.next_action else 0.0
            log.warning(
                "sandbox %s: %s failed (attempt %d/%d, %s: %s); retrying in %.2fs",
                self._id,
                op,
                state.attempt_number,
                self.max_attempts,
                type(exc).__name__,
                self._scrub(str(exc))[:300],
                wait,
            )

        return before_sleep

    async def _call(self, op: str, fn: Callable[[], Any], *, idempotent: bool) -> Any:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.max_attempts if idempotent else 1),
            wait=wait_random_exponential(multiplier=self.backoff_initial_s, max=self.backoff_max_s),
            retry=retry_if_exception(is_transient),
            before_sleep=self._log_retry(op),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await fn()
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001
            kind = "transient" if is_transient(exc) else "permanent"
            tries = retrying.statistics.get("attempt_number", 1)
            raise SandboxError(
                f"e2b {op} failed after {tries} attempt(s) ({kind} {type(exc).__name__}: {self._scrub(str(exc))[:500]})"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    # -- operations -------------------------------------------------------------------------

    def _path(self, path: str) -> str:
        if not isinstance(path, str) or not path or "\0" in path:
            raise SandboxError(f"invalid sandbox path {path!r}")
        return path if path.startswith("/") else f"{self.workdir.rstrip('/')}/{path}"

    async def _exec(self, req: ExecRequest) -> ExecResult:
        budget = min(req.timeout, self._require_running())
        command = self._ulimit + (req.cmd if isinstance(req.cmd, str) else shlex.join(req.cmd))
        cwd = self._path(req.workdir) if req.workdir else self.workdir

        async def run_once() -> ExecResult:
            from e2b.sandbox.commands.command_handle import CommandExitException

            handle = await self._sdk.commands.run(
                command,
                background=True,
                envs=dict(req.env or {}),
                cwd=cwd,
                user=self.user,
                # The stream may outlive the budget a little; we kill on our own deadline.
                timeout=budget + self.request_timeout_s,
                request_timeout=self.request_timeout_s,
            )
            try:
                result = await asyncio.wait_for(handle.wait(), budget)
            except CommandExitException as exc:
                return self._result(exc.exit_code, exc.stdout, exc.stderr)
            except TimeoutError:
                await self._call("kill timed-out command", handle.kill, idempotent=True)
                return self._result(TIMEOUT_RC, handle.stdout, handle.stderr, timed_out=True)
            return self._result(result.exit_code, result.stdout, result.stderr)

        return await self._call("exec", run_once, idempotent=req.idempotent)

    def _result(self, rc: int, out: str | None, err: str | None, *, timed_out: bool = False) -> ExecResult:
        out, err = out or "", err or ""
        cap = self.max_output_bytes
        cut = len(out.encode()) > cap or len(err.encode()) > cap
        if cut:
            out = out.encode()[:cap].decode("utf-8", "ignore")
            err = err.encode()[:cap].decode("utf-8", "ignore")
        return ExecResult(rc, out, err, timed_out=timed_out, output_truncated=cut)

    async def write_file(self, path: str, data: bytes | str) -> None:
        self._require_running()
        target = self._path(path)
        payload = file_bytes(path, data)
        await self._call(
            f"write {target}",
            lambda: self._sdk.files.write(
                target,
                payload,
                user=self.user,
                use_octet_stream=True,
                request_timeout=self.request_timeout_s,
            ),
            idempotent=True,
        )

    async def read_file(self, path: str) -> bytes:
        self._require_running()
        target = self._path(path)
        data = await self._call(
            f"read {target}",
            lambda: self._sdk.files.read(
                target, format="bytes", user=self.user, request_timeout=self.request_timeout_s
            ),
            idempotent=True,
        )
        return bytes(data)
