"""Sandboxes that run agent commands: a protocol and two backends.

``make_sandbox("local", **limits)`` isolates with bubblewrap on this machine;
``make_sandbox("e2b", ...)`` uses E2B cloud sandboxes. Backends are imported
only when asked for, so importing this package pulls in neither the E2B SDK
nor anything else heavy.
"""

from __future__ import annotations

from typing import Any

from slime.agent.sandbox.base import (
    TIMEOUT_RC,
    ExecResult,
    IsolationUnavailable,
    Sandbox,
    SandboxError,
)
from slime.core.registry import Registry

__all__ = [
    "SANDBOXES",
    "TIMEOUT_RC",
    "ExecResult",
    "IsolationUnavailable",
    "Sandbox",
    "SandboxError",
    "make_sandbox",
]

SANDBOXES = Registry(
    "sandbox backend",
    {
        "local": "slime.agent.sandbox.local:LocalSandbox",
        "e2b": "slime.agent.sandbox.e2b:E2BSandbox",
    },
)


def make_sandbox(backend: str, **kwargs: Any) -> Sandbox:
    """A not-yet-started sandbox of ``backend``; use it as ``async with``."""
    cls = SANDBOXES.get(backend)
    return cls(**kwargs)
