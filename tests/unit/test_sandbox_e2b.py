"""E2BSandbox against a real local HTTP server that speaks E2B's protocols.

E2B's cloud cannot be reached from here, so the boundary is replaced, not the
SDK: the real ``e2b`` SDK (its REST client, pyqwest transport and connect-RPC
client) is pointed with ``api_url``/``sandbox_url`` at a threaded stdlib WSGI
server on 127.0.0.1. That server implements the control-plane calls the SDK
makes (``POST /v2/sandboxes``, ``DELETE /sandboxes/{id}``) and envd's
``/files``, ``/health`` and ``process.Process`` RPCs; the RPCs are served by the
SDK's own generated connect WSGI application, and commands run as real
subprocesses in a temp dir. Failures are injected as HTTP error responses.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socketserver
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

pytest.importorskip("e2b")

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.envd.process import process_connect, process_pb
from protobuf import Oneof

from slime.agent.sandbox import TIMEOUT_RC, Sandbox, SandboxError, make_sandbox
from slime.agent.sandbox.e2b import E2BSandbox, is_transient, resolve_secret_ref

API_KEY = "e2b_TESTKEY_" + uuid.uuid4().hex


class _Process(process_connect.ProcessSync):
    """envd's process service: real subprocesses."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[int, subprocess.Popen] = {}
        self.signals: list[tuple[int, int]] = []

    def start(self, request, ctx) -> Iterator[process_pb.StartResponse]:
        cfg = request.process
        cwd = self.root / (cfg.cwd if cfg.has_field("cwd") else "/home/user").lstrip("/")
        cwd.mkdir(parents=True, exist_ok=True)
        args = [a for a in cfg.args if a != "-l"]  # no login shell: the host's profile is not the VM's
        proc = subprocess.Popen(
            [cfg.cmd, *args],
            cwd=cwd,
            env={"PATH": os.environ["PATH"], **dict(cfg.envs)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.procs[proc.pid] = proc

        def event(**kw) -> process_pb.StartResponse:
            ((name, value),) = kw.items()
            return process_pb.StartResponse(event=process_pb.ProcessEvent(event=Oneof(name, value)))

        try:
            yield event(start=process_pb.ProcessEvent.StartEvent(pid=proc.pid))
            out, err = proc.communicate()
            for field, data in (("stdout", out), ("stderr", err)):
                if data:
                    yield event(data=process_pb.ProcessEvent.DataEvent(output=Oneof(field, data)))
            rc = proc.returncode
            yield event(
                end=process_pb.ProcessEvent.EndEvent(
                    exit_code=rc if rc >= 0 else 128 - rc, exited=rc >= 0, status="exit"
                )
            )
        finally:  # the client went away: envd kills the process
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def send_signal(self, request, ctx) -> process_pb.SendSignalResponse:
        pid = request.process.selector.value
        proc = self.procs.get(pid)
        if proc is None:
            raise ConnectError(Code.NOT_FOUND, f"process {pid} not found")
        self.signals.append((pid, int(request.signal)))
        proc.kill()
        return process_pb.SendSignalResponse()


class FakeE2B:
    """Control plane + envd on one WSGI app, with request log and fault injection."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process = _Process(root)
        self.rpc = process_connect.ProcessWSGIApplication(self.process)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.faults: dict[tuple[str, str], list[int]] = {}
        self.created: list[dict] = []
        self.killed: list[str] = []
        self.lock = threading.Lock()

    def fail(self, method: str, path: str, *statuses: int) -> None:
        self.faults.setdefault((method, path), []).extend(statuses)

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p, _ in self.requests if (m, p) == (method, path))

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ["PATH_INFO"]
        if environ.get("HTTP_TRANSFER_ENCODING", "").lower() == "chunked":
            _dechunk(environ)  # wsgiref hands over the raw socket stream
        headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
        with self.lock:
            self.requests.append((method, path, headers))
            pending = self.faults.get((method, path))
            status = pending.pop(0) if pending else None
        if status is not None:
            return self._json(start_response, status, {"code": status, "message": "injected failure"})
        if (method, path) == ("POST", "/v2/sandboxes"):
            if headers.get("x-api-key") != API_KEY:
                return self._json(start_response, 401, {"code": 401, "message": "bad key"})
            body = json.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
            self.created.append({"body": body, "idempotency": headers.get("idempotency-key")})
            return self._json(
                start_response,
                201,
                {
                    "templateID": body["templateID"],
                    "sandboxID": "sbx-" + uuid.uuid4().hex[:8],
                    "clientID": "c1",
                    "envdVersion": "0.6.9",
                    "envdAccessToken": "envd-token",
                },
            )
        if method == "DELETE" and path.startswith("/sandboxes/"):
            self.killed.append(path.rsplit("/", 1)[1])
            start_response("204 No Content", [])
            return [b""]
        if path == "/health":
            start_response("204 No Content", [])
            return [b""]
        if path == "/files":
            from urllib.parse import parse_qs

            target = Path(parse_qs(environ["QUERY_STRING"])["path"][0])
            local = self.root / str(target).lstrip("/")  # the VM's filesystem lives under root
            if method == "POST":
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_bytes(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
                return self._json(start_response, 200, [{"name": local.name, "type": "file", "path": str(target)}])
            if not local.is_file():
                return self._json(start_response, 404, {"code": 404, "message": f"{target} not found"})
            start_response("200 OK", [("Content-Type", "application/octet-stream")])
            return [local.read_bytes()]
        if path.startswith("/process.Process/"):
            return self.rpc(environ, start_response)
        return self._json(start_response, 404, {"code": 404, "message": f"no route {path}"})

    @staticmethod
    def _json(start_response, status: int, obj) -> list[bytes]:
        reason = {200: "OK", 201: "Created"}.get(status, "Error")
        start_response(f"{status} {reason}", [("Content-Type", "application/json")])
        return [json.dumps(obj).encode()]


def _dechunk(environ) -> None:
    stream, body = environ["wsgi.input"], bytearray()
    while size := int(stream.readline().split(b";")[0].strip() or b"0", 16):
        body += stream.read(size)
        stream.readline()
    while stream.readline() not in (b"\r\n", b"\n", b""):  # trailers
        pass
    environ["wsgi.input"] = io.BytesIO(bytes(body))
    environ["CONTENT_LENGTH"] = str(len(body))
    del environ["HTTP_TRANSFER_ENCODING"]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(tmp_path):
    fake = FakeE2B(tmp_path)
    httpd = make_server("127.0.0.1", 0, fake, server_class=_ThreadingServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{httpd.server_port}"
    yield fake
    httpd.shutdown()
    httpd.server_close()
    for proc in fake.process.procs.values():
        if proc.poll() is None:
            proc.kill()


def make(fake: FakeE2B, **kw) -> E2BSandbox:
    opts = dict(
        api_key_ref="test:key",
        secret_resolver=lambda ref: API_KEY,
        api_url=fake.url,
        sandbox_url=fake.url,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
        request_timeout_s=10,
    )
    opts.update(kw)
    return E2BSandbox(**opts)


def run(coro):
    return asyncio.run(coro)


def test_roundtrip_exec_files_and_kill_through_the_sdk(server, caplog):
    caplog.set_level(logging.DEBUG)

    async def go():
        sb = make(server, lifetime_s=120, template="base")
        async with sb:
            rc, out, err = await sb.exec("echo hi; echo oops >&2; exit 3", timeout=10)
            assert (rc, out, err) == (3, "hi\n", "oops\n")
            ok = await sb.exec(["printf", "%s", "$HOME"], timeout=10, env={"X": "1"})
            assert ok.ok and ok.stdout == "$HOME"  # a list is quoted, not shell-expanded
            assert (await sb.exec("echo $X", timeout=10, env={"X": "from-env"})).stdout == "from-env\n"
            await sb.write_file("dir/a.bin", b"\x00\x01payload")
            assert (server.root / "home/user/dir/a.bin").read_bytes() == b"\x00\x01payload"
            assert await sb.read_file("/home/user/dir/a.bin") == b"\x00\x01payload"
            assert (await sb.exec("cat dir/a.bin | wc -c", timeout=10)).stdout.strip() == "9"
            # the write_file contract every backend shares: bytes or valid text only
            with pytest.raises(TypeError, match="data must be bytes or str, got int"):
                await sb.write_file("five.bin", 5)
            with pytest.raises(TypeError, match="got list"):
                await sb.write_file("five.bin", [104, 105])
            with pytest.raises(ValueError, match="lone surrogate"):
                await sb.write_file("five.bin", "\udcff")
            assert not (server.root / "home/user/five.bin").exists()
            return sb, repr(sb)

    sb, shown = run(go())
    [created] = server.created
    assert created["body"]["timeout"] == 120 and created["body"]["templateID"] == "base"
    assert created["body"]["allow_internet_access"] is False
    assert server.killed == [sb.remote_id]
    # The key went to the control plane, and nowhere else we can see.
    assert any(h.get("x-api-key") == API_KEY for _, _, h in server.requests)
    assert API_KEY not in shown and API_KEY not in repr(sb._key) and API_KEY not in str(vars(sb))
    assert all(API_KEY not in r.getMessage() for r in caplog.records)


def test_transient_errors_are_retried_for_idempotent_calls(server, caplog):
    server.fail("POST", "/v2/sandboxes", 502, 429)
    server.fail("POST", "/files", 503, 500)
    server.fail("GET", "/files", 503)

    async def go():
        async with make(server) as sb:
            await sb.write_file("f.txt", "data")
            assert await sb.read_file("f.txt") == b"data"

    run(go())
    assert server.count("POST", "/v2/sandboxes") == 3
    keys = {c["idempotency"] for c in server.created} | {
        h.get("idempotency-key") for m, p, h in server.requests if p == "/v2/sandboxes"
    }
    assert len(keys) == 1 and None not in keys, "a retried create reuses its idempotency key"
    assert len(server.created) == 1
    assert server.count("POST", "/files") == 3 and server.count("GET", "/files") == 2
    retries = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 5
    assert all(API_KEY not in r.getMessage() for r in caplog.records)


def test_exec_is_never_retried_unless_idempotent(server):
    server.fail("POST", "/process.Process/Start", 503)

    async def go():
        async with make(server) as sb:
            with pytest.raises(SandboxError, match="exec failed after 1 attempt"):
                await sb.exec("echo once >> log.txt", timeout=10)
            assert server.count("POST", "/process.Process/Start") == 1
            server.fail("POST", "/process.Process/Start", 503)
            res = await sb.exec("echo again", timeout=10, idempotent=True)
            assert res.stdout == "again\n"
            assert server.count("POST", "/process.Process/Start") == 3

    run(go())


def test_permanent_errors_are_not_retried_and_do_not_leak_the_key(server):
    server.fail("POST", "/v2/sandboxes", 401)

    async def go():
        sb = make(server)
        with pytest.raises(SandboxError) as info:
            await sb.start()
        return info.value

    err = run(go())
    assert server.count("POST", "/v2/sandboxes") == 1
    assert "AuthenticationException" in str(err) and API_KEY not in str(err)
    assert err.__cause__ is None  # the SDK exception (and its request) is not chained


def test_gives_up_after_max_attempts(server):
    server.fail("GET", "/files", 503, 503, 503, 503)

    async def go():
        async with make(server, max_attempts=3) as sb:
            with pytest.raises(SandboxError, match="after 3 attempt"):
                await sb.read_file("missing-anyway")

    run(go())
    assert server.count("GET", "/files") == 3


def test_missing_file_is_permanent(server):
    async def go():
        async with make(server) as sb:
            with pytest.raises(SandboxError, match="permanent FileNotFoundException"):
                await sb.read_file("nope.txt")

    run(go())
    assert server.count("GET", "/files") == 1


def test_timeout_kills_the_command(server):
    async def go():
        async with make(server) as sb:
            t0 = time.monotonic()
            res = await sb.exec("sleep 30", timeout=0.5)
            return res, time.monotonic() - t0

    res, elapsed = run(go())
    assert res.timed_out and res.returncode == TIMEOUT_RC
    assert elapsed < 10
    [(pid, sig)] = server.process.signals
    assert sig == int(process_pb.Signal.SIGKILL)
    assert server.process.procs[pid].wait(timeout=5) is not None


def test_lifetime_limit(server):
    async def go():
        async with make(server, lifetime_s=1) as sb:
            await asyncio.sleep(1.05)
            with pytest.raises(SandboxError, match="lifetime"):
                await sb.exec("true", timeout=5)

    run(go())
    assert server.created[0]["body"]["timeout"] == 1


def test_per_process_limits_are_set_by_ulimit_before_the_command(server):
    show = "ulimit -t; ulimit -v; ulimit -u; ulimit -f; ulimit -c"
    write_2mb = ["python3", "-c", "open('big', 'wb').write(bytes(2 << 20))"]

    async def go(**limits):
        async with make(server, **limits) as sb:
            shown = await sb.exec(show, timeout=10)
            big = await sb.exec(write_2mb, timeout=10)
            alloc = await sb.exec(["python3", "-c", "b = bytearray(512 << 20); print('allocated')"], timeout=20)
            return shown, big, alloc

    shown, big, alloc = run(go(cpu_time_s=3, memory_mb=256, max_procs=32, max_file_mb=1))
    assert shown.stdout.split() == ["3", str(256 * 1024), "32", "1024", "0"]
    assert not big.ok and "File too large" in big.stderr  # EFBIG: the 1 MiB file cap (Python ignores SIGXFSZ)
    assert alloc.returncode != 0 and "MemoryError" in alloc.stderr
    # Able to fail: without limits the same commands run unbounded.
    shown, big, alloc = run(go())
    assert shown.stdout.split()[:2] == ["unlimited", "unlimited"]
    assert big.ok and alloc.ok and alloc.stdout == "allocated\n"


def test_a_refused_ulimit_runs_nothing():
    from slime.agent.sandbox.e2b import ULIMIT_FAILED_RC, _ulimit_prefix

    prefix = _ulimit_prefix(None, None, None, 1)
    assert prefix == "ulimit -c 0 -f 1024 || exit 125\n"
    # Raising a limit above one already set is refused to a non-root user: the command never runs.
    drop = {"user": 65534, "group": 65534, "extra_groups": []} if os.geteuid() == 0 else {}
    res = subprocess.run(
        ["bash", "-c", "ulimit -f 10\n" + prefix + "echo ran"], capture_output=True, text=True, timeout=10, **drop
    )
    assert res.returncode == ULIMIT_FAILED_RC and "ran" not in res.stdout
    assert _ulimit_prefix(None, None, None, None) == ""


def test_secret_references_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("MY_E2B_KEY", "k-env")
    assert resolve_secret_ref("env:MY_E2B_KEY") == "k-env"
    (tmp_path / "key").write_text("k-file\n")
    assert resolve_secret_ref(f"file:{tmp_path}/key") == "k-file"
    with pytest.raises(SandboxError, match="NOT_SET_ANYWHERE is not set"):
        resolve_secret_ref("env:NOT_SET_ANYWHERE")
    with pytest.raises(SandboxError, match="not understood"):
        resolve_secret_ref("vault://x")

    def leaky(ref):
        raise RuntimeError("the secret value is hunter2")

    with pytest.raises(SandboxError) as info:
        run(E2BSandbox(api_key_ref="x", secret_resolver=leaky).start())
    assert "hunter2" not in str(info.value) and "'x'" in str(info.value)


def test_bad_arguments_and_registry():
    with pytest.raises(ValueError, match="lifetime_s"):
        E2BSandbox(lifetime_s=0)
    with pytest.raises(ValueError, match="workdir"):
        E2BSandbox(workdir="relative")
    with pytest.raises(ValueError, match=r"E2BSandbox\(memory_mb=...\) must be a positive integer or None"):
        E2BSandbox(memory_mb=0)
    with pytest.raises(ValueError, match="max_procs"):
        E2BSandbox(max_procs=True)
    sb = make_sandbox("e2b", api_key_ref="env:X")
    assert isinstance(sb, E2BSandbox) and isinstance(sb, Sandbox)
    with pytest.raises(SandboxError, match="not started"):
        run(E2BSandbox().exec("true", timeout=1))


def test_transient_classification():
    import httpx
    from e2b import exceptions as ex

    assert is_transient(ex.RateLimitException("429"))
    assert is_transient(ex.SandboxException("503: busy"))
    assert is_transient(httpx.ConnectError("refused"))
    assert not is_transient(ex.SandboxException("400: bad"))
    assert not is_transient(ex.AuthenticationException("401"))
    assert not is_transient(ex.SandboxNotRunningException("gone"))
    assert not is_transient(ValueError("x"))
