"""Subcommands beyond the spec ones (job management, patches), registered by name.

Each entry maps a subcommand to ``"module:configure"``; ``configure(parser)``
adds its arguments and ``set_defaults(func=...)``. Modules are imported only
when the CLI builds its parser, and each must stay free of heavy imports.
"""

from __future__ import annotations

from collections.abc import Callable

ENTRIES: dict[str, tuple[str, str]] = {
}


def register(table: dict[str, tuple[Callable, str]]) -> None:
    from slime.registry import load_object

    for name, (path, help_text) in ENTRIES.items():
        table[name] = (load_object(path), help_text)
