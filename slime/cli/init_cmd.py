"""``slime-submit init [--template NAME] [-o FILE] [--force]``: a commented starter spec, and the
placeholder check that tells what is still to fill in.

A starter is an example spec from ``specs/`` (:data:`TEMPLATES`) rewritten in ruamel.yaml's
round-trip mode (comments, key order and quoting survive), with ``<FILL: ...>`` placeholders for
what the user must supply. :func:`load_checked` refuses placeholders wherever a spec is read from
the command line, each as a problem at its ``file:line:col``. ``-o FILE`` is never overwritten
without ``--force``. Not guaranteed: ``init`` outside a checkout (exit 2: the examples are not
installed with a wheel).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from slime.core.errors import ExitCode

__all__ = ["EXAMPLES_DIR", "PLACEHOLDER", "TEMPLATES", "configure", "load_checked", "placeholder_problems"]

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "specs"
PLACEHOLDER = "<FILL"
_HOLE = re.compile(r"<FILL:?\s*([^>]*)>")
_JOB_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class Template:
    example: str  # file name in specs/
    about: str
    fill: dict[FieldPath, str] = field(default_factory=dict)  # field -> what the user puts there


TEMPLATES: dict[str, Template] = {
    "quickstart": Template(
        "quickstart.yaml", "local, CPU: a tiny model learns 2-digit addition with GRPO (runs as written)"
    ),
    "grpo-slurm": Template(
        "grpo-multinode.yaml",
        "SLURM, 2 nodes x 8 GPUs: Megatron training and SGLang rollouts, GRPO",
        {
            ("cluster", "slurm", "partition"): "the SLURM partition to run in (`sinfo` lists them)",
            ("model", "path"): "the policy's HF checkpoint dir, on a filesystem every node sees",
            ("data", "prompts"): "training prompts, a JSONL file with the prompt and label keys below",
            ("data", "eval", 0, "path"): "eval prompts, a JSONL file (or delete data.eval)",
            ("logging", "dir"): "where run dirs go, on a filesystem every node sees",
        },
    ),
    "agent": Template(
        "agent-local.yaml", "local, CPU: agentic GRPO with a sandboxed calculator tool (runs as written)"
    ),
}
_DATA_PATHS = (("data", "prompts"), ("data", "eval", "*", "path"))


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--template",
        choices=tuple(TEMPLATES),
        default="quickstart",
        help="which example to start from: "
        + "; ".join(f"{name}: {t.about}" for name, t in TEMPLATES.items())
        + " (default quickstart)",
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write the spec here (default: print it)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    p.set_defaults(func=run)


# ----------------------------------------------------------------------------- init
def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and not args.force:
        err.print(f"[red]usage error:[/] {escape(str(out))} exists; pass --force to overwrite it, or another -o FILE")
        return ExitCode.SPEC
    template = TEMPLATES[args.template]
    example = EXAMPLES_DIR / template.example
    if not example.is_file():
        err.print(
            f"[red]usage error:[/] the example spec {escape(str(example))} is missing: `init` needs a "
            "slime-submit checkout (the example specs are not installed with a wheel)"
        )
        return ExitCode.SPEC
    text, holes = render_starter(args.template, example, out)
    if out is None:
        sys.stdout.write(text)
        return ExitCode.OK
    from slime.core.paths import atomic_write

    try:
        atomic_write(out, text)
    except OSError as exc:
        err.print(f"[red]usage error:[/] cannot write {escape(str(out))}: {escape(exc.strerror or str(exc))}")
        return ExitCode.SPEC
    err.print(f"wrote {escape(str(out))} (template {args.template}, from specs/{template.example})")
    if holes:
        err.print(f"fill in: {escape(', '.join(holes))}; `slime-submit validate {escape(str(out))}` lists what is left")
    else:
        err.print(f"run it: slime-submit {escape(str(out))}")
    return ExitCode.OK


def _dotted(path: FieldPath) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def _get_parent(doc: Any, path: FieldPath) -> Any:
    for part in path[:-1]:
        doc = doc[part]
    return doc


def _data_paths(doc: Any) -> list[FieldPath]:
    data = doc.get("data") or {}
    found: list[FieldPath] = [("data", "prompts")] if "prompts" in data else []
    found += [("data", "eval", i, "path") for i, e in enumerate(data.get("eval") or []) if "path" in e]
    return found


def _header(name: str, template: Template, example_comment: list[str], holes: list[str]) -> str:
    lines = [
        f"# Starter spec from `slime-submit init --template {name}` (example: specs/{template.example}).",
        *[c for c in example_comment if "slime-submit specs/" not in c],
        "#",
    ]
    if holes:
        lines += [
            "# Fill in every <FILL: ...> placeholder:",
            *[f"#   {h}" for h in holes],
            "# `slime-submit validate FILE` lists those left; `slime-submit explain FIELD` documents any field.",
        ]
    else:
        lines += ["# Runs as written: `slime-submit FILE`. `slime-submit explain FIELD` documents any field."]
    return "\n".join(lines) + "\n\n"


def render_starter(name: str, example: Path, out: Path | None) -> tuple[str, list[str]]:
    """(the starter spec's text, the dotted paths of its placeholders)."""
    import io

    from ruamel.yaml import YAML

    from slime.spec.schema import schema_for

    template = TEMPLATES[name]
    lines = example.read_text().splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load("".join(lines[start:]))
    fill = dict(template.fill)
    for path in _data_paths(doc):  # the example's data: absolute if it is there, else a placeholder
        value = _get_parent(doc, path)[path[-1]]
        target = (example.parent / str(value)).resolve()
        if path not in fill and not Path(str(value)).is_absolute():
            if target.is_file():
                _get_parent(doc, path).yaml_add_eol_comment("the example data; put yours here", path[-1])
                _get_parent(doc, path)[path[-1]] = str(target)
            else:
                fill[path] = "a JSONL file of prompts"
    if ("logging", "dir") not in fill and "logging" in doc:
        doc["logging"]["dir"] = "runs"
    for path, what in fill.items():
        _get_parent(doc, path)[path[-1]] = f"<FILL: {what}>"
    if out is not None and _JOB_NAME.match(out.stem.lower()):
        doc["name"] = out.stem.lower()
    props = schema_for("slime/v2")["$defs"]["Spec"]["properties"]
    for key in list(doc)[1:]:  # a comment above each section: the schema's description of it
        desc = (props.get(key) or {}).get("description")
        if desc and isinstance(doc[key], dict):
            doc.yaml_set_comment_before_after_key(key, before=desc)
    buf = io.StringIO()
    yaml.dump(doc, buf)
    holes = [_dotted(p) for p in fill]
    return _header(
        name, template, [ln.rstrip("\n") for ln in lines[:start] if ln.startswith("#")], holes
    ) + buf.getvalue(), holes


# ----------------------------------------------------------------------------- placeholders
def placeholder_problems(text: str, file: str, overrides: tuple[str, ...] | list[str] = ()) -> list:
    """A problem for each ``<FILL: ...>`` value of the spec text, except fields a ``--set`` fills."""
    if PLACEHOLDER not in text:
        return []
    from slime.spec import Problem, SpecError
    from slime.spec.overrides import parse_path
    from slime.spec.yamlmarks import load_yaml

    try:
        data, marks = load_yaml(text, file)
    except SpecError:
        return []  # the loader reports the syntax error
    overridden = {parse_path(o.partition("=")[0].strip()) for o in overrides if "=" in o}
    problems = []
    from slime.spec.refs import string_leaves  # msgspec: not for shell completion

    for path, value in string_leaves(data):
        m = _HOLE.search(value)
        if m and path not in overridden:
            problems.append(
                Problem(
                    path=_dotted(path),
                    message=f"placeholder not filled in: {m.group(1).strip() or 'a value'}",
                    hint=f"replace the <FILL: ...> value (or pass --set {_dotted(path)}=VALUE)",
                    origin=marks.get(path),
                )
            )
    return problems


def unresolved_refs(text: str, file: str, overrides: tuple[str, ...] | list[str] = ()) -> list:
    """A problem for each ``${runs...}`` value no ``--set`` fills: only ``slime-submit chain`` resolves them."""
    if "${runs" not in text:
        return []
    from slime.spec import Problem, SpecError
    from slime.spec.overrides import parse_path
    from slime.spec.refs import find_refs
    from slime.spec.yamlmarks import load_yaml

    try:
        data, marks = load_yaml(text, file)
    except SpecError:
        return []
    overridden = {parse_path(o.partition("=")[0].strip()) for o in overrides if "=" in o}
    found, malformed = find_refs(data)
    problems = [replace(p, origin=marks.get(parse_path(p.path))) for p in malformed]
    for fr in found:
        if fr.path not in overridden:
            problems.append(
                Problem(
                    path=fr.field,
                    message=f"{fr.refs[0].text} refers to an earlier run of a chain",
                    hint=f"submit it after step {fr.refs[0].step!r}: slime-submit chain STEP.yaml {file}",
                    origin=marks.get(fr.path),
                )
            )
    return problems


def load_checked(path: str | Path, *, overrides=(), check_paths=False):
    """``slime.spec.load_spec`` plus the placeholder check (see the module doc)."""
    from slime.spec import SpecError, load_spec

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        text = ""  # load_spec says what is wrong with the file
    holes = placeholder_problems(text, str(path), overrides) + unresolved_refs(text, str(path), overrides)
    try:
        loaded = load_spec(path, overrides=overrides, check_paths=check_paths)
    except SpecError as exc:
        if not holes:
            raise
        filled = {h.path for h in holes}
        raise SpecError(holes + [p for p in exc.problems if p.path not in filled]) from None
    if holes:
        filled = {h.path for h in holes}
        raise SpecError(holes + [p for p in loaded.warnings if p.path not in filled])
    return loaded
