"""The local launcher: the SLURM path minus sbatch, on this machine as a single node.

``dryrun`` returns the run files plus ``python -m launchers.node.bootstrap RUN_DIR --task N
--local``; ``submit`` creates the run dir atomically and runs that command in the foreground for
each task in turn, recording PIDs and exit codes in ``jobs.json`` (``launchers.local.jobs``). The
bootstrap's output goes to stderr, so stdout holds only the result (``--json``).
``SubmitOptions.extra``: ``python`` (interpreter, default this one), ``driver`` (module run after
the preflight; ``$SLIME_DRIVER`` works too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from launchers.base import (
    DryRun,
    Launcher,
    Request,
    Submission,
    SubmitOptions,
    create_run_dir,
    default_run_dir,
    run_files,
)
from launchers.local import jobs as local_jobs
from launchers.status import CancelResult, RunStatus
from slime.core.errors import ExitCode, InfraError
from slime.core.paths import RunPaths
from slime.spec import LoadedSpec
from slime.spec.types import Spec

__all__ = ["LocalLauncher", "bootstrap_command"]


def bootstrap_command(
    python: str, run_dir: str, task: int, *, preflight_only: bool, driver: str | None
) -> tuple[str, ...]:
    cmd = [python, "-m", "launchers.node.bootstrap", run_dir, "--task", str(task), "--local"]
    if preflight_only:
        cmd.append("--preflight-only")
    if driver:
        cmd += ["--driver", driver]
    return tuple(cmd)


def job_env(spec: Spec) -> dict[str, str]:
    """The job's environment, as the SLURM script builds it: ours + ``cluster.env`` + each
    ``cluster.secrets`` entry read from its reference (env var, or a file's first line, stripped).
    Checked before anything is written: a missing secret fails the submit, naming it."""
    c = spec.cluster
    env = {**os.environ, **{k: str(v) for k, v in c.env.items()}}
    for name, ref in sorted(c.secrets.items()):
        if ref.env:
            if ref.env not in os.environ:
                raise InfraError(
                    f"cluster.secrets.{name}: environment variable {ref.env} is not set; export it before slime-submit"
                )
            env[name] = os.environ[ref.env]
        else:
            try:
                with open(os.path.expanduser(ref.file), encoding="utf-8") as fh:
                    env[name] = fh.readline().strip()
            except OSError as exc:
                raise InfraError(f"cluster.secrets.{name}: cannot read file {ref.file}: {exc.strerror}") from None
    return env


def shell_exit_code(rc: int, what: str, logs: Path) -> int:
    """``rc`` as a shell reports it: a death by signal N (Popen's -N; the OOM killer sends SIGKILL)
    is said on stderr, naming ``what`` and its ``logs``, and becomes 128+N."""
    if rc >= 0:
        return rc
    try:
        name = f"{signal.Signals(-rc).name} ({-rc})"
    except ValueError:
        name = f"signal {-rc}"
    hint = " (out of memory? see dmesg)" if -rc == signal.SIGKILL else ""
    sys.stderr.write(f"slime: {what} was killed by {name}{hint}; its logs: {logs}\n")
    return 128 - rc


def _run_foreground(
    cmd: list[str],
    on_start: Callable[[int], None] | None = None,
    grace: float = 30.0,
    env: dict[str, str] | None = None,
) -> int:
    """Run ``cmd`` with its output on our stderr (our stdout carries only the result, e.g. ``--json``).
    On Ctrl-C the child got the same SIGINT: give it time to tear its Ray down (subprocess.run
    would SIGKILL it after 0.25 s), then kill it."""
    sys.stdout.flush()
    proc = subprocess.Popen(cmd, env=env, stdout=sys.stderr.fileno())
    if on_start is not None:
        on_start(proc.pid)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return ExitCode.INTERRUPTED


class LocalLauncher(Launcher):
    name = "local"

    def dryrun(self, loaded: LoadedSpec, options: SubmitOptions) -> DryRun:
        run_dir = default_run_dir(loaded, options)
        python = options.extra.get("python") or sys.executable
        command = bootstrap_command(
            python, str(run_dir), 0, preflight_only=options.preflight_only, driver=options.extra.get("driver")
        )
        notes = []
        if len(loaded.tasks) > 1:
            notes.append(
                f"{len(loaded.tasks)} sweep tasks run one after another (the command below with "
                f"--task 0 .. {len(loaded.tasks) - 1})"
            )
        request = Request(
            launcher=self.name,
            run_dir=run_dir,
            loaded=loaded,
            files=tuple(run_files(loaded, run_dir)),
            command=command,
            notes=tuple(notes),
        )
        return DryRun(request=request, options=options)

    def submit(self, dryrun: DryRun) -> Submission:
        from slime.provenance import refuse_duplicate, write_lock

        request, options = dryrun.request, dryrun.options
        env = job_env(request.spec)
        refuse_duplicate(request, options, self.status)  # same spec running: exit 2 unless --force
        paths = create_run_dir(request)
        write_lock(paths, request, options)
        n_tasks = request.n_tasks
        paths.write_jobs(
            {"launcher": self.name, "job_ids": [], "tasks": n_tasks, "preflight_only": options.preflight_only}
        )
        returncode = 0
        for task in range(n_tasks):
            rc = _run_foreground(
                _with_task(request.command, task),
                on_start=lambda pid, t=task: local_jobs.record_start(paths, t, pid),
                env=env,
            )
            local_jobs.record_exit(paths, task, rc)
            rc = shell_exit_code(rc, f"task {task}'s bootstrap", paths.task(task).logs)
            if rc != 0:
                returncode = rc
                break
        return Submission(run_dir=paths.root, returncode=returncode, final_metrics=_summary(paths, n_tasks - 1))

    # ------------------------------------------------------------------ job management
    def status(self, paths: RunPaths) -> RunStatus:
        return local_jobs.run_status(paths)

    def cancel(self, paths: RunPaths, task: int | None = None) -> CancelResult:
        return local_jobs.cancel(paths, task)

    def log_files(self, paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
        return local_jobs.log_files(paths, task, node)


def _with_task(command: tuple[str, ...], task: int) -> list[str]:
    cmd = list(command)
    cmd[cmd.index("--task") + 1] = str(task)
    return cmd


def _summary(paths: RunPaths, task: int) -> dict | None:
    """The runtime's ``summary.json`` of ``task`` (None when it wrote none)."""
    try:
        return json.loads(paths.task(task).summary.read_text())
    except (OSError, ValueError):
        return None
