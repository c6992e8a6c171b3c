"""The environment every process of a run inherits: quiet HF and tokenizers logs, the hub offline.

Given to Ray's processes through the environment they inherit (the bootstrap's ``ray start``, or the
standalone driver's own ``os.environ`` before ``ray.init``), not through a Ray ``runtime_env``: any
non-empty runtime env makes Ray start each worker through ``setup_worker.py``, one more Python
process per worker that imports Ray before the worker itself does (measured: 1.5-2 core-s per
worker, six workers per smoke test). Values already set by the user win.
"""

from __future__ import annotations

import os

__all__ = ["QUIET_ENV", "apply_quiet_env"]

QUIET_ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_DEDUP_LOGS": "0",
}


def apply_quiet_env(env: dict[str, str] | os._Environ[str]) -> None:
    """Add :data:`QUIET_ENV` to ``env`` (``os.environ`` or a child's env), keeping values already set."""
    for k, v in QUIET_ENV.items():
        env.setdefault(k, v)
