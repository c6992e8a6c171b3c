"""Cross-field rules for a spec that also has schema problems: every problem in one pass, none invented.

Fields with a schema problem are cut out (their defaults stand in), the rest is converted, and
each rule runs while a read-through proxy records the fields it reads; its findings are kept only
if it read nothing that was cut out, directly or through ``resolve.DERIVED_FROM``.
Not guaranteed: when the cut-down spec cannot be converted at all (a required field missing or
wrong, a malformed list item) no rule runs; the schema problems are reported alone.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path as FsPath
from typing import Any, Literal

from slime.spec.errors import Problem
from slime.spec.overrides import parse_path
from slime.spec.schema import origin_of
from slime.spec.yamlmarks import Marks, Path

__all__ = ["independent_rule_problems"]


def _overlaps(a: Path, b: Path) -> bool:
    n = min(len(a), len(b))
    return a[:n] == b[:n]


@functools.cache
def _encode_names(cls: type) -> dict[str, str]:
    import msgspec

    return {f.name: f.encode_name for f in msgspec.structs.fields(cls)}


class _Tracked:
    """A read-through view of a Struct that records the path of every leaf value read."""

    __slots__ = ("_obj", "_path", "_reads")

    def __init__(self, obj: Any, path: Path, reads: set[Path]) -> None:
        self._obj, self._path, self._reads = obj, path, reads

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        return _track(value, self._path + (_encode_names(type(self._obj)).get(name, name),), self._reads)


def _track(value: Any, path: Path, reads: set[Path]) -> Any:
    import msgspec

    if isinstance(value, msgspec.Struct):
        return _Tracked(value, path, reads)
    if isinstance(value, tuple) and value and all(isinstance(v, msgspec.Struct) for v in value):
        return tuple(_Tracked(v, path + (i,), reads) for i, v in enumerate(value))
    reads.add(path)
    return value


def _cut(data: dict, paths: set[Path]) -> dict | None:
    """A copy of ``data`` without the fields at ``paths``; None if one is a list item (indexes would shift)."""
    out = copy.deepcopy(data)
    for path in paths:
        node: Any = out
        for part in path[:-1]:
            in_dict = isinstance(node, dict) and part in node
            if in_dict or isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                node = None
                break
        if isinstance(node, dict):
            node.pop(path[-1], None)
        elif isinstance(node, list):
            return None
    return out


def _tainted(cut: set[Path]) -> set[Path]:
    """The cut paths plus every derived value computed from one of them (transitively)."""
    from slime.spec.resolve import DERIVED_FROM

    derived = {parse_path(k): [parse_path(v) for v in vs] for k, vs in DERIVED_FROM.items()}
    out = set(cut)
    changed = True
    while changed:
        changed = False
        for target, inputs in derived.items():
            if target not in out and any(_overlaps(i, t) for i in inputs for t in out):
                out.add(target)
                changed = True
    return out


def independent_rule_problems(
    data: dict,
    marks: Marks,
    schema_problems: list[Problem],
    base_dir: FsPath,
    *,
    check_paths: bool | Literal["warn"] = False,
) -> list[Problem]:
    """Rule problems of ``data`` that no field with a schema problem can have caused (see the module doc)."""
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.rules import RAW_RULES, RAW_WARNINGS, all_rules
    from slime.spec.types import Spec

    cut = {parse_path(p.path) for p in schema_problems}
    if not cut or () in cut:
        return []
    trimmed = _cut(data, cut)
    if trimmed is None:
        return []
    try:
        raw = msgspec.convert(trimmed, Spec)
        resolved = resolve(raw, base_dir)
    except (msgspec.ValidationError, ValueError, TypeError):
        return []
    tainted = _tainted(cut)
    runs = (
        [("error", fn, raw) for fn in RAW_RULES]
        + [("warning", fn, raw) for fn in RAW_WARNINGS]
        + [(sev, fn, resolved) for sev, fn in all_rules(check_paths=check_paths)]
    )
    problems: list[Problem] = []
    for severity, fn, spec in runs:
        reads: set[Path] = set()
        # A finding depends on what the rule read before yielding it (including reads that
        # decided not to yield something earlier), so check the reads at each yield.
        for path, message, hint in fn(_Tracked(spec, (), reads)):
            if any(_overlaps(r, t) for r in reads for t in tainted):
                break
            problems.append(
                Problem(
                    path=path, message=message, hint=hint, severity=severity, origin=origin_of(parse_path(path), marks)
                )
            )
    return problems
