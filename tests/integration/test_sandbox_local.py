"""LocalSandbox escape tests: real bubblewrap, real processes, real sockets.

Every escape attempt asserts the host side is untouched. Needs bubblewrap and
working user namespaces (CI installs bubblewrap and runs as root); elsewhere the
isolated tests skip, saying why. The fork bomb is kept small (16 processes,
2 s) so a failure cannot take the machine down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from slime.agent.sandbox import (
    TIMEOUT_RC,
    IsolationUnavailable,
    Sandbox,
    SandboxError,
    make_sandbox,
)
from slime.agent.sandbox.local import LocalSandbox


def run(coro):
    return asyncio.run(coro)


_availability: list[str | None] = []


def _bwrap_unavailable() -> str | None:
    if not _availability:

        async def probe() -> str | None:
            try:
                async with LocalSandbox():
                    return None
            except IsolationUnavailable as exc:
                return str(exc)

        _availability.append(run(probe()))
    return _availability[0]


@pytest.fixture
def isolated():
    reason = _bwrap_unavailable()
    if reason:
        pytest.skip(f"bubblewrap isolation unavailable here: {reason}")


needs_bwrap = pytest.mark.usefixtures("isolated")


class Listener:
    """A TCP listener on the host's loopback that counts accepted connections."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


CONNECT = "import socket,sys; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('CONNECTED')"


@needs_bwrap
@pytest.mark.parametrize("network", [False, True])
def test_host_loopback_reachable_only_with_network(network):
    listener = Listener()
    try:

        async def go():
            async with LocalSandbox(network=network) as sb:
                return await sb.exec(["python3", "-c", CONNECT.format(port=listener.port)], timeout=10)

        res = run(go())
    finally:
        listener.close()
    if network:
        assert res.ok and "CONNECTED" in res.stdout and listener.accepted == 1
    else:
        assert not res.ok and "CONNECTED" not in res.stdout
        assert "ConnectionRefused" in res.stderr or "unreachable" in res.stderr
        assert listener.accepted == 0


@needs_bwrap
def test_cannot_read_host_files(tmp_path):
    canary = tmp_path / "canary.txt"
    canary.write_text("CANARY-7d1f")
    canary.chmod(0o644)
    targets = [str(canary), os.path.abspath(__file__), "/etc/shadow", str(Path.home())]

    async def go():
        async with LocalSandbox() as sb:
            out = {}
            for t in targets:
                out[t] = await sb.exec(["cat", t], timeout=10)
            listing = await sb.exec("ls -a / /etc /proc", timeout=10)
            return out, listing

    out, listing = run(go())
    for target, res in out.items():
        assert res.returncode != 0, f"{target} was readable inside the sandbox"
        assert "No such file or directory" in res.stderr or "Is a directory" in res.stderr
    assert "CANARY-7d1f" not in "".join(r.stdout for r in out.values())
    assert "shadow" not in listing.stdout and "root" not in listing.stdout.split()
    assert str(os.getpid()) not in listing.stdout.split(), "host PIDs are visible"


@needs_bwrap
def test_cannot_write_outside_workdir(tmp_path):
    escape = tmp_path / "escaped.txt"
    cmds = [
        f"mkdir -p {tmp_path} && echo pwned > {escape}",
        "echo pwned > /usr/escaped.txt",
        "echo pwned > /etc/escaped.txt",
        "echo pwned > /escaped.txt",
        "echo pwned > /work/../escaped.txt",
        "echo pwned > /dev/escaped.txt",
    ]

    async def go():
        async with LocalSandbox() as sb:
            return [await sb.exec(c, timeout=10) for c in cmds], sb.host_workdir

    results, host_work = run(go())
    assert not escape.exists()
    for path in ("/usr/escaped.txt", "/etc/escaped.txt", "/escaped.txt", "/dev/escaped.txt"):
        assert not os.path.exists(path)
    assert not (host_work.parent / "escaped.txt").exists()
    # Everything but the first (it wrote into the sandbox's private /tmp) was refused.
    assert results[0].ok
    assert all(not r.ok and "Read-only file system" in r.stderr for r in results[1:])


