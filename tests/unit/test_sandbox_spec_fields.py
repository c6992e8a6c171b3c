"""Every agent.sandbox field reaches the backend that honours it (the rest are refused by spec rules).

What each backend then does with the value is tested against real processes in
tests/integration/test_sandbox_hardening.py (local) and tests/unit/test_sandbox_e2b.py (e2b).
"""

from __future__ import annotations

import pytest

from slime.agent.generate import sandbox_kwargs
from slime.agent.sandbox import make_sandbox
from slime.spec.types import SandboxSpec


def test_local_backend_gets_every_limit_including_the_whole_sandbox_caps():
    sb = SandboxSpec(
        memory_mb=300, cpu_time_s=7, max_procs=12, max_file_mb=5, work_mb=48, total_memory_mb=900, timeout_s=3
    )
    backend, kwargs = sandbox_kwargs(sb)
    box = make_sandbox(backend, **kwargs)
    assert (box.limits.memory_mb, box.limits.cpu_time_s, box.limits.max_procs, box.limits.max_file_mb) == (
        300,
        7,
        12,
        5,
    )
    assert (box.work_mb, box.total_memory_mb, box.wall_timeout_s) == (48, 900, 3.0)


def test_local_defaults_when_unset():
    backend, kwargs = sandbox_kwargs(SandboxSpec(memory_mb=300))
    box = make_sandbox(backend, **kwargs)
    # total default: two processes at their cap plus /work and the two per-call tmpfs mounts
    assert (box.work_mb, box.total_memory_mb) == (256, 2 * 300 + 256 + 2 * 64)


def test_e2b_backend_sets_the_per_process_limits_in_every_command():
    pytest.importorskip("e2b")
    sb = SandboxSpec(backend="e2b", api_key_secret="K", memory_mb=300, cpu_time_s=7, max_procs=12, max_file_mb=5)
    backend, kwargs = sandbox_kwargs(sb)
    box = make_sandbox(backend, **kwargs)
    assert box._ulimit == f"ulimit -c 0 -t 7 -v {300 * 1024} -u 12 -f {5 * 1024} || exit 125\n"
