"""The arguments every spec-taking command shares: the spec file(s), ``--set`` and ``--json``."""

from __future__ import annotations

import argparse

from slime.cli.complete import spec_field_completer

__all__ = ["add_spec_args"]


def add_spec_args(p: argparse.ArgumentParser, *, many: bool = False, json_help: str = "print JSON for scripts") -> None:
    if many:
        p.add_argument("specs", nargs="+", metavar="SPEC", help="spec file(s)")
    else:
        p.add_argument("spec", metavar="SPEC", help="spec file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field before validation (value parsed as YAML); repeatable",
    ).completer = spec_field_completer("=")  # type: ignore[attr-defined]
    p.add_argument("--json", action="store_true", help=json_help)
