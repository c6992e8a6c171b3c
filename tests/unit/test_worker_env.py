"""``slime.core.worker_env.apply_worker_env``: the one function that sets a run's process environment."""

from __future__ import annotations

from slime.core import worker_env
from slime.core.worker_env import QUIET_ENV, RAY_ENV, apply_worker_env


def test_defaults_keep_what_the_user_set_but_usage_stats_stay_off(monkeypatch):
    monkeypatch.setattr(worker_env, "cpu_only_node", lambda: True)
    env = {
        "HF_HUB_OFFLINE": "0",
        "RAY_worker_niceness": "5",
        "OMP_WAIT_POLICY": "ACTIVE",
        "RAY_USAGE_STATS_ENABLED": "1",
    }
    apply_worker_env(env)
    assert env["HF_HUB_OFFLINE"] == "0" and env["RAY_worker_niceness"] == "5" and env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    fresh: dict[str, str] = {}
    apply_worker_env(fresh)
    assert fresh == {**QUIET_ENV, **RAY_ENV, "RAY_USAGE_STATS_ENABLED": "0", "OMP_WAIT_POLICY": "PASSIVE"}


def test_openmp_waits_passively_on_cpu_nodes_or_when_asked(monkeypatch):
    monkeypatch.setattr(worker_env, "cpu_only_node", lambda: False)
    gpu: dict[str, str] = {}
    apply_worker_env(gpu)
    assert "OMP_WAIT_POLICY" not in gpu  # GPU nodes keep OpenMP's default
    engine: dict[str, str] = {}
    apply_worker_env(engine, omp_passive=True)  # the built-in engine server's CLI, on any node
    assert engine["OMP_WAIT_POLICY"] == "PASSIVE"
