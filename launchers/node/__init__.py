"""The node side: what runs on each node of a job, started by the batch script or the local launcher.

``python -m launchers.node.bootstrap RUN_DIR --task N`` (one per node) starts this job's Ray
(``rayproc``), meets the other nodes through the run dir (``slime.core.rendezvous``), runs the
gating preflight (``preflight``, ``preflight_checks``, ``preflight_tasks``, ``collective``) and
then the driver (``driverproc``; tests use ``tests.fixtures.tinydriver``). ``context`` says who and
where this node is.

Depends on ``slime.core``, ``slime.spec`` and ``slime.placement`` only: never on the submit side
(``launchers.base``, ``launchers.local``, ``launchers.slurm``) nor on the runtime (import-linter
contracts in pyproject.toml). The node side records what failed (rendezvous node records, the
preflight report) and exits with an ``ExitCode``; what a scheduler does about it (SLURM: requeue
excluding the failed nodes) is decided on the submit side's own node step, after this one exits.
"""
