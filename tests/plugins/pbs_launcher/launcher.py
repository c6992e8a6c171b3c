"""The test PBS launcher: ``dryrun`` renders a qsub script; nothing is ever submitted."""

from __future__ import annotations

import shlex

from launchers.base import DryRun, Launcher, Request, RunFile, default_run_dir, run_files


class PbsLauncher(Launcher):
    name = "pbs"

    def dryrun(self, loaded, options):
        spec = loaded.spec
        run_dir = default_run_dir(loaded, options)
        script = "\n".join(
            [
                "#!/bin/bash",
                f"#PBS -N {shlex.quote(spec.name)}",
                f"#PBS -q {shlex.quote(spec.cluster.pbs.queue)}",
                f"#PBS -l select={spec.cluster.nodes}:ngpus={spec.cluster.gpus_per_node}",
                f"#PBS -l walltime={shlex.quote(spec.cluster.pbs.walltime)}",
                f"python -m launchers.node.bootstrap {shlex.quote(str(run_dir))} --task 0",
                "",
            ]
        )
        files = (*run_files(loaded, run_dir), RunFile("job.pbs", script, 0o755))
        request = Request(launcher="pbs", run_dir=run_dir, loaded=loaded, files=files, command=("qsub", "job.pbs"))
        return DryRun(request=request, options=options)

    def submit(self, dryrun):
        raise NotImplementedError("the test PBS launcher never submits")

    def status(self, paths):
        raise NotImplementedError

    def cancel(self, paths, task=None):
        raise NotImplementedError

    def log_files(self, paths, task, node=None):
        return []
