"""The job's driver process (``python -m slime.train RUN_DIR --task N``) as the head's bootstrap runs it.

Kept apart because a stop's way to the driver is its own protocol: the driver starts with USR1
ignored; a stop request becomes exactly one USR1, sent once the driver has a handler (``SigCgt``),
never resent (a second one could kill a driver that restored the default at exit); ``stop`` gives
``grace_s`` to save, then SIGKILL; a driver killed by signal N reports 128+N. Not guaranteed:
delivery to a driver that never installs a USR1 handler.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Callable

from slime.core.procfs import catches

__all__ = ["catches", "run_driver_process"]


def _ignore_usr1() -> None:
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def run_driver_process(
    cmd: list[str],
    env: dict[str, str],
    *,
    stop: threading.Event,
    stop_requested: Callable[[], bool],
    grace_s: float,
    say: Callable[[str], None],
    on_start: Callable[[subprocess.Popen], None] | None = None,
) -> int:
    """Run the driver until it exits (see the module doc); returns its exit code."""
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_ignore_usr1)
    if on_start is not None:
        on_start(proc)
    requested = delivered = False
    while True:
        try:
            rc = proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if not requested and stop_requested():
            requested = True
            say("stop requested (SLURM's warning, or USR1): asking the driver to checkpoint and stop")
        if requested and not delivered and catches(proc.pid, signal.SIGUSR1) is not False:
            delivered = True
            try:
                proc.send_signal(signal.SIGUSR1)
            except ProcessLookupError:
                pass
        if stop.is_set():  # the bootstrap forwarded TERM/INT itself; give the driver time to save
            try:
                rc = proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
            break
    return 128 - rc if rc < 0 else rc
