# PYTHON_ARGCOMPLETE_OK  (argcomplete's global completion looks for this marker)
"""``slime-submit``: the front door. Thin: parse arguments, call the spec/launcher layers, map errors.

Exit codes: 0 ok · 2 spec or usage error · 3 infrastructure error · 1 a bug. ``--json`` prints one
JSON document on stdout. The CLI is the composition root: the one place under ``slime`` that reaches
into ``launchers`` (lazily, by name). Building the parser imports only the standard library,
``slime.core`` and small ``slime.cli`` modules; each command's module loads when it runs
(:func:`_command`), because shell completion builds the parser on every TAB.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from slime.cli.complete import run_completer, spec_field_completer
from slime.cli.spec_args import add_spec_args
from slime.core.errors import ExitCode

# name -> (module:function implementing it, help)
SUBCOMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]] = {}


def _command(ref: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand function named ``"module:function"``, imported when it runs."""

    def run(args: argparse.Namespace) -> int:
        from slime.core.registry import load_object

        return load_object(ref)(args)

    run.__qualname__ = ref
    return run


def _version_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version", dest="show_version", action="store_true", help="print slime-submit's version and exit"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest="version_verbose",
        action="store_true",
        help="with --version: also the Python and engine versions a run's lock.json records",
    )


def _import_slime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="file with the flags (a launch script or a flag list; '-' = stdin)")
    p.add_argument("-o", "--output", help="write the spec here instead of stdout")
    p.add_argument("--name", default=None, help="job name for the spec")
    p.add_argument("--json", action="store_true", help="print the mapping report as JSON")
    p.add_argument(
        "--drop-unmapped",
        action="store_true",
        help="write the spec even if flags that change what is trained cannot be mapped (they are listed)",
    )
    p.add_argument("--model", default=None, help="checkpoint dir to use instead of the script's --hf-checkpoint")
    p.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="FILE",
        help="a file the script sources (e.g. scripts/models/qwen3-4B.sh): its arrays, such as MODEL_ARGS, are read",
    )
    p.set_defaults(func=_command("slime.cli.commands:import_slime_args"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slime-submit",
        description="Validate, compile and run an RL post-training job spec. "
        "`slime-submit SPEC` submits (SLURM) or runs (local) it.",
    )
    _version_args(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("submit", help="validate, compile and submit/run a spec (the default command)")
    add_spec_args(p)
    p.add_argument("--dry-run", action="store_true", help="print what would be written and run; change nothing")
    p.add_argument("--preflight-only", action="store_true", help="bootstrap Ray + run the preflight, then stop")
    p.add_argument("--force", action="store_true", help="submit even if this spec's job is already pending/running")
    p.add_argument("--no-fit-check", action="store_true", help="skip the memory fit check (recorded in lock.json)")
    p.set_defaults(func=_command("slime.cli.commands:submit"))

    p = sub.add_parser("validate", help="check spec(s): schema and cross-field rules, every problem at once")
    add_spec_args(p, many=True)
    p.add_argument("--check-paths", action="store_true", help="also require local data/model paths to exist")
    p.add_argument("--no-fit-check", action="store_true", help="skip the memory fit check (slime-submit fit)")
    p.set_defaults(func=_command("slime.cli.commands:validate"))

    p = sub.add_parser("render", help="print the script/command the launcher would run (side-effect free)")
    add_spec_args(p)
    p.set_defaults(func=_command("slime.cli.commands:render"))

    p = sub.add_parser("schema", help="print the JSON Schema (for editors' YAML language servers)")
    p.add_argument("--api-version", default="slime/v2")
    p.set_defaults(func=_command("slime.cli.commands:schema"))

    p = sub.add_parser("explain", help="type, default and description of a spec field")
    p.add_argument(
        "field", metavar="FIELD", help="dotted path, e.g. train.parallel.tensor (or a section)"
    ).completer = spec_field_completer()  # type: ignore[attr-defined]
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_command("slime.cli.commands:explain"))

    _import_slime_args(sub.add_parser("import-slime-args", help="convert a slime train.py flag list into a spec"))

    for name, (configure, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        configure(p)  # registers its own arguments and sets func
        for action in p._actions:  # run targets complete to the short ids of the runs under --dir
            if action.dest == "target":
                action.completer = run_completer  # type: ignore[attr-defined]
    return parser


def _known_commands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._subparsers._group_actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def main(argv: Sequence[str] | None = None) -> int:
    from slime.cli import complete, extra, report  # extra: job management, init, completion, patches

    extra.register(SUBCOMMANDS)
    report.register(SUBCOMMANDS)  # report, rollouts
    parser = build_parser()
    complete.autocomplete(parser, _known_commands(parser))  # a shell's completion request: answered, then exits
    args_list = list(sys.argv[1:] if argv is None else argv)
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
    if args.show_version or args.version_verbose:
        from slime.cli.version import print_version

        return print_version(args)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return ExitCode.SPEC
    if getattr(args, "no_fit_check", False):
        import os

        os.environ["SLIME_NO_FIT_CHECK"] = "1"  # slime.fit.check.DISABLE_ENV; the lock records it
    from slime.cli.commands import run_guarded

    return run_guarded(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
