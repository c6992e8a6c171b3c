"""``slime-submit``: the front door. Thin: parse arguments, call the spec/launcher layers, map errors.

Exit codes: 0 ok · 2 spec or usage error · 3 infrastructure error (SLURM, Ray,
preflight, a node) · 1 a bug. Humans get rich output; ``--json`` prints one
JSON document on stdout for scripts. The CLI is the composition root: it is
the one place under ``slime`` that reaches into ``launchers`` (lazily, by name).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from slime.cli import commands
from slime.core.errors import ExitCode

# name -> (module:function implementing it, help)
SUBCOMMANDS: dict[str, tuple[Callable[[argparse.Namespace], int], str]] = {}


def _spec_args(p: argparse.ArgumentParser, *, many: bool = False) -> None:
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
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slime-submit",
        description="Validate, compile and run an RL post-training job spec. "
        "`slime-submit SPEC` submits (SLURM) or runs (local) it.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("submit", help="validate, compile and submit/run a spec (the default command)")
    _spec_args(p)
    p.add_argument("--dry-run", action="store_true", help="print what would be written and run; change nothing")
    p.add_argument("--preflight-only", action="store_true", help="bootstrap Ray + run the preflight, then stop")
    p.add_argument("--force", action="store_true", help="submit even if this spec's job is already pending/running")
    p.set_defaults(func=commands.submit)

    p = sub.add_parser("validate", help="check spec(s): schema and cross-field rules, every problem at once")
    _spec_args(p, many=True)
    p.add_argument("--check-paths", action="store_true", help="also require local data/model paths to exist")
    p.set_defaults(func=commands.validate)

    p = sub.add_parser("render", help="print the script/command the launcher would run (side-effect free)")
    _spec_args(p)
    p.set_defaults(func=commands.render)

    p = sub.add_parser("schema", help="print the JSON Schema (for editors' YAML language servers)")
    p.add_argument("--api-version", default="slime/v1")
    p.set_defaults(func=commands.schema)

    p = sub.add_parser("explain", help="type, default and description of a spec field")
    p.add_argument("field", metavar="FIELD", help="dotted path, e.g. train.parallel.tensor (or a section)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=commands.explain)

    p = sub.add_parser("import-slime-args", help="convert a slime train.py flag list into a v1 spec")
    p.add_argument("file", metavar="FILE", help="file with the flags (a launch script or a flag list; '-' = stdin)")
    p.add_argument("-o", "--output", help="write the spec here instead of stdout")
    p.add_argument("--name", default=None, help="job name for the spec")
    p.add_argument("--json", action="store_true", help="print the mapping report as JSON")
    p.set_defaults(func=commands.import_slime_args)

    for name, (func, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        func(p)  # registers its own arguments and sets func
    return parser


def _known_commands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._subparsers._group_actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    from slime.cli import extra  # registers job-management subcommands, if present

    extra.register(SUBCOMMANDS)
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # `slime-submit SPEC ...` means `slime-submit submit SPEC ...`.
    if args_list and not args_list[0].startswith("-") and args_list[0] not in _known_commands(parser):
        args_list.insert(0, "submit")
    if not args_list:
        parser.print_help(sys.stderr)
        return ExitCode.SPEC
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
        return int(exc.code or 0)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.SPEC
    return commands.run_guarded(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
