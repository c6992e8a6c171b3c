"""Launchers: one object per launcher (``launchers.base.Launcher``) compiles a spec, submits it and
manages its runs (status, cancel, logs, job id → run dir).

Submit side: ``base``, ``status``, ``quoting``, ``local``, ``slurm`` (SLURM words live only there).
Node side: ``node`` (bootstrap, Ray, preflight, driver), started as ``python -m
launchers.node.bootstrap`` by the batch script or the local launcher. The two sides never import
each other; this package imports ``slime.core``/``slime.spec``/``slime.placement``/``slime.provenance``,
never the training code, and nothing under ``slime`` but the CLI imports it (import-linter
contracts in pyproject.toml).
"""

from slime.core.registry import Registry
from slime.spec.plugin import profiles

# Implementations by name, from the installed launcher plug-ins (entry points ``slime_submit.launchers``).
LAUNCHERS = Registry("launcher", {n: p.implementation for n, p in profiles("launcher").items()})


def get_launcher(name: str):
    """An instance of the launcher registered as ``name`` (``UnknownPlugin`` names the known ones)."""
    return LAUNCHERS.get(name)()