@needs_bwrap
def test_fork_bomb_is_contained_and_host_stays_responsive():
    fork_count = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(3); os._exit(0)\n"
        "    n += 1\n"
        "print(n)\n"
    )

    async def go():
        async with LocalSandbox(max_procs=16, memory_mb=256) as sb:
            counted = await sb.exec(["python3", "-c", fork_count], timeout=10)
            bomb = asyncio.ensure_future(sb.exec("b(){ b | b & }; b; sleep 30", timeout=2))
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            host = await asyncio.to_thread(subprocess.run, ["true"], timeout=10)
            host_latency = time.monotonic() - t0
            t0 = time.monotonic()
            res = await bomb
            after = await sb.exec("echo alive", timeout=10)
            return counted, res, time.monotonic() - t0, host.returncode, host_latency, after

    counted, res, bomb_wait, host_rc, host_latency, after = run(go())
    # PID 1 (the init shell) and python itself count against the 16.
    assert 1 <= int(counted.stdout) <= 14
    assert res.timed_out and res.returncode == TIMEOUT_RC
    assert bomb_wait < 5
    assert host_rc == 0 and host_latency < 2.0
    assert after.stdout == "alive\n"


@needs_bwrap
def test_memory_limit_fails_inside():
    async def go():
        async with LocalSandbox(memory_mb=256) as sb:
            big = await sb.exec(["python3", "-c", "b = bytearray(1 << 30)"], timeout=20)
            small = await sb.exec(["python3", "-c", "b = bytearray(16 << 20); print('ok')"], timeout=20)
            return big, small

    big, small = run(go())
    assert big.returncode != 0 and "MemoryError" in big.stderr
    assert small.ok and small.stdout == "ok\n"


@needs_bwrap
def test_infinite_loop_is_killed_at_the_timeout():
    async def go():
        async with LocalSandbox() as sb:
            t0 = time.monotonic()
            res = await sb.exec("while :; do :; done", timeout=1)
            return res, time.monotonic() - t0

    res, elapsed = run(go())
    assert res.timed_out and res.returncode == TIMEOUT_RC
    assert 1.0 <= elapsed < 4.0


@needs_bwrap
def test_cpu_time_limit_kills_before_the_wall_timeout():
    async def go():
        async with LocalSandbox(cpu_time_s=1) as sb:
            t0 = time.monotonic()
            return await sb.exec("while :; do :; done", timeout=30), time.monotonic() - t0

    res, elapsed = run(go())
    assert not res.timed_out and res.returncode in (128 + 9, 128 + 24)  # SIGKILL / SIGXCPU
    assert elapsed < 10


@needs_bwrap
@pytest.mark.parametrize("timeout", [None, 1.0])
def test_no_background_process_survives_the_call(timeout):
    ticker = "while :; do echo t >> /work/{name}; sleep 0.05; done"
    cmd = (
        f"({ticker.format(name='bg.log')}) >/dev/null 2>&1 & "
        f"setsid sh -c '{ticker.format(name='setsid.log')}' >/dev/null 2>&1 & "
        f"nohup sh -c '{ticker.format(name='nohup.log')}' >/dev/null 2>&1 & "
        + ("sleep 0.6; echo started" if timeout is None else "sleep 60")
    )

    async def go():
        async with LocalSandbox() as sb:
            res = await sb.exec(cmd, timeout=timeout or 10)
            logs = [sb.host_workdir / n for n in ("bg.log", "setsid.log", "nohup.log")]
            sizes = [p.stat().st_size for p in logs]
            await asyncio.sleep(0.5)
            return res, sizes, [p.stat().st_size for p in logs]

    res, before, after = run(go())
    assert res.timed_out == (timeout is not None)
    assert all(s > 0 for s in before), "the background writers never ran"
    assert after == before, "a background process kept writing after exec returned"


@needs_bwrap
def test_sandboxes_do_not_see_each_other():
    async def go():
        async with LocalSandbox() as a, LocalSandbox() as b:
            await a.write_file("mine.txt", "a")
            slow = asyncio.ensure_future(a.exec("sleep 1", timeout=10))
            await asyncio.sleep(0.3)
            ps = await b.exec("ls /proc | grep -c '^[0-9]'; ls /work", timeout=10)
            await slow
            return ps

    ps = run(go())
    count, *files = ps.stdout.split()
    assert "mine.txt" not in files
    assert int(count) <= 4  # b's own init shell, sh, ls, grep


