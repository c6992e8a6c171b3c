"""The driver a smoke run's bootstrap starts instead of ``slime.train``: the run, preempted and resumed once.

``python -m slime.cli.smoke_driver RUN_DIR --task N`` runs ``slime.train`` stopped after the
second-to-last rollout (``SLIME_STOP_AFTER_ROLLOUT``: checkpoint, exit 75, as on a time-limit
warning), then again on the same run dir and Ray cluster, resuming, as a requeue would. It keeps
the first run's metrics, state and both exit codes under ``tasks/<N>/smoke/`` for the judge.
Exit code: the second run's, or the first's when it did not stop as asked. TERM/INT/USR1 go to
the running ``slime.train`` and stop any second run. Standard library and ``slime.core`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from slime.core.errors import ExitCode
from slime.core.paths import TaskPaths, atomic_write

__all__ = ["STOP_AFTER_ENV", "main", "smoke_dir"]

STOP_AFTER_ENV = "SLIME_STOP_AFTER_ROLLOUT"  # read by slime.runtime.driver (not imported: no torch here)


def smoke_dir(tp: TaskPaths) -> Path:
    """Where the smoke driver keeps the first run's records."""
    return tp.dir / "smoke"


class _Child:
    """The running ``slime.train``; signals to us are passed on to it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.signalled = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._forward)

    def _forward(self, signum: int, frame: object) -> None:
        self.signalled = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run(self, cmd: list[str], env: dict[str, str]) -> int:
        self.proc = subprocess.Popen(cmd, env=env)
        rc = self.proc.wait()
        return 128 - rc if rc < 0 else rc


def _num_rollouts(tp: TaskPaths) -> int:
    return int(json.loads(tp.resolved.read_text())["spec"]["rollout"]["num_rollouts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m slime.cli.smoke_driver", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--task", type=int, default=0)
    args = ap.parse_args(argv)
    tp = TaskPaths(args.run_dir.resolve(), args.task)
    out = smoke_dir(tp)
    out.mkdir(parents=True, exist_ok=True)
    stop_after = _num_rollouts(tp) - 2
    cmd = [sys.executable, "-m", "slime.train", str(tp.root), "--task", str(args.task)]
    child = _Child()
    phases: list[dict[str, int]] = []

    env = {k: v for k, v in os.environ.items() if k != STOP_AFTER_ENV}
    first = child.run(cmd, {**env, STOP_AFTER_ENV: str(stop_after)} if stop_after >= 0 else env)
    phases.append({"exit_code": first, "stop_after_rollout": stop_after})
    for src, name in ((tp.metrics, "phase1-metrics.jsonl"), (tp.state, "phase1-state.json")):
        if src.exists():
            shutil.copyfile(src, out / name)
    atomic_write(out / "phases.json", json.dumps(phases, indent=1) + "\n")
    if first != ExitCode.REQUEUE or child.signalled:
        return first

    second = child.run(cmd, env)
    phases.append({"exit_code": second})
    atomic_write(out / "phases.json", json.dumps(phases, indent=1) + "\n")
    return second


if __name__ == "__main__":
    sys.exit(main())
