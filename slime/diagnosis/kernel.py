"""Out-of-memory kills the kernel logged on this node (``dmesg``), to tell a host OOM from another SIGKILL.

Reads the kernel ring buffer (root, or ``kernel.dmesg_restrict=0``); where it cannot be read the answer
is "none seen" and the death stays ``process_killed``. Lines are matched on the kernel's own words
("Killed process PID (NAME)", "Memory cgroup out of memory"), for both cgroup v1 and v2.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["OomKill", "oom_kills"]

_KILLED = re.compile(r"^\[\s*(\d+\.\d+)\]\s*(.*Killed process (\d+) \(([^)]*)\).*)$")
_CGROUP = re.compile(r"Memory cgroup out of memory|oom-kill:.*oom_memcg=(\S+)")


@dataclass(frozen=True, slots=True)
class OomKill:
    pid: int
    name: str  # the process name the kernel saw (Ray workers: "ray::TrainerRa…")
    line: str
    cgroup: bool  # a memory cgroup's limit, not the whole machine


def oom_kills(since_epoch: float) -> list[OomKill]:
    """OOM kills logged on this node since ``since_epoch`` (seconds since the epoch)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return []
    boot = time.time() - uptime
    lines = out.splitlines()
    kills = []
    for i, ln in enumerate(lines):
        m = _KILLED.match(ln)
        if m and boot + float(m.group(1)) >= since_epoch - 1:
            context = "\n".join(lines[max(0, i - 30) : i])
            kills.append(OomKill(int(m.group(3)), m.group(4), m.group(2).strip(), bool(_CGROUP.search(context))))
    return kills