@needs_bwrap
def test_files_roundtrip_env_and_workdir(monkeypatch):
    monkeypatch.setenv("HOST_SECRET_TOKEN", "do-not-leak")

    async def go():
        async with make_sandbox("local") as sb:
            await sb.write_file("sub/dir/data.bin", b"\x00\xffbinary")
            await sb.write_file("/work/text.txt", "héllo")
            cat = await sb.exec("od -An -tx1 data.bin; cat ../../text.txt", timeout=10, workdir="sub/dir")
            env = await sb.exec("env; pwd", timeout=10, env={"AGENT_VAR": "42"})
            await sb.exec("echo made inside > made.txt", timeout=10)
            made = await sb.read_file("made.txt")
            tmp = await sb.exec("echo x > /tmp/t && cat /tmp/t", timeout=10)
            tmp_again = await sb.exec("cat /tmp/t", timeout=10)
            return cat, env, made, tmp, tmp_again, sb.sandbox_id

    cat, env, made, tmp, tmp_again, sid = run(go())
    assert "00 ff 62 69 6e 61 72 79" in cat.stdout and "héllo" in cat.stdout
    assert "AGENT_VAR=42" in env.stdout and "HOME=/work" in env.stdout
    assert "HOST_SECRET_TOKEN" not in env.stdout and env.stdout.rstrip().endswith("/work")
    assert made == b"made inside\n"
    assert tmp.stdout == "x\n" and tmp_again.returncode != 0, "/tmp is private to one call"
    assert sid.startswith("local-")


@needs_bwrap
def test_file_api_does_not_follow_symlinks_out(tmp_path):
    canary = tmp_path / "host.txt"
    canary.write_text("ORIGINAL")

    async def go():
        async with LocalSandbox() as sb:
            await sb.exec(f"ln -s {canary} link; ln -s / rootlink; mkfifo fifo", timeout=10)
            errors = []
            for op in (
                sb.write_file("link", "pwned"),
                sb.read_file("link"),
                sb.write_file("rootlink/tmp/x", "pwned"),
                sb.read_file("fifo"),
                sb.write_file("/etc/passwd", "pwned"),
                sb.write_file("../escape", "pwned"),
                sb.read_file("/work"),
            ):
                with pytest.raises(SandboxError) as info:
                    await op
                errors.append(str(info.value))
            return errors

    errors = run(go())
    assert canary.read_text() == "ORIGINAL"
    assert not Path("/tmp/x").exists() or Path("/tmp/x").read_text() != "pwned"
    assert "symlink" in errors[0] and "outside the sandbox working directory" in errors[4]


