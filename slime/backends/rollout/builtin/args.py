"""The options the built-in engine takes in ``rollout.builtin.args`` (``-`` or ``_`` spelling)."""

from __future__ import annotations

__all__ = ["BUILTIN_ENGINE_ARGS", "builtin_engine_arg"]

BUILTIN_ENGINE_ARGS = (
    "max_running_requests",
    "context_length",
    "dtype",
    "num_threads",
    "max_prefill_tokens",
    "max_cache_bytes",
)


def builtin_engine_arg(key: str) -> str | None:
    """The built-in engine option ``key`` names, or None."""
    name = key.strip().replace("-", "_")
    return name if name in BUILTIN_ENGINE_ARGS else None
