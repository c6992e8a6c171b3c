"""The node side: what runs on each node of a job, started by the batch script or the local launcher.

``python -m launchers.node.bootstrap RUN_DIR --task N`` (one per node) starts the job's Ray
(``rayproc``), meets the other nodes through the run dir, runs the gating preflight and then the
driver (``driverproc``). Depends on ``slime.core``, ``slime.spec`` and ``slime.placement`` only,
never on the submit side or the runtime (import-linter contracts). It records what failed and exits
with an ``ExitCode``; what a scheduler does about it is decided on the submit side.
"""
