"""Build-time reference pages: the spec reference from the JSON Schema, the CLI reference from argparse.

Why a hook: mkdocs runs ``hooks:`` files itself (mkdocs >= 1.4), so no third-party plugin has to be kept current.

``reference/spec.md`` is rendered from ``slime.spec.schema.generate_schema()``, the schema msgspec derives
from ``slime/spec/types.py``: the types, the schema, ``slime-submit explain`` and this page are one source.
The walk is generic (``$ref``, ``anyOf``/``oneOf``, lists and maps of objects), so a reshaped spec needs no
change here. ``reference/cli.md`` is every subcommand's ``--help``, from the parser ``slime-submit`` builds.
``reference/slime-flags.md`` is the importer's class of each slime flag (``slime.migrate.flag_table``).
"""

from __future__ import annotations

import html
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # document this checkout, not whatever copy of slime is installed
    sys.path.insert(0, str(ROOT))

SPEC_PAGE = "reference/spec.md"
CLI_PAGE = "reference/cli.md"
SLIME_FLAGS_PAGE = "reference/slime-flags.md"


def on_files(files, config):
    from mkdocs.structure.files import File

    from slime.migrate.flag_table import reference_markdown

    pages = ((SPEC_PAGE, spec_reference()), (CLI_PAGE, cli_reference()), (SLIME_FLAGS_PAGE, reference_markdown()))
    for path, text in pages:
        files.append(File.generated(config, path, content=text))
    return files


# ----------------------------------------------------------------------------------------------- spec
Schema = dict[str, Any]


def _deref(node: Schema, root: Schema) -> Schema:
    seen = set()
    while isinstance(node, dict) and "$ref" in node and node["$ref"] not in seen:
        ref = node["$ref"]
        seen.add(ref)
        target: Any = root
        for part in ref.removeprefix("#/").split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: Schema, root: Schema) -> list[Schema]:
    """The alternatives of a union (``anyOf``/``oneOf``), dereferenced; the node itself otherwise."""
    node = _deref(node, root)
    alts = node.get("anyOf") or node.get("oneOf")
    if not alts:
        return [node]
    out = []
    for alt in alts:
        out.extend(_branches(alt, root))
    return out


def _is_section(node: Schema) -> bool:
    return node.get("type") == "object" and "properties" in node


def _bounds(node: Schema) -> str:
    marks = {
        "minimum": "≥ {}",
        "exclusiveMinimum": "> {}",
        "maximum": "≤ {}",
        "exclusiveMaximum": "< {}",
        "minLength": "length ≥ {}",
        "maxLength": "length ≤ {}",
        "minItems": "≥ {} items",
        "maxItems": "≤ {} items",
    }
    parts = [fmt.format(node[k]) for k, fmt in marks.items() if k in node]
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    return f" ({', '.join(parts)})" if parts else ""


def _type_text(node: Schema, root: Schema) -> str:
    alts = _branches(node, root)
    if len(alts) > 1:
        texts = [_type_text(a, root) for a in alts if a.get("type") != "null"]
        text = " or ".join(dict.fromkeys(texts)) or "null"
        return text + (" or null" if any(a.get("type") == "null" for a in alts) else "")
    node = alts[0]
    if "const" in node:
        return f"`{json.dumps(node['const'])}`"
    if "enum" in node and len(node["enum"]) == 1:
        return f"`{json.dumps(node['enum'][0])}`"
    if "enum" in node:
        return "one of " + ", ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        if "prefixItems" in node:
            return "[" + ", ".join(_type_text(s, root) for s in node["prefixItems"]) + "]"
        items = node.get("items")
        return f"list of {_type_text(items, root) if isinstance(items, dict) else 'any'}" + _bounds(node)
    if kind == "object":
        if "properties" in node:
            return f"section ({node['title']})" if "title" in node else "section"
        extra = node.get("additionalProperties")
        return f"map of string to {_type_text(extra, root) if isinstance(extra, dict) and extra else 'any'}"
    return (kind or "any") + _bounds(node)


def _cell(text: str) -> str:
    """One table cell: on one line; outside code spans ``|`` and HTML escaped (``eval/<name>`` is text)."""
    parts = " ".join(str(text).split()).split("`")
    return "`".join(p if i % 2 else html.escape(p, quote=False).replace("|", "\\|") for i, p in enumerate(parts))


def _default(node: Schema) -> str:
    if "default" not in node:
        return "*required*" if node.get("_required") else ""
    return f"`{json.dumps(node['default'])}`"


