"""``--set dotted.path=value`` overrides and sweep points: parse a path, set a value, keep marks right.

Values are parsed as YAML (so ``3`` is an int and ``{"train.seed": [1, 2]}`` a
mapping). Setting never drops an override silently: a path that runs through a
list without an index, or an index past the end of a list, is a problem naming
the override. After a value is set, every mark under its path points at the
override (or sweep key), so errors about the value are reported against it.
"""

from __future__ import annotations

import re
from typing import Any

from slime.spec.errors import Origin, Problem
from slime.spec.schema import dotted
from slime.spec.yamlmarks import Marks, Path, parse_scalar

__all__ = ["apply_value", "parse_override", "parse_path", "remark"]

_INDEX = re.compile(r"\[([0-9]+)\]")


def parse_path(text: str) -> Path:
    """'data.eval[0].path' or 'data.eval.0.path' → ('data', 'eval', 0, 'path')."""
    out: list[str | int] = []
    for part in re.split(r"\.|(?=\[)", text):
        if not part:
            continue
        m = _INDEX.fullmatch(part)
        if m:
            out.append(int(m.group(1)))
        elif part.isascii() and part.isdigit():
            out.append(int(part))
        else:
            out.append(part)
    return tuple(out)


def parse_override(text: str) -> tuple[Path, Any] | Problem:
    """('a','b'), value for 'a.b=value'; a Problem (origin: the override) when malformed."""
    key, sep, value = text.partition("=")
    path = parse_path(key.strip()) if sep else ()
    if not path or not isinstance(path[0], str) or any(isinstance(x, str) and ("[" in x or "]" in x) for x in path):
        return Problem(
            path="",
            message=f"bad override {text!r}: expected dotted.field.path=value (list indexes as [0], [1], ...)",
            hint="e.g. --set train.seed=3 or --set 'sweep.grid={\"train.seed\": [1, 2]}'",
            origin=Origin(file="<command line>", override=f"--set {text}"),
        )
    return path, parse_scalar(value)


def _container_for(next_part: str | int) -> Any:
    return [] if isinstance(next_part, int) else {}


def apply_value(data: dict, path: Path, value: Any) -> tuple[list[Path], str | None]:
    """Set ``path`` in ``data`` to ``value``, creating containers on the way.

    Returns (paths of containers created or replaced, error message or None).
    Non-container values on the way are replaced (``--set model.path.x=1`` makes
    ``model.path`` a mapping, which the schema then rejects against the override).
    """
    created: list[Path] = []
    node: Any = data
    for i, part in enumerate(path):
        last = i == len(path) - 1
        here = path[: i + 1]
        if isinstance(node, dict):
            key = part if isinstance(part, str) else str(part)
            if last:
                node[key] = value
                return created, None
            child = node.get(key)
            if not isinstance(child, (dict, list)):
                child = _container_for(path[i + 1])
                node[key] = child
                created.append(here)
            node = child
            continue
        # node is a list
        where = dotted(path[:i])
        if not isinstance(part, int):
            return created, (
                f"'{where}' is a list, so the next part must be an index, e.g. {where}[0].{part}, not '{part}'"
            )
        if part > len(node):
            return created, (
                f"index {part} is out of range: '{where}' has {len(node)} item(s) (use [{len(node)}] to append one)"
            )
        if part == len(node):
            node.append(value if last else _container_for(path[i + 1]))
            created.append(here)
            if last:
                return created, None
        elif last:
            node[part] = value
            return created, None
        elif not isinstance(node[part], (dict, list)):
            node[part] = _container_for(path[i + 1])
            created.append(here)
        node = node[part]
    return created, None


def remark(marks: Marks, path: Path, value: Any, created: list[Path], origin: Origin | None) -> None:
    """Point every mark at or under ``path`` (and each created container) at ``origin``."""
    n = len(path)
    for stale in [k for k in marks if k[:n] == path]:
        del marks[stale]
    if origin is None:
        return
    for p in created:
        marks[p] = origin
    _mark_all(marks, path, value, origin)


def _mark_all(marks: Marks, path: Path, value: Any, origin: Origin) -> None:
    marks[path] = origin
    if isinstance(value, dict):
        for k, v in value.items():
            _mark_all(marks, path + (k if isinstance(k, str) else str(k),), v, origin)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _mark_all(marks, path + (i,), v, origin)
