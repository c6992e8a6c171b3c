"""``slime-submit upgrade SPEC [-o OUT]``: rewrite a spec in the current apiVersion, comments kept.

The file is read with ruamel's round-trip loader and upgraded by the same functions the loader
applies in memory (``slime.spec.versions``), so comments, key order and quoting survive; the result
is validated before it is written. Without ``-o`` it goes to stdout; ``-o`` never overwrites the
input unless ``--in-place``.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from slime.core.errors import ExitCode

__all__ = ["configure", "upgrade_text"]


def upgrade_text(text: str) -> tuple[str, str | None]:
    """(the text in the current version, the version it had; None: it was current already)."""
    from ruamel.yaml import YAML

    from slime.spec.versions import upgrade

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)  # the examples' style: list items indented under their key
    data = yaml.load(text)
    if not hasattr(data, "get"):
        return text, None
    was, _ = upgrade(data)
    if was is None:
        return text, None
    buf = io.StringIO()
    yaml.dump(data, buf)
    return buf.getvalue(), was


def _run(args: argparse.Namespace) -> int:
    from slime.cli.commands import print_problems
    from slime.core.paths import atomic_write
    from slime.spec import SpecError, load_spec_text
    from slime.spec.versions import CURRENT

    src = Path(args.spec)
    try:
        text = src.read_text()
    except OSError as exc:
        print(f"slime-submit upgrade: cannot read {src}: {exc.strerror or exc}", file=sys.stderr)
        return ExitCode.SPEC
    new, was = upgrade_text(text)
    if was is None:
        print(f"{src}: already {CURRENT} (or not a spec mapping); nothing to do", file=sys.stderr)
    try:
        load_spec_text(new, file=str(src), base_dir=src.resolve().parent)
    except SpecError as exc:
        print_problems(exc.problems)
        print("the upgraded spec does not validate (above); nothing written", file=sys.stderr)
        return ExitCode.SPEC
    out = src if args.in_place else (Path(args.output) if args.output else None)
    if out is None:
        sys.stdout.write(new)
    elif was is not None:
        atomic_write(out, new)
        print(f"{out}: upgraded {was} -> {CURRENT}", file=sys.stderr)
    return ExitCode.OK


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="the spec file to upgrade")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", help="write the upgraded spec here (default: stdout)")
    where.add_argument("--in-place", action="store_true", help="rewrite SPEC itself")
    p.set_defaults(func=_run)
