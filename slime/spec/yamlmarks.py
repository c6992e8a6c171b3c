"""YAML loading that keeps where every key and value was written.

ruamel.yaml's round-trip loader records line/column for each mapping key and
sequence item (``.lc``); we walk the result once, turning it into plain Python
data plus a ``{path: Origin}`` table. PyYAML would need a hand-written
compose-tree walk to get the same marks; ruamel gives them directly and also
rejects duplicate keys, which PyYAML silently accepts.
"""

from __future__ import annotations

from typing import Any

from slime.spec.errors import Origin, Problem, SpecError

Path = tuple[str | int, ...]
Marks = dict[Path, Origin]

__all__ = ["Marks", "Path", "load_yaml", "parse_scalar"]


def _yaml(typ: str):
    from ruamel.yaml import YAML

    y = YAML(typ=typ, pure=typ == "safe")
    y.allow_duplicate_keys = False
    return y


# A spec has hundreds of values, a big sweep thousands. YAML aliases share one node, so a few hundred
# bytes of nested ``&a [*b, *b, ...]`` expand to billions of values here ("billion laughs"): stop early.
MAX_VALUES = 100_000


class _TooBig(Exception):
    pass


def _plain(node: Any, path: Path, marks: Marks, file: str, seen: list[int]) -> Any:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    seen[0] += 1
    if seen[0] > MAX_VALUES:
        raise _TooBig
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key, value in node.items():
            try:
                line, col = node.lc.key(key)
            except (KeyError, TypeError, AttributeError):
                line, col = (node.lc.line, node.lc.col)
            k = str(key) if not isinstance(key, str) else key
            marks[path + (k,)] = Origin(file=file, line=line + 1, col=col + 1)
            out[k] = _plain(value, path + (k,), marks, file, seen)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, value in enumerate(node):
            try:
                line, col = node.lc.item(i)
                marks[path + (i,)] = Origin(file=file, line=line + 1, col=col + 1)
            except (KeyError, TypeError, AttributeError, IndexError):
                pass
            items.append(_plain(value, path + (i,), marks, file, seen))
        return items
    # ruamel's Scalar* subclasses of int/float/str/bool: make them plain.
    if isinstance(node, bool):
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def load_yaml(text: str, file: str) -> tuple[Any, Marks]:
    """Parse YAML text; return plain data and the origin of every key/item."""
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        doc = _yaml("rt").load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        origin = Origin(file=file, line=mark.line + 1, col=mark.column + 1) if mark else Origin(file=file)
        msg = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise SpecError(
            [
                Problem(
                    path="",
                    message=f"YAML syntax error: {msg}",
                    origin=origin,
                    hint="fix the YAML at that position (indentation, quotes, duplicate keys)",
                )
            ]
        ) from None
    except YAMLError as exc:
        raise SpecError([Problem(path="", message=f"YAML error: {exc}", origin=Origin(file=file))]) from None
    except RecursionError:
        raise SpecError([_too_deep(file)]) from None
    except TypeError:  # ruamel hashes complex keys ({? {a: 1}: x}) and fails on nested mappings
        raise SpecError(
            [
                Problem(
                    path="",
                    message="YAML error: a mapping key is itself a mapping or list",
                    origin=Origin(file=file),
                    hint="spec keys are plain names",
                )
            ]
        ) from None
    marks: Marks = {(): Origin(file=file, line=1, col=1)}
    try:
        return _plain(doc, (), marks, file, [0]), marks
    except RecursionError:
        raise SpecError([_too_deep(file)]) from None
    except _TooBig:
        raise SpecError(
            [
                Problem(
                    path="",
                    message=f"the YAML expands to more than {MAX_VALUES} values",
                    origin=Origin(file=file),
                    hint="a spec is far smaller; check for aliases (*name) repeated inside lists they are aliases of",
                )
            ]
        ) from None


def _too_deep(file: str) -> Problem:
    return Problem(
        path="",
        message="the YAML is nested too deeply to be a spec",
        origin=Origin(file=file),
        hint="specs are a few levels deep; check for runaway brackets",
    )


def parse_scalar(text: str) -> Any:
    """Parse an override value as YAML (so '3' is an int and '{a: [1]}' a mapping)."""
    from ruamel.yaml.error import YAMLError

    try:
        return _yaml("safe").load(text)
    except (YAMLError, RecursionError):
        return text  # not YAML: keep the text; the schema then says what was expected
