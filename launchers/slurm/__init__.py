"""The SLURM launcher. SLURM words live only in this package.

``launcher`` (compile, submit, job management), ``script`` (the batch script), ``arrays`` (sweeps
as job arrays), ``cluster`` (sbatch/scontrol/sacct), ``jobs`` (per-task state, cancel, logs, job
id → run dir) and ``restarts`` (the batch script's own steps before and after the node step:
restart records, budgets, requeues).
"""
