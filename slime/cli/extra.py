"""Subcommands beyond the spec ones (job management, smoke, init, completion, patches), registered by name.

Each entry maps a subcommand to ``"module:configure"``; ``configure(parser)``
adds its arguments and ``set_defaults(func=...)``. Modules are imported only
when the CLI builds its parser, and each must stay free of heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable

ENTRIES: dict[str, tuple[str, str]] = {
    "status": ("slime.cli.jobs:configure_status", "state of a run's tasks: SLURM or local state, restarts, last step"),
    "why": ("slime.cli.why_cmd:configure", "why a run failed or hung: cause, where, evidence and the fix, one screen"),
    "logs": ("slime.cli.jobs:configure_logs", "print (or -f follow) a run's job log or one node's log"),
    "cancel": ("slime.cli.jobs:configure_cancel", "cancel a run (every task) or one task with --task"),
    "list": ("slime.cli.jobs:configure_list", "recent runs as a table: name, run dir, job ids, state, last step"),
    "chain": (
        "slime.cli.chain_cmd:configure",
        "submit specs as a chain, each after the previous one succeeded (or ended); ${runs.NAME.OUTPUT} links them",
    ),
    "rerun": ("slime.cli.jobs:configure_rerun", "submit exactly what a run dir's lock.json recorded, as a new run"),
    "smoke": (
        "slime.cli.smoke:configure",
        "run a spec scaled down on CPU for a few rollouts and check every stage (before a GPU job waits in a queue)",
    ),
    "fit": ("slime.cli.fit_cmd:configure", "memory per GPU of each role and RAM per node, with the headroom"),
    "patches": ("slime.cli.patches_cmd:configure", "check/apply our patches to the pinned SGLang and megatron-core"),
    "upgrade": ("slime.cli.upgrade_cmd:configure", "rewrite a spec in the current apiVersion, keeping its comments"),
    "init": ("slime.cli.init_cmd:configure", "write a commented starter spec from an example (-o FILE)"),
    "clusters": (
        "slime.cli.clusters_cmd:configure",
        "cluster profiles: list, show NAME, check NAME against the cluster",
    ),
    "completion": ("slime.cli.complete:configure", "print the shell completion script (bash, zsh, fish)"),
}


def register(table: dict[str, tuple[Callable, str]]) -> None:
    from slime.core.registry import load_object

    for name, (path, help_text) in ENTRIES.items():
        table[name] = (load_object(path), help_text)
