"""The environment every process of a run inherits: quiet logs, Ray's settings, OpenMP's wait policy.

:func:`apply_worker_env` is the one place that sets it, wherever a run's processes start: the node
bootstrap and its ``ray start``, the driver (and a standalone driver's private Ray), the built-in engine
server's CLI. It travels through inherited environments, not a Ray ``runtime_env``: any non-empty runtime
env makes Ray start each worker through ``setup_worker.py``, one more Python process per worker that
imports Ray before the worker does. Values already set by the user win, except ``RAY_USAGE_STATS_ENABLED``.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

__all__ = ["QUIET_ENV", "RAY_ENV", "apply_worker_env", "cpu_only_node"]

QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
}
RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    # Ray runs workers at nice 15 by default; on a shared machine that starves the trainer.
    "RAY_worker_niceness": "0",
}


def cpu_only_node() -> bool:
    """No NVIDIA driver here (``/dev/nvidiactl``): torch runs on the CPU."""
    return not Path("/dev/nvidiactl").exists()


def apply_worker_env(env: MutableMapping[str, str], *, omp_passive: bool | None = None) -> None:
    """Add the run's environment to ``env`` (``os.environ`` or a child's env), keeping values already set.

    :data:`QUIET_ENV` and :data:`RAY_ENV`; ``RAY_USAGE_STATS_ENABLED=0`` always (a job's Ray never reports
    usage); ``OMP_WAIT_POLICY=PASSIVE`` when ``omp_passive`` (default: on a :func:`cpu_only_node`):
    OpenMP threads that spin while waiting starve each other when a job's processes share the cores
    (``tests/bench/omp_wait_policy.py``), while sleeping waiters cost little on idle cores. It must be
    set before the process imports torch; GPU nodes keep OpenMP's default.
    """
    for k, v in (*QUIET_ENV.items(), *RAY_ENV.items()):
        env.setdefault(k, v)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    if cpu_only_node() if omp_passive is None else omp_passive:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
