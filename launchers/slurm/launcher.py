"""The SLURM launcher: spec → run dir + batch script (compile, pure) → sbatch (submit).

``dryrun`` renders ``job.sbatch`` (``launchers.slurm.script``) next to the run files. ``submit``
refuses early when sbatch is missing or no node fits (``launchers.slurm.cluster.check_fits``),
creates the run dir atomically with its log dirs, submits one array per ``MaxArraySize`` tasks
(``launchers.slurm.arrays``) recording ``jobs.json``, and with ``--preflight-only`` waits and prints
each task's preflight (exit 0 or 3). Job management is ``launchers.slurm.jobs``.
``SubmitOptions.extra``: ``python`` (node interpreter), ``driver``, ``wait_timeout_s`` (``--preflight-only``),
``dependency`` and ``kill_on_invalid_dep`` (a chain step; added to ``cluster.slurm.depends_on``'s).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launchers.base import (
    DryRun,
    Launcher,
    Request,
    RunFile,
    Submission,
    SubmitOptions,
    create_run_dir,
    default_run_dir,
    run_files,
)
from launchers.slurm import cluster, jobs
from launchers.slurm.arrays import ArrayChunk, plan_arrays
from launchers.slurm.script import ScriptOptions, dependency, render_script
from launchers.status import CancelResult, RunStatus, task_count
from slime.core.errors import ExitCode
from slime.core.paths import RunPaths
from slime.spec import LoadedSpec

__all__ = ["SlurmLauncher"]


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


class SlurmLauncher(Launcher):
    name = "slurm"

    def dryrun(self, loaded: LoadedSpec, options: SubmitOptions) -> DryRun:
        spec = loaded.spec
        run_dir = default_run_dir(loaded, options)
        python = options.extra.get("python") or ("python3" if spec.cluster.slurm.container else sys.executable)
        script = render_script(
            spec,
            ScriptOptions(
                run_dir=run_dir,
                n_tasks=len(loaded.tasks),
                preflight_only=options.preflight_only,
                python=python,
                driver=options.extra.get("driver"),
            ),
        )
        files = run_files(loaded, run_dir) + [RunFile(RunPaths(Path(".")).script.as_posix(), script, 0o755)]
        notes = []
        if loaded.is_sweep:
            notes.append(
                f"{len(loaded.tasks)} sweep task(s) as a job array; split into several arrays at submit "
                "time if the cluster's MaxArraySize is smaller"
            )
        request = Request(
            launcher=self.name,
            run_dir=run_dir,
            loaded=loaded,
            files=tuple(files),
            command=("sbatch", "--parsable", str(RunPaths(run_dir).script)),
            notes=tuple(notes),
        )
        return DryRun(request=request, options=options)

    def submit(self, dryrun: DryRun) -> Submission:
        from slime.provenance import refuse_duplicate, write_lock

        request, options = dryrun.request, dryrun.options
        cluster.require_sbatch()
        spec, n_tasks = request.spec, request.n_tasks
        partition, nodes = cluster.partition_nodes(spec.cluster.slurm.partition)
        cluster.check_fits(spec, nodes, partition)
        cluster.check_dependencies(spec.cluster.slurm.depends_on)
        chunks = plan_arrays(n_tasks, cluster.max_array_size(), spec.sweep.max_parallel) if spec.sweep else []

        refuse_duplicate(request, options, self.status)  # same spec pending/running: exit 2 unless --force
        paths = create_run_dir(request)
        write_lock(paths, request, options)
        paths.logs.mkdir(parents=True, exist_ok=True)
        for i in range(n_tasks):
            paths.task(i).logs.mkdir(parents=True, exist_ok=True)
        job_ids = self._sbatch(paths, chunks, n_tasks, partition, options, dependency(spec))
        if options.preflight_only:
            return self._wait_preflight(paths, job_ids, n_tasks, options)
        return Submission(run_dir=paths.root, job_ids=tuple(job_ids))

    def _sbatch(
        self,
        paths: RunPaths,
        chunks: list[ArrayChunk],
        n_tasks: int,
        partition: str,
        options: SubmitOptions,
        own: str | None,
    ) -> list[str]:
        """Submit the script (one array per chunk), recording the job ids in ``jobs.json`` whatever happens.
        ``own``: the spec's ``depends_on`` (in the script too; repeated wherever a command-line
        ``--dependency`` is given, which replaces the script's)."""
        arrays, job_ids = [], []
        chained = options.extra.get("dependency")  # a chain step: after the previous step's jobs
        after = ",".join(d for d in (chained, own) if d) or None
        kill = bool(options.extra.get("kill_on_invalid_dep"))
        try:
            self._submit_chunks(paths, chunks, after, chained, kill, job_ids, arrays)
        except BaseException:
            if not job_ids:
                # SLURM queued nothing: a run dir for a job that never existed would show up in
                # status/list as an unknown run. Remove it (the error says why sbatch refused).
                shutil.rmtree(paths.root, ignore_errors=True)
            raise
        finally:
            if paths.root.exists():
                paths.write_jobs(
                    {
                        "launcher": self.name,
                        "job_ids": job_ids,
                        "arrays": arrays,
                        "tasks": n_tasks,
                        "partition": partition,
                        "submitted_at": time.time(),
                        "preflight_only": options.preflight_only,
                        "dependency": after,
                    }
                )
        return job_ids

    @staticmethod
    def _submit_chunks(paths, chunks, after, chained, kill, job_ids: list[str], arrays: list[dict]) -> None:
        """sbatch the script once, or once per array chunk (a chunk may wait for the one before)."""
        if not chunks:
            job_ids.append(
                cluster.sbatch(
                    str(paths.script),
                    cwd=str(paths.root),
                    dependency=after if chained else None,
                    kill_on_invalid_dep=kill,
                )
            )
        for chunk in chunks:
            split = len(chunks) > 1
            previous = f"afterany:{job_ids[-1]}" if chunk.after_previous else None
            jid = cluster.sbatch(
                str(paths.script),
                cwd=str(paths.root),
                array=chunk.spec if split else None,  # else the script's own #SBATCH --array
                dependency=",".join(d for d in (after, previous) if d) or None,
                kill_on_invalid_dep=kill,
                extra_env={"SLIME_TASK_OFFSET": str(chunk.offset)},
            )
            job_ids.append(jid)
            arrays.append({"job_id": jid, "first_task": chunk.offset, "last_task": chunk.last, "array": chunk.spec})

    # ------------------------------------------------------------------ job management
    def status(self, paths: RunPaths) -> RunStatus:
        return jobs.run_status(paths)

    def statuses(self, runs: Sequence[RunPaths]) -> dict[Path, RunStatus]:
        return jobs.run_states(list(runs))  # one squeue call for all

    def cancel(self, paths: RunPaths, task: int | None = None) -> CancelResult:
        return jobs.cancel(paths, task)

    def log_files(self, paths: RunPaths, task: int, node: str | None = None) -> list[Path]:
        return jobs.log_files(paths, task, node)

    def find_run(self, job_id: str, runs: Sequence[RunPaths]) -> tuple[RunPaths, int | None] | None:
        """``123``, ``123_4`` (array index 4) or an array task's own id: the run whose ``jobs.json``
        lists the job, else the job's ``WorkDir`` from SLURM (scontrol, then ``sacct -c``)."""
        job, _, index = job_id.partition("_")
        for paths in runs:
            doc = paths.read_jobs()
            ids = {str(j) for j in doc.get("job_ids", [])} | {str(a.get("job_id")) for a in doc.get("arrays") or []}
            if job in ids:
                layout = jobs.task_layout(doc, task_count(paths)) if index else {}
                return paths, next((t for t, key in layout.items() if key == (job, int(index))), None)
        if shutil.which("scontrol"):
            found = jobs.find_run(job_id)
            if found:
                return RunPaths(found[0].resolve()), found[1]
        return None

    # ------------------------------------------------------------------ --preflight-only
    def _wait_preflight(self, paths: RunPaths, job_ids: list[str], n_tasks: int, options: SubmitOptions) -> Submission:
        con = _console()
        con.print(f"submitted job {', '.join(job_ids)}; waiting for the preflight (run dir: {paths.root})")

        def on_change(jid: str, recs: list[dict[str, str]]) -> None:
            for r in recs:
                reason = r.get("Reason", "")
                con.print(
                    f"  job {r.get('JobId', jid)}: {r.get('JobState', '?')}"
                    + (f" ({reason})" if reason and reason != "None" else "")
                )

        try:
            records = cluster.wait_jobs(
                job_ids, poll=0.5, on_change=on_change, timeout=options.extra.get("wait_timeout_s")
            )
        except KeyboardInterrupt:  # stop waiting, not the job: say it is still queued and how to stop it
            con.print(
                f"stopped waiting; job {', '.join(job_ids)} is still queued or running. Stop it with "
                f"`slime-submit cancel {shlex.quote(str(paths.root))}`, or see it with "
                f"`slime-submit status {shlex.quote(str(paths.root))}`"
            )
            raise
        ok = all(r.get("JobState") == "COMPLETED" for recs in records.values() for r in recs)
        for i in range(n_tasks):
            tp = paths.task(i)
            if tp.preflight_txt.exists():  # stderr: stdout stays free for --json
                sys.stderr.write(tp.preflight_txt.read_text())
            try:
                report = json.loads(tp.preflight_json.read_text())
            except (OSError, ValueError):
                report = None
            if report is None:
                ok = False
                con.print(f"[red]task {i}: no preflight report[/]; see the job log in {paths.logs}")
            elif not report.get("ok"):
                ok = False
                con.print(f"[red]task {i}: preflight failed[/]: {report.get('error', '')}")
        return Submission(run_dir=paths.root, job_ids=tuple(job_ids), returncode=ExitCode.OK if ok else ExitCode.INFRA)
