"""Errors shared by every layer (the spec has its own: ``slime.spec.SpecError``)."""


class InfraError(RuntimeError):
    """Infrastructure failed (SLURM, Ray, preflight, a node, a port): exit code 3.

    The message names what failed (node, port, job) and what to do about it.
    """
