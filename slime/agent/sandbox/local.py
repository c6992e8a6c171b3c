"""Run agent commands on this machine, isolated with bubblewrap.

Why bubblewrap: a small, audited, unprivileged namespace tool in every distribution, with no
daemon, unlike Docker or a VM. Each ``exec`` is one fresh ``bwrap`` process (new namespaces, no
network unless asked, uid 1000 inside an unprivileged host uid, read-only root, private ``/work``
kept between calls, rlimits, seccomp, a memory cgroup where possible); its timeout kills the whole
PID namespace, so nothing outlives a call. NOT isolated: the shared kernel, timing side channels;
total memory only where a cgroup can be made, disk only as root; see :attr:`enforcement`.
``allow_unisolated`` runs on the host when user namespaces do not work. Full list: design-notes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from slime.agent.sandbox import hostfs, seccomp
from slime.agent.sandbox.base import (
    TIMEOUT_RC,
    BaseSandbox,
    ExecRequest,
    ExecResult,
    IsolationUnavailable,
    SandboxError,
    file_bytes,
)
from slime.agent.sandbox.bwrap import (
    INIT_ARGV,
    MIB,
    SANDBOX_WORKDIR,
    CallFds,
    Limits,
    bwrap_prefix,
    identity_files,
    may_traverse,
)
from slime.agent.sandbox.cgroup import MemoryCgroup
from slime.agent.sandbox.processes import Capture, children, killpg, shell_returncode
from slime.agent.sandbox.resources import Resources, sweep_state_root, write_owner

__all__ = ["SANDBOX_WORKDIR", "LocalSandbox"]

log = logging.getLogger(__name__)

_SELF_CHECK_TIMEOUT_S = 20.0
# How long bwrap may take to create a call's namespaces before the call fails: the kernel serialises
# network namespace creation, so many calls starting at once on a loaded machine wait on each other.
_JOIN_TIMEOUT_S = 90.0
# Outcome of the bwrap self-check per configuration: None = works, str = why not.
_self_checks: dict[tuple, str | None] = {}


def _positive(name: str, value: float, *, integer: bool = True) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"LocalSandbox({name}=...) must be {kind}, got {value!r}")


def _check_args(sizes: dict, total_memory_mb, wall_timeout_s, host_uid: int, host_gid: int) -> None:
    for name, value in sizes.items():
        _positive(name, value)
    if total_memory_mb is not None:
        _positive("total_memory_mb", total_memory_mb)
    _positive("wall_timeout_s", wall_timeout_s, integer=False)
    if host_uid == 0 or host_gid == 0:
        raise ValueError("LocalSandbox(host_uid/host_gid=0) would run sandboxed code as root; give an unprivileged id")


class LocalSandbox(BaseSandbox):
    """A bubblewrap sandbox on this machine (see the module docstring)."""

    def __init__(
        self,
        *,
        network: bool = False,
        cpu_time_s: int = 60,
        memory_mb: int = 1024,
        max_procs: int = 64,
        max_file_mb: int = 64,
        max_open_files: int = 256,
        tmp_mb: int = 64,
        work_mb: int = 256,
        total_memory_mb: int | None = None,
        wall_timeout_s: float = 600.0,
        max_output_bytes: int = MIB,
        workdir_root: str | os.PathLike[str] | None = None,
        ro_binds: Sequence[str | tuple[str, str]] = (),
        allow_unisolated: bool = False,
        bwrap_path: str = "bwrap",
        host_uid: int = 65534,
        host_gid: int = 65534,
        seccomp: bool = True,
    ) -> None:
        sizes = dict(
            cpu_time_s=cpu_time_s,
            memory_mb=memory_mb,
            max_procs=max_procs,
            max_file_mb=max_file_mb,
            max_open_files=max_open_files,
            tmp_mb=tmp_mb,
            work_mb=work_mb,
            max_output_bytes=max_output_bytes,
        )
        _check_args(sizes, total_memory_mb, wall_timeout_s, host_uid, host_gid)
        super().__init__("local")
        self.network = bool(network)
        self.limits = Limits(cpu_time_s, memory_mb, max_procs, max_file_mb, max_open_files)
        self.tmp_mb = tmp_mb
        self.work_mb = work_mb
        # Default: room for two processes at their cap plus every tmpfs full (their pages count).
        self.total_memory_mb = total_memory_mb or 2 * memory_mb + work_mb + 2 * tmp_mb
        self.seccomp = bool(seccomp)
        self.wall_timeout_s = float(wall_timeout_s)
        self.max_output_bytes = max_output_bytes
        self.allow_unisolated = allow_unisolated
        self.bwrap_path = bwrap_path
        self._as_root = os.geteuid() == 0
        self._uid, self._gid = (host_uid, host_gid) if self._as_root else (os.getuid(), os.getgid())
        self._ro_binds = [self._check_bind(b) for b in ro_binds]
        default_root = Path(tempfile.gettempdir()) / "slime-sandboxes"
        self._root = Path(workdir_root or default_root).absolute()
        self._init_runtime_state()

    def _init_runtime_state(self) -> None:
        """Per-sandbox state that ``start`` fills in and ``close`` releases."""
        self._state: Path | None = None
        self._isolated: bool | None = None
        self._procs: dict[asyncio.subprocess.Process, bool] = {}  # running -> isolated
        self._bwrap = ""
        self._argv_prefix: list[str] | None = None
        self._limit_argv: list[str] = []
        self._res: Resources | None = None

    @staticmethod
    def _check_bind(bind: str | tuple[str, str]) -> tuple[str, str]:
        src, dest = (bind, bind) if isinstance(bind, str) else bind
        if not os.path.isabs(src) or not os.path.isabs(dest):
            raise ValueError(f"LocalSandbox(ro_binds=...): {bind!r} must be absolute paths")
        if not os.path.exists(src):
            raise ValueError(f"LocalSandbox(ro_binds=...): {src} does not exist on this machine")
        return os.path.normpath(src), os.path.normpath(dest)

    # -- identity and lifecycle ----------------------------------------------------------

    @property
    def _started(self) -> bool:
        return self._state is not None and self._isolated is not None

    @property
    def isolated(self) -> bool:
        """True under bubblewrap, False in the unisolated fallback."""
        if self._isolated is None:
            raise SandboxError(f"sandbox {self._id} is not started; use 'async with LocalSandbox(...)'")
        return self._isolated

    @property
    def workdir(self) -> str:
        """The persistent working directory as commands see it."""
        if self._isolated is False and self._state is not None:
            return str(self._state / "work")
        return SANDBOX_WORKDIR

    @property
    def host_workdir(self) -> Path:
        """Where the working directory lives on the host (for inspection by the caller)."""
        if self._state is None:
            raise SandboxError(f"sandbox {self._id} is not started")
        return self._state / "work"

    def __repr__(self) -> str:
        mode = {None: "not started", True: "bwrap", False: "UNISOLATED"}[self._isolated]
        return f"LocalSandbox(id={self._id}, {mode}, network={self.network})"

    @property
    def enforcement(self) -> dict[str, str]:
        """What this started sandbox enforces beyond its rlimits, and how (or why not).

        Keys: ``isolation``, ``seccomp``, ``total_memory``, ``work_size``; a value
        starting with ``NOT`` names a cap that fell back on this host.
        """
        self._require_started()
        iso = bool(self._isolated)
        out = {"isolation": "bubblewrap" if iso else "NOT isolated (allow_unisolated fallback)"}
        if not iso:
            out["seccomp"] = "NOT applied: unisolated fallback"
        elif self.seccomp:
            out["seccomp"] = "deny list: " + ", ".join(seccomp.DENIED_EPERM + seccomp.DENIED_ENOSYS)
        else:
            out["seccomp"] = "NOT applied: seccomp=False"
        res = self._res.enforcement if self._res is not None else {}
        out["total_memory"] = res.get("total_memory", "") if iso else "NOT capped: unisolated fallback"
        out["work_size"] = res.get("work_size", "")
        return out

    def memory_usage(self) -> tuple[int | None, int] | None:
        """``(peak bytes, OOM kills)`` of the sandbox's memory cgroup, or None without one."""
        cg = self._res.cgroup if self._res is not None else None
        return None if cg is None else (cg.peak_bytes(), cg.oom_kills())

    async def start(self) -> None:
        self._check_startable()
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise IsolationUnavailable("'prlimit' (util-linux) was not found; install util-linux")
        self._limit_argv = self.limits.prlimit_argv(prlimit)
        if self._as_root:
            self._check_reachable()
        sweep_state_root(self._root)
        state = self._make_state_dir()
        try:
            self._res = Resources(
                state,
                self._id,
                work_mb=self.work_mb,
                total_memory_mb=self.total_memory_mb,
                uid=self._uid,
                gid=self._gid,
            )
            reason = await self._bwrap_problem()
            if reason is None:
                self._isolated = True
            elif self.allow_unisolated:
                log.warning("sandbox %s runs UNISOLATED (rlimits and timeout only): %s", self._id, reason)
                self._isolated = False
            else:
                raise IsolationUnavailable(
                    f"cannot isolate commands with bubblewrap: {reason}. Install it "
                    "('apt-get install bubblewrap') and run where unprivileged user namespaces "
                    "work, or pass allow_unisolated=True to run without isolation"
                )
        except BaseException:
            self._release()
            raise

    async def close(self) -> None:
        self._closed = True
        await asyncio.gather(*(self._terminate(p, iso) for p, iso in list(self._procs.items())))
        self._release()

    def _release(self) -> None:
        if self._res is not None:
            self._res.release()
            self._res = None
        self._remove_state_dir()

    def _check_reachable(self) -> None:
        """bwrap runs as ``host_uid``: every bound path must be reachable by it."""
        paths = [("workdir_root", self._root)]
        paths += [("ro_binds", Path(src)) for src, _ in self._ro_binds]
        for what, path in paths:
            existing = path if path.exists() else next(p for p in path.parents if p.exists())
            for directory in [existing, *existing.parents]:
                if directory.is_dir() and not may_traverse(os.stat(directory), self._uid, self._gid):
                    raise SandboxError(
                        f"LocalSandbox({what}=...): {path} is below {directory}, which the "
                        f"sandbox's host uid {self._uid} cannot enter; use a path under a "
                        "world-traversable directory (such as /tmp) or chmod o+x it"
                    )

    def _make_state_dir(self) -> Path:
        self._root.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            os.chmod(self._root, 0o711)  # the sandbox uid traverses it, cannot list it
        state = self._root / self._id
        state.mkdir(mode=0o711)
        self._state = state
        write_owner(state)
        (state / "work").mkdir(mode=0o700)
        for name, text in identity_files().items():
            (state / name).write_text(text)
            os.chmod(state / name, 0o644)
        if self._as_root:
            os.chown(state / "work", self._uid, self._gid)
        return state

    def _remove_state_dir(self) -> None:
        if self._state is not None:
            hostfs.remove_tree(self._state)
            self._state = None

    # -- bubblewrap ------------------------------------------------------------------------

    async def _bwrap_problem(self) -> str | None:
        """Why bubblewrap cannot be used here, or None (checked once per configuration)."""
        bwrap = shutil.which(self.bwrap_path)
        if bwrap is None:
            return f"bubblewrap executable {self.bwrap_path!r} was not found"
        self._bwrap = bwrap
        if self.seccomp:
            try:
                seccomp.filter_bpf()
            except seccomp.SeccompUnavailable as exc:
                return str(exc)
        key = (bwrap, self._uid, self._gid, self.network, str(self._root), tuple(self._ro_binds), self.seccomp)
        if key not in _self_checks:
            try:
                result = await self._run(["true"], _SELF_CHECK_TIMEOUT_S, None, None, isolated=True)
            except OSError as exc:
                _self_checks[key] = f"starting {bwrap} failed: {exc}"
            else:
                detail = result.stderr.strip() or result.stdout.strip() or f"exit code {result.returncode}"
                ok = result.returncode == 0
                _self_checks[key] = None if ok else f"the self-check '{bwrap} ... true' failed: {detail}"
        return _self_checks[key]

    def _bwrap_argv(self, argv: list[str], workdir: str | None, fd_argv: list[str]) -> list[str]:
        if self._argv_prefix is None:
            if self._state is None:  # guarded by _require_started; kept explicit under python -O
                raise SandboxError("sandbox not started: use it as an async context manager")
            self._argv_prefix = bwrap_prefix(
                self._bwrap,
                network=self.network,
                state_dir=self._state,
                ro_binds=self._ro_binds,
                tmp_mb=self.tmp_mb,
            )
        chdir = self._inside_path(workdir) if workdir else SANDBOX_WORKDIR
        return [*self._argv_prefix, *fd_argv, "--chdir", chdir, "--", *self._limit_argv, *INIT_ARGV, *argv]

    def _inside_path(self, path: str) -> str:
        if "\0" in path:
            raise ValueError("exec workdir contains a NUL byte")
        return path if path.startswith("/") else os.path.join(self.workdir, path)

    # -- exec ------------------------------------------------------------------------------

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        # Built from scratch: nothing from the host's environment leaks in.
        base = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": self.workdir,
            "USER": "agent",
            "LOGNAME": "agent",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        base.update(env or {})
        return base

    async def _exec(self, req: ExecRequest) -> ExecResult:  # nothing is retried locally
        argv = ["/bin/sh", "-c", req.cmd] if isinstance(req.cmd, str) else req.cmd
        budget = min(req.timeout, self.wall_timeout_s)
        return await self._run(argv, budget, req.env, req.workdir, isolated=bool(self._isolated))

    async def _run(
        self,
        argv: list[str],
        budget: float,
        env: Mapping[str, str] | None,
        workdir: str | None,
        *,
        isolated: bool,
    ) -> ExecResult:
        drop: dict[str, object] = {}
        if self._as_root:
            drop = {"user": self._uid, "group": self._gid, "extra_groups": []}
        cgroup = self._res.cgroup if isolated and self._res is not None else None
        fds = CallFds(seccomp.filter_bpf() if isolated and self.seccomp else None, cgroup is not None)
        if isolated:
            full, cwd = self._bwrap_argv(argv, workdir, fds.argv), "/"
        else:
            full = self._limit_argv + argv
            cwd = self._inside_path(workdir) if workdir else self.workdir
        proc, captures = await self._spawn(full, cwd, env, fds, drop)
        fds.started()
        self._procs[proc] = isolated
        timed_out = await self._supervise(proc, captures, fds, cgroup, budget, isolated)
        out, err = captures
        return ExecResult(
            TIMEOUT_RC if timed_out else shell_returncode(proc.returncode),
            out.text(),
            err.text(),
            timed_out=timed_out,
            output_truncated=out.cut or err.cut,
        )

    async def _spawn(self, full: list[str], cwd: str, env, fds: CallFds, drop: dict):
        """Start one call's process with its own output pipes; returns (process, [stdout, stderr] captures)."""
        # Our own pipes, not asyncio's: Process.wait() would otherwise also wait
        # for every holder of stdout/stderr, i.e. for background children.
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        captures = [Capture(out_r, self.max_output_bytes), Capture(err_r, self.max_output_bytes)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=self._env(env),
                cwd=cwd,
                start_new_session=True,
                pass_fds=fds.child_fds,
                **drop,  # type: ignore[arg-type]
            )
        except BaseException:
            for c in captures:
                c.close()
            fds.close()
            raise
        finally:
            os.close(out_w)
            os.close(err_w)
        return proc, captures

    async def _supervise(self, proc, captures: list[Capture], fds: CallFds, cgroup, budget: float, isolated: bool):
        """Wait for a started call within ``budget``, drain its output, clean up; True when it timed out."""
        readers = [asyncio.ensure_future(c.drain()) for c in captures]
        timed_out = False
        try:
            try:
                if cgroup is not None:
                    await self._join(fds, cgroup, proc)
                await asyncio.wait_for(proc.wait(), budget)
            except TimeoutError:
                timed_out = True
                await self._terminate(proc, isolated)
            if not isolated:
                killpg(proc.pid)  # background leftovers still in the group
            # Pipes close once every process holding them is dead; in the
            # unisolated fallback a setsid escapee may keep them open.
            _, pending = await asyncio.wait(readers, timeout=2.0)
            for capture, task in zip(captures, readers):
                capture.cut = capture.cut or task in pending
        finally:
            fds.close()
            if proc.returncode is None:  # cancelled or failed while running
                await self._terminate(proc, isolated)
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
            for c in captures:
                c.close()
            self._procs.pop(proc, None)
        return timed_out

    async def _join(self, fds: CallFds, cgroup: MemoryCgroup, proc: asyncio.subprocess.Process) -> None:
        """Put the call's sandbox process into the memory cgroup before it runs anything."""
        try:
            await asyncio.wait_for(fds.join(cgroup), _JOIN_TIMEOUT_S)
        except (OSError, ValueError, KeyError, TimeoutError) as exc:
            await self._terminate(proc, True)
            raise SandboxError(
                f"sandbox {self._id}: cannot put the command into its memory cgroup {cgroup.path} "
                f"({type(exc).__name__}: {exc}); nothing of the command ran"
            ) from None

    @staticmethod
    async def _terminate(proc: asyncio.subprocess.Process, isolated: bool) -> None:
        """Kill everything one call started and reap bwrap.

        Isolated: SIGKILL the namespace's PID 1 (bwrap's only child); the kernel
        then kills every process of the PID namespace, and bwrap reaps PID 1 and
        exits. Killing bwrap first would also work (``--die-with-parent``) but
        leaves PID 1 as a zombie for the host's init. Fallback, or if bwrap does
        not exit: SIGKILL the process group.
        """
        if isolated and proc.returncode is None:
            for child in children(proc.pid):
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                await asyncio.wait_for(proc.wait(), 1.0)
                return
            except TimeoutError:
                pass
        killpg(proc.pid)
        await proc.wait()

    # -- files -----------------------------------------------------------------------------

    async def write_file(self, path: str, data: bytes | str) -> None:
        """Write a file under the working directory (parents are created)."""
        self._require_started()
        parts = hostfs.relative_parts(path, self.workdir)
        payload = file_bytes(path, data)
        owner = (self._uid, self._gid) if self._as_root else None
        try:
            await asyncio.to_thread(hostfs.write_nofollow, self.host_workdir, parts, payload, owner)
        except OSError as exc:
            raise SandboxError(hostfs.fs_error("write", path, exc)) from exc

    async def read_file(self, path: str) -> bytes:
        """Read a file under the working directory (at most ``max_file_mb``)."""
        self._require_started()
        parts = hostfs.relative_parts(path, self.workdir)
        cap = self.limits.max_file_mb * MIB
        try:
            return await asyncio.to_thread(hostfs.read_nofollow, self.host_workdir, parts, cap)
        except OSError as exc:
            raise SandboxError(hostfs.fs_error("read", path, exc)) from exc