def _rows(prefix: str, node: Schema, root: Schema, seen: tuple[str, ...]) -> list[tuple[str, Schema]]:
    """(path, schema) of every field under ``node`` (itself included), depth first, in declaration order."""
    rows = [(prefix, node)]
    sections = [b for b in _branches(node, root) if _is_section(b)]
    for branch in sections:
        name = branch.get("title", "")
        if name in seen:  # a recursive type: list it once
            continue
        required = set(branch.get("required", ()))
        for key, sub in branch["properties"].items():
            sub = {**sub, "_required": key in required}
            if len(sections) > 1:  # a union of sections: say which alternative a field belongs to
                sub["_variant"] = name
            rows.extend(_rows(f"{prefix}.{key}" if prefix else key, sub, root, (*seen, name)))
    for branch in _branches(node, root):  # lists and maps of sections
        if branch.get("type") == "array" and isinstance(branch.get("items"), dict):
            rows.extend(r for r in _rows(f"{prefix}[]", branch["items"], root, seen)[1:])
        extra = branch.get("additionalProperties")
        if branch.get("type") == "object" and isinstance(extra, dict) and extra:
            rows.extend(r for r in _rows(f"{prefix}.<name>", extra, root, seen)[1:])
    return rows


def _description(node: Schema, root: Schema) -> str:
    alts = [b for b in _branches(node, root) if b.get("type") != "null"]
    text = node.get("description") or (alts[0].get("description", "") if len(alts) == 1 else "")
    if node.get("_variant"):
        text = f"({node['_variant']}) {text}"
    return _cell(text)


def spec_reference() -> str:
    from slime.spec.schema import generate_schema

    root = generate_schema()
    top = _deref(root, root)
    lines = [
        "# Spec reference",
        "",
        f"Every field of **{root.get('title', 'the spec')}**, generated at build time from the JSON Schema",
        "that `slime-submit schema` prints (itself generated from the typed spec). `slime-submit explain FIELD`",
        "shows the same type, default and description in a terminal.",
        "",
        "A value the description calls *derived* is filled in from the rest of the spec when it is left unset",
        "(`null`); `slime-submit render SPEC` shows the resolved values. `[]` marks the items of a list,",
        "`<name>` the entries of a map.",
        "",
    ]
    scalars, sections = [], []
    for key, sub in top.get("properties", {}).items():
        sub = {**sub, "_required": key in set(top.get("required", ()))}
        has_fields = any(_is_section(b) for b in _branches(sub, root))
        (sections if has_fields else scalars).append((key, sub))

    def table(rows: list[tuple[str, Schema]]) -> list[str]:
        out = ["| field | type | default | description |", "|---|---|---|---|"]
        for path, node in rows:
            kind, default = _cell(_type_text(node, root)), _cell(_default(node))
            out.append(f"| `{path}` | {kind} | {default} | {_description(node, root)} |")
        return [*out, ""]

    if scalars:
        lines += ["## Top level", "", *table(scalars)]
    for key, sub in sections:
        rows = _rows(key, sub, root, ())
        lines += [f"## `{key}`", "", _description(rows[0][1], root), "", *table(rows[1:])]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ CLI
def _parser():
    from slime.cli import main as cli

    try:  # the subcommands main() registers before it builds the parser (job commands, smoke, init, ...)
        from slime.cli import extra

        extra.register(cli.SUBCOMMANDS)
    except (ImportError, AttributeError):
        pass
    return cli.build_parser()


def _subcommands(parser) -> list[tuple[str, str, Any]]:
    import argparse

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def cli_reference() -> str:
    # argparse wraps help to the terminal's width (and newer Pythons colour it): fix both for the page.
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR")}
    os.environ.update(COLUMNS="100", NO_COLOR="1")
    try:
        parser = _parser()
        lines = [
            "# CLI reference",
            "",
            "Every `slime-submit` subcommand's `--help`, generated at build time from the CLI's argument parser.",
            "`slime-submit SPEC ...` is short for `slime-submit submit SPEC ...`. Exit codes: `0` ok, `2` spec or",
            "usage error, `3` infrastructure (SLURM, Ray, preflight), `1` a bug.",
            "",
            "```text",
            parser.format_help().rstrip(),
            "```",
            "",
        ]

        def walk(p, depth: int) -> None:
            for _name, help_text, sub in _subcommands(p):
                lines.extend([f"{'#' * depth} `{sub.prog}`", ""])
                if help_text:
                    lines.extend([html.escape(help_text[0].upper() + help_text[1:], quote=False) + ".", ""])
                lines.extend(["```text", sub.format_help().rstrip(), "```", ""])
                walk(sub, min(depth + 1, 4))

        walk(parser, 2)
        return "\n".join(lines)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
