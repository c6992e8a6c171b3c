"""The driver a smoke run's bootstrap starts instead of ``slime.train``: the run, preempted and resumed once.

``python -m slime.cli.smoke_driver RUN_DIR --task N`` (the bootstrap's ``--driver``) runs
``python -m slime.train RUN_DIR --task N`` with ``SLIME_STOP_AFTER_ROLLOUT`` set to the
second-to-last rollout (a one-rollout run runs once, unstopped): the runtime stops there exactly
as on SLURM's time-limit warning (checkpoint, exit 75). It then runs ``slime.train`` again on the
same run dir, in the same Ray cluster — what a requeue does, without a second Ray start — and that run resumes from the
checkpoint. In between it keeps what the first run left for ``slime-submit smoke`` to judge, under
``tasks/<N>/smoke/``: ``phase1-metrics.jsonl``, ``phase1-state.json`` and ``phases.json`` (each
run's exit code).

Exit code: the second run's; the first run's when it did not stop as asked (0 included: the judge
then finds nothing resumed). TERM/INT/USR1 are passed on to the running ``slime.train``, and no
second run starts after one. Standard library and ``slime.core`` only (it runs on the node, under the bootstrap).
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
