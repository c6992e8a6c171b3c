"""External engines against a real built-in engine server with a token of its own (in this process).

The preflight's probes (``launchers.node.preflight_external``): a wrong or missing token is refused
naming the address, a frozen declaration skips the weight-update probe; the job's side
(``ExternalEngines``): a frozen engine keeps its weights and version, an unfrozen one takes the update;
the clients send the external token, never the job's secret.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")

from launchers.node.preflight_external import external_checks
from slime.backends.rollout.builtin.server import start_server
from slime.backends.rollout.client import EngineClient
from slime.backends.rollout.external import ExternalEngines, engine_secret
from tests.fixtures.spec_helpers import CPU_SPEC, DELETE, load, spec

TOKEN = "the-engines-own-token"


@pytest.fixture(scope="module")
def server(tiny_model):
    srv = start_server(tiny_model(), host="127.0.0.1", port=0, seed=0, secret=TOKEN)
    srv.engine.weight_version = "0"
    yield srv
    srv.stop()


def _spec(server, **edits):
    addr = server.url.removeprefix("http://")
    base = {
        "model.builtin": DELETE,
        "model.path": str(server.engine.model_path),
        "rollout.external": [addr],
        "rollout.external_token_secret": "EXT_TOKEN",
        "cluster.secrets": {"EXT_TOKEN": {"env": "EXT_TOKEN"}},
        **edits,
    }
    return load(spec(CPU_SPEC, **base)).spec


def _version(server) -> str:
    async def go():
        async with EngineClient(server.url, secret=TOKEN) as c:
            return (await c.get_model_info())["weight_version"]

    return asyncio.run(go())


def test_preflight_refuses_a_wrong_or_missing_token_and_skips_the_update_probe_when_frozen(server):
    s = _spec(server)
    rows, checks = external_checks(s, env={"EXT_TOKEN": "not-the-token"})
    assert not checks[0].ok and "refused the token (HTTP 403)" in checks[0].message
    assert rows[0]["reachable"] and rows[0]["model"] is None
    _, checks = external_checks(s, env={})
    assert not checks[0].ok and "$EXT_TOKEN" in checks[0].message
    rows, checks = external_checks(s, env={"EXT_TOKEN": TOKEN})
    assert checks[0].ok and rows[0]["weights"] == "accepts updates", checks[0].message
    rows, checks = external_checks(_spec(server, **{"rollout.external_frozen": True}), env={"EXT_TOKEN": TOKEN})
    assert checks[0].ok and rows[0]["weights"] == "frozen (declared)"


def test_frozen_external_engines_keep_their_weights_and_unfrozen_ones_take_updates(server, monkeypatch, tmp_path):
    monkeypatch.setenv("EXT_TOKEN", TOKEN)
    model = server.engine.model_path
    frozen = ExternalEngines(_spec(server, **{"rollout.external_frozen": True}))
    try:
        assert engine_secret(frozen.spec) == TOKEN
        frozen.update_weights(model, 7)
        assert _version(server) == "0"
    finally:
        frozen.stop()
    live = ExternalEngines(_spec(server))
    try:
        live.update_weights(model, 7)
        assert _version(server) == "7" and live.health() == {server.url: True}
    finally:
        live.stop()
        server.engine.weight_version = "0"
