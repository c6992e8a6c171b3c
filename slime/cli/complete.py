"""Shell completion for bash, zsh and fish: subcommands, flags, run ids, and spec field paths.

Why argcomplete (not shtab): fish is required, and completions depend on what is on disk; shtab
writes static scripts (no fish), argcomplete calls ``slime-submit`` itself, so the completers are
plain Python shared by every shell. Completes subcommands and flags, ``--set``/``explain`` field
paths (from the committed JSON Schema) and run ids under ``--dir``. Standard library only, since
every TAB starts Python. Not guaranteed: completions of a schema other than ``slime/v2``, or of
fields an ``anyOf`` adds beyond its object branches.
"""

from __future__ import annotations

import json
import os
import sys
from functools import cache
from pathlib import Path
from typing import Any

from slime.cli.runids import RUN_NAME, short_id

__all__ = [
    "SHELLS",
    "autocomplete",
    "configure",
    "field_completions",
    "run_completer",
    "run_completions",
    "shell_script",
    "spec_field_completer",
]

SHELLS = ("bash", "zsh", "fish")
SCHEMA = Path(__file__).resolve().parents[1] / "spec" / "schema" / "v1.json"


# ----------------------------------------------------------------------------- spec fields
@cache
def _schema() -> dict[str, Any]:
    try:
        return json.loads(SCHEMA.read_text())
    except (OSError, ValueError):
        return {}


def _deref(node: dict[str, Any]) -> dict[str, Any]:
    while isinstance(node, dict) and "$ref" in node:
        node = _schema().get("$defs", {}).get(node["$ref"].rsplit("/", 1)[-1], {})
    return node


def _children(node: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The named sub-fields of a section (``{"0": item}`` for a list of sections), None for a leaf."""
    node = _deref(node)
    for branch in [node] + [_deref(b) for b in node.get("anyOf", [])]:
        if "properties" in branch:
            return branch["properties"]
        items = _deref(branch.get("items") or {})
        if branch.get("type") == "array" and _children(items):
            return {"0": items}
    return None


def _root() -> dict[str, Any]:
    return _schema().get("$defs", {}).get("Spec", {})


def field_completions(prefix: str, leaf_suffix: str = "") -> list[str]:
    """Full dotted paths completing ``prefix``: sections end in ``.``, leaves in ``leaf_suffix``."""
    node: dict[str, Any] | None = _root()
    *head, last = prefix.split(".")
    for part in head:
        kids = _children(node) if node else None
        node = kids.get(part) if kids else None
        if node is None:
            return []
    base = "".join(p + "." for p in head)
    kids = _children(node) or {}
    matches = {name: sub for name, sub in kids.items() if name.startswith(last)}
    if len(matches) == 1:  # a lone section: list its fields straight away
        ((name, sub),) = matches.items()
        if _children(sub):
            return field_completions(f"{base}{name}.", leaf_suffix)
    return sorted(f"{base}{name}." if _children(sub) else f"{base}{name}{leaf_suffix}" for name, sub in matches.items())


def spec_field_completer(leaf_suffix: str = ""):
    """An argcomplete completer of spec field paths (``--set``: ``leaf_suffix="="``)."""

    def complete(prefix: str, **_: Any) -> list[str]:
        return field_completions(prefix, leaf_suffix)

    return complete


# ----------------------------------------------------------------------------- runs
def _runs_dir(parsed_args: Any) -> Path:
    d = getattr(parsed_args, "dir", None)
    return Path(d) if d else Path(os.environ.get("SLIME_RUNS_DIR") or "runs")


def run_completions(prefix: str, parent: Path) -> dict[str, str]:
    """``{completion: description}`` of the runs under ``parent`` (see the module doc)."""
    if prefix.startswith((".", "/", "~")):
        return {}  # a path: the shell's own file completion takes over
    try:
        names = [d.name for d in parent.iterdir() if (d / "jobs.json").is_file() or (d / "lock.json").is_file()]
    except OSError:
        return {}
    names.sort(key=lambda n: (n.rsplit("-", 3)[1:3], n) if RUN_NAME.match(n) else ([], n), reverse=True)  # newest first
    ids = {}
    for name in names:
        m = RUN_NAME.match(name)
        what = f"{m.group('name')}, started {_stamp(name)}" if m else name
        ids[short_id(name)] = what
    out = {k: v for k, v in ids.items() if k.startswith(prefix)}
    return out or {n: "run dir" for n in names if n.startswith(prefix)}


def _stamp(name: str) -> str:
    date, clock = name.rsplit("-", 3)[1:3]
    return f"{date[:4]}-{date[4:6]}-{date[6:]} {clock[:2]}:{clock[2:4]}"


def run_completer(prefix: str, parsed_args: Any = None, **_: Any) -> dict[str, str]:
    return run_completions(prefix, _runs_dir(parsed_args))


# ----------------------------------------------------------------------------- shell scripts
def configure(p: Any) -> None:
    p.add_argument("shell", choices=SHELLS, help="the shell to print the completion script for")
    p.set_defaults(func=completion)


def completion(args: Any) -> int:
    sys.stdout.write(shell_script(args.shell))
    return 0


def shell_script(shell: str, prog: str = "slime-submit") -> str:
    """The completion script for ``shell`` (argcomplete's, registered for ``prog``)."""
    import argcomplete

    return argcomplete.shellcode([prog], shell=shell)


def autocomplete(parser: Any, commands: set[str]) -> None:
    """Answer the completion request in the environment (argcomplete exits), if there is one.
    ``slime-submit SPEC --set ...`` means ``submit SPEC``, as on a real command line: the line
    argcomplete sees gets the ``submit`` inserted once SPEC is typed."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    line, point = os.environ.get("COMP_LINE", ""), int(os.environ.get("COMP_POINT") or 0)
    words = line[:point].split()
    if len(words) >= 2 and (len(words) > 2 or line[:point].endswith((" ", "\t"))):
        first = words[1]
        if not first.startswith("-") and first not in commands:
            at = line.index(first, len(words[0]))
            os.environ["COMP_LINE"] = f"{line[:at]}submit {line[at:]}"
            os.environ["COMP_POINT"] = str(point + len("submit "))
    argcomplete.autocomplete(parser, always_complete_options=False)
