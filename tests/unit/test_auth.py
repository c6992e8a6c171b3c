"""The job's secret (``slime.core.auth``) and the servers that require it, without Ray.

The secret file is private (0600 in a 0700 dir) and replaced per instance; the built-in engine
refuses requests without it (401) or with another (403), leaves ``/health`` open, and loads weights
only from inside the run dir; the engine client sends it; SGLang gets it from a private ``--config``
file, never its command line.
"""

from __future__ import annotations

import asyncio
import stat
from concurrent.futures import Future
from pathlib import Path

import pytest

from slime.backends.rollout.builtin.server import EngineServer
from slime.backends.rollout.client import EngineClient, EngineError
from slime.backends.sglang import launch
from slime.backends.sglang.backend import api_key_config, with_api_key
from slime.core.auth import (
    SECRET_ENV,
    auth_headers,
    check_bearer,
    http_refused,
    job_secret,
    new_secret,
    ray_auth_env,
    secret_path,
)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_secret_is_private_and_each_instance_gets_a_new_one(tmp_path):
    auth = tmp_path / "auth"
    first = new_secret(auth, "7.0")
    assert first == secret_path(auth, "7.0") and _mode(auth) == 0o700 and _mode(first) == 0o600
    value = first.read_text()
    assert len(value) == 64 and int(value, 16) >= 0  # 256 random bits, hex
    second = new_secret(auth, "7.1")  # the requeued instance
    assert second.read_text() != value and not first.exists()  # the old one is gone
    assert sorted(p.name for p in auth.iterdir()) == ["secret-7.1"]  # no temp file left either


def test_processes_find_the_secret_by_path_and_auth_can_be_turned_off(tmp_path, monkeypatch):
    path = new_secret(tmp_path, "1.0")
    env = ray_auth_env(path)
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path), SECRET_ENV: str(path)}
    assert path.read_text() not in "".join(env.values())  # a path, never the value
    monkeypatch.setenv(SECRET_ENV, str(path))
    assert job_secret() == path.read_text()
    assert auth_headers() == {"Authorization": f"Bearer {path.read_text()}"}
    monkeypatch.setenv("SLIME_JOB_AUTH", "off")
    assert job_secret() is None and auth_headers() == {}
    monkeypatch.delenv("SLIME_JOB_AUTH")
    monkeypatch.delenv(SECRET_ENV)
    assert job_secret() is None


def test_bearer_check():
    assert check_bearer("Bearer s3cret", "s3cret") and check_bearer("bearer s3cret", "s3cret")
    for bad in (None, "", "s3cret", "Bearer", "Bearer other", "Basic s3cret", "Bearer s3cret2"):
        assert not check_bearer(bad, "s3cret")


class _StubEngine:
    """What the server's handlers read of an engine (no model)."""

    model_path, tokenizer_path, weight_version, alive = "/m", "/m", "default", True

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def update_weights_from_disk(self, path: str, **_: object) -> Future:
        self.loaded.append(path)
        fut: Future = Future()
        fut.set_result((True, "ok"))
        return fut


@pytest.fixture
def server(tmp_path):
    engine = _StubEngine()
    srv = EngineServer(engine, "127.0.0.1", 0, secret="s3cret", weights_root=tmp_path / "run").start()
    yield srv
    srv.stop()


def _status(url: str, path: str, headers: dict[str, str], body: dict | None = None) -> int:
    async def go() -> int:
        client = EngineClient(url, secret="", retries=0)  # no secret of its own: only `headers`
        try:
            session = client._session()
            method = "POST" if body is not None else "GET"
            async with session.request(method, url + path, json=body, headers=headers) as resp:
                return resp.status
        finally:
            await client.close()

    return asyncio.run(go())


def test_the_builtin_engine_refuses_requests_without_the_secret(server, tmp_path):
    url = server.url
    for path in ("/get_model_info", "/get_server_info", "/health_generate", "/flush_cache"):
        assert _status(url, path, {}) == 401, path
        assert _status(url, path, {"Authorization": "Bearer wrong"}) == 403, path
    assert _status(url, "/generate", {}, {"input_ids": [1]}) == 401
    assert _status(url, "/health", {}) == 200  # a liveness bit, open as in SGLang
    assert _status(url, "/get_model_info", {"Authorization": "Bearer s3cret"}) == 200
    assert http_refused(url) is None  # what the runtime checks once engines are up
    with pytest.raises(EngineError) as exc:
        asyncio.run(EngineClient(url, secret="wrong", retries=0).get_model_info())
    assert exc.value.status == 403
    assert asyncio.run(EngineClient(url, secret="s3cret").get_model_info())["model_path"] == "/m"


def test_the_builtin_engine_loads_weights_only_from_the_run_dir(server, tmp_path):
    ok = {"Authorization": "Bearer s3cret"}
    inside = tmp_path / "run" / "tasks" / "0" / "weights" / "v1"
    assert _status(server.url, "/update_weights_from_disk", ok, {"model_path": str(inside)}) == 200
    for outside in ("/etc", str(tmp_path / "elsewhere"), str(tmp_path / "run" / ".." / "x")):
        assert _status(server.url, "/update_weights_from_disk", ok, {"model_path": outside}) == 403
    assert server.engine.loaded == [str(inside)]


def test_without_a_secret_the_builtin_engine_answers_everyone(tmp_path):
    srv = EngineServer(_StubEngine(), "127.0.0.1", 0).start()
    try:
        assert _status(srv.url, "/get_model_info", {}) == 200
        assert "answered HTTP 200" in (http_refused(srv.url) or "")
    finally:
        srv.stop()


def test_sglang_reads_the_secret_from_a_private_config_file_not_argv(tmp_path, monkeypatch):
    path = new_secret(tmp_path / "auth", "3.0")
    monkeypatch.setenv(SECRET_ENV, str(path))
    config = api_key_config()
    assert config is not None and _mode(config) == 0o600 and config.parent == path.parent
    assert config.read_text() == f'api-key: "{path.read_text()}"\n'
    cmd = launch.EngineCommand(
        engine=0, node_rank=0, nnodes=1, node=0, host="h", gpus=(0,), port=1, argv=("py", "-m", "sglang.launch_server")
    )
    argv = with_api_key(cmd, config).argv
    assert argv[-2:] == ("--config", str(config)) and path.read_text() not in " ".join(argv)
    stand_in = launch.EngineCommand(
        engine=0, node_rank=0, nnodes=1, node=0, host="h", gpus=(), port=1, argv=("py", "-m", "x.server")
    )
    assert with_api_key(stand_in, config) == stand_in  # stand-ins read $SLIME_JOB_SECRET_FILE themselves
    assert not new_secret(tmp_path / "auth", "3.1").with_name("secret-3.0.sglang.yaml").exists()  # rotated away
    monkeypatch.delenv(SECRET_ENV)
    assert api_key_config() is None


@pytest.mark.parametrize("key", ["api-key", "api_key", "config"])
def test_rollout_sglang_args_cannot_set_the_key(key):
    with pytest.raises(launch.LaunchError, match="slime sets"):
        launch.flags_from_args({key: "x"}, field_name="rollout.sglang.args", reserved=launch._ENGINE_RESERVED)
