"""Errors shared by every layer, and the one table of exit codes (the spec has ``slime.spec.SpecError``).

Every process we start (``slime-submit``, the bootstrap, the driver, the restart helper) exits
with a code from :class:`ExitCode`, so a batch script, SLURM's job record and ``status`` all read
the same numbers: 0 ok · 1 a bug · 2 spec, data or usage error · 3 infrastructure · 75 stopped
after a checkpoint, requeue me · 124 stalled (the watchdog, or a collective that timed out) · 130
interrupted (Ctrl-C). A process killed by signal N shows as
128 + N, as a shell reports it.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["CheckpointError", "ExitCode", "InfraError"]


class ExitCode(IntEnum):
    """Exit codes of every slime-submit process (see the module docstring)."""

    OK = 0
    BUG = 1  # an internal error: the message says so and prints the traceback
    SPEC = 2  # the spec, its data, a plug-in or the command line is wrong: fix the input
    INFRA = 3  # SLURM, Ray, a node, the preflight or a port failed: the message names it
    REQUEUE = 75  # BSD's EX_TEMPFAIL: stopped on request after saving a checkpoint; resume later
    STALL = 124  # as GNU timeout's: a phase made no progress within cluster.stall_timeout_s (stacks dumped)
    INTERRUPTED = 130  # 128 + SIGINT


class InfraError(RuntimeError):
    """Infrastructure failed (SLURM, Ray, preflight, a node, a port): exit code 3.

    The message names what failed (node, port, job) and what to do about it.
    """


class CheckpointError(ValueError):
    """A checkpoint cannot be used (missing, incomplete, from another layout): bad input, exit code 2."""
