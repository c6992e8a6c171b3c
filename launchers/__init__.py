"""Launchers: compile a resolved spec into a request (pure), render it, submit it.

SLURM words live only in ``launchers.slurm``. This package may import
``slime.spec``/``slime.core.paths``/``slime.spec.layout``; nothing under ``slime`` imports it.
"""

from slime.core.registry import Registry

LAUNCHERS = Registry(
    "launcher",
    {
        "local": "launchers.local:LocalLauncher",
        "slurm": "launchers.slurm:SlurmLauncher",
    },
)


def get_launcher(name: str):
    """An instance of the launcher registered as ``name``."""
    return LAUNCHERS.get(name)()