@pytest.fixture
def world_readable_dir():
    """A directory the sandbox's unprivileged host uid can enter (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="slime-sbx-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@needs_bwrap
def test_output_cap_and_read_only_binds(world_readable_dir):
    shared = world_readable_dir
    (shared / "ref.txt").write_text("reference data")

    async def go():
        async with LocalSandbox(max_output_bytes=1000, ro_binds=[(str(shared), "/data")]) as sb:
            big = await sb.exec("yes | head -c 100000", timeout=10)
            ref = await sb.exec("cat /data/ref.txt; echo no > /data/new.txt", timeout=10)
            return big, ref

    big, ref = run(go())
    assert big.output_truncated and len(big.stdout) == 1000
    assert ref.stdout == "reference data" and "Read-only file system" in ref.stderr
    assert not (shared / "new.txt").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to an unprivileged host uid")
def test_unreachable_bind_source_is_a_clear_error(tmp_path):
    private = tmp_path / "private"
    private.mkdir()
    tmp_path.chmod(0o700)
    with pytest.raises(SandboxError, match=r"ro_binds=.*cannot enter.*chmod o\+x"):
        run(LocalSandbox(ro_binds=[str(private)], allow_unisolated=True).start())


@needs_bwrap
def test_workdir_is_removed_on_close_even_if_locked_down():
    async def go():
        sb = LocalSandbox()
        async with sb:
            await sb.exec("mkdir -p a/b && touch a/b/f && chmod 000 a/b a", timeout=10)
            host = sb.host_workdir
            assert host.exists()
        return host, sb

    host, sb = run(go())
    assert not host.exists() and not host.parent.exists()
    with pytest.raises(SandboxError, match="closed"):
        run(sb.exec("true", timeout=1))


@pytest.mark.parametrize("bwrap, why", [("/nonexistent/bwrap", "was not found"), ("/bin/false", "self-check")])
def test_refuses_when_bubblewrap_is_missing_or_broken(bwrap, why):
    async def go():
        async with LocalSandbox(bwrap_path=bwrap):
            pass

    with pytest.raises(IsolationUnavailable, match=why) as info:
        run(go())
    assert "allow_unisolated=True" in str(info.value)
    assert "apt-get install bubblewrap" in str(info.value)


def test_unisolated_fallback_keeps_limits_and_timeout(caplog):
    caplog.set_level(logging.WARNING)

    async def go():
        async with LocalSandbox(bwrap_path="/nonexistent/bwrap", allow_unisolated=True, memory_mb=512) as sb:
            limits = await sb.exec("ulimit -v; pwd", timeout=10)
            t0 = time.monotonic()
            slow = await sb.exec("sleep 30", timeout=0.5)
            elapsed = time.monotonic() - t0
            await sb.exec("(sleep 0.3; echo late > late.txt) & echo bye", timeout=10)
            await asyncio.sleep(0.6)
            late = (sb.host_workdir / "late.txt").exists()
            return sb.isolated, limits, slow, elapsed, late, sb.workdir

    isolated, limits, slow, elapsed, late, workdir = run(go())
    assert isolated is False
    assert limits.stdout.split() == [str(512 * 1024), workdir]
    assert slow.timed_out and slow.returncode == TIMEOUT_RC and elapsed < 3
    assert not late, "the process group was not killed after the call"
    assert any("UNISOLATED" in r.getMessage() for r in caplog.records)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="memory_mb"):
        LocalSandbox(memory_mb=0)
    with pytest.raises(ValueError, match="ro_binds"):
        LocalSandbox(ro_binds=["relative/path"])
    with pytest.raises(ValueError, match="host_uid"):
        LocalSandbox(host_uid=0)

    async def go():
        sb = LocalSandbox(bwrap_path="/nonexistent/bwrap", allow_unisolated=True)
        assert isinstance(sb, Sandbox)
        with pytest.raises(SandboxError, match="not started"):
            await sb.exec("true", timeout=1)
        async with sb:
            with pytest.raises(ValueError, match="timeout"):
                await sb.exec("true", timeout=0)
            with pytest.raises(ValueError, match="non-empty list"):
                await sb.exec([], timeout=1)
            rc, out, err = await sb.exec(["sh", "-c", "echo out; echo err >&2; exit 5"], timeout=5)
            assert (rc, out, err) == (5, "out\n", "err\n")

    run(go())


def test_exec_refuses_nul_bytes_and_lone_surrogates_before_running():
    # Checked before the sandbox is needed: the same ValueError from every backend.
    from slime.agent.sandbox.base import check_exec_args

    for cmd, where in (
        (["python3", "-c", "print(1)\0"], r"cmd\[2\] contains a NUL byte"),
        (["echo", "\ud800"], r"cmd\[1\] contains '\\ud800'.*lone surrogate"),
        ("echo \udcff", r"cmd contains '\\udcff'.*lone surrogate"),
        ("echo a\0b", r"cmd contains a NUL byte"),
    ):
        with pytest.raises(ValueError, match=where):
            check_exec_args(cmd, 1, None)
    with pytest.raises(ValueError, match="value of X must be a string without NUL bytes or lone"):
        check_exec_args(["true"], 1, {"X": "\ud800"})

    async def go():
        async with LocalSandbox(bwrap_path="/nonexistent/bwrap", allow_unisolated=True) as sb:
            with pytest.raises(ValueError, match=r"cmd\[2\] contains a NUL byte"):
                await sb.exec(["python3", "-c", "print(1)\0"], timeout=5)
            with pytest.raises(ValueError, match="lone surrogate"):
                await sb.exec(["python3", "-c", "print('\ud800')"], timeout=5)
            return await sb.exec(["echo", "still works"], timeout=5)

    assert run(go()).stdout == "still works\n"


def test_write_file_takes_only_bytes_or_valid_text():
    async def go():
        async with LocalSandbox(bwrap_path="/nonexistent/bwrap", allow_unisolated=True) as sb:
            # bytes(5) would be five NUL bytes and bytes([104, 105]) b"hi": refused, not guessed
            for data in (5, [104, 105], None, 1.5):
                with pytest.raises(TypeError, match=r"write_file\('f'\): data must be bytes or"):
                    await sb.write_file("f", data)
            with pytest.raises(ValueError, match=r"write_file\('f'\).*'\\udcff'.*lone surrogate"):
                await sb.write_file("f", "ok\udcff")
            await sb.write_file("a", bytearray(b"ab"))
            await sb.write_file("m", memoryview(b"\x00cd"))
            await sb.write_file("t", "h\x00é")  # NUL is fine in a file
            written = [await sb.read_file(n) for n in ("a", "m", "t")]
            return written, (sb.host_workdir / "f").exists()

    contents, f_written = run(go())
    assert contents == [b"ab", b"\x00cd", "h\x00é".encode()] and not f_written
