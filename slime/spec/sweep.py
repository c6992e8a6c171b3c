"""Sweep grids: check every key and value once, then expand the cross product into points.

A grid key must be the dotted path of a real, sweepable spec field (did you
mean ... otherwise), must have at least one value, and must not overlap another
key; each value is validated against that field's schema once (not once per
task), so a 1,000-task grid costs one check per distinct value. The typed,
per-task rules run later, in ``slime.spec.load``.
"""

from __future__ import annotations

import itertools
from typing import Any

from slime.spec.errors import Problem
from slime.spec.overrides import parse_path
from slime.spec.schema import dotted, field_names, origin_of, schema_for, subschema, suggest_path, value_problems
from slime.spec.yamlmarks import Marks, Path

__all__ = ["SWEEPABLE", "UNSWEEPABLE", "expand"]

# Array tasks share one allocation and run dir, so nothing that shapes those may vary per task.
UNSWEEPABLE = ("apiVersion", "kind", "name", "description", "cluster", "sweep", "logging")
SWEEPABLE = ("model", "train", "rollout", "data", "reward", "algorithm", "agent")


def _key_problem(api_version: str, key: str, path: Path, marks: Marks) -> Problem | None:
    origin = origin_of(("sweep", "grid", key), marks)
    where = f"sweep.grid.{key}"
    if not path or not isinstance(path[0], str):
        return Problem(
            path=where,
            message=f"'{key}' is not a spec field path",
            hint="keys are dotted field paths, e.g. train.seed or rollout.temperature",
            origin=origin,
        )
    if path[0] in UNSWEEPABLE:
        return Problem(
            path=where,
            message=f"'{key}' cannot be swept",
            hint=f"array tasks share one allocation and run dir; sweepable sections: {', '.join(SWEEPABLE)}",
            origin=origin,
        )
    if subschema(api_version, path) is not None:
        return None
    # The longest prefix that exists tells the user where the typo is.
    n = len(path)
    while n > 1 and subschema(api_version, path[: n - 1]) is None:
        n -= 1
    parent, wrong = path[: n - 1], path[n - 1]
    names = field_names(api_version, parent) if parent else list(schema_for(api_version)["$defs"]["Spec"]["properties"])
    close = suggest_path(str(wrong), parent, names)
    hint = (f"did you mean '{dotted(close + path[n:])}'? " if close else "") + (
        f"fields of {dotted(parent)}: {', '.join(names)}" if parent and names else f"sections: {', '.join(SWEEPABLE)}"
    )
    return Problem(path=where, message=f"'{key}' is not a spec field path", hint=hint, origin=origin)


def expand(api_version: str, sweep: dict[str, Any], marks: Marks) -> tuple[list[dict[str, Any]], list[Problem]]:
    """The grid's points (one dict key -> value per task) or, if anything is wrong, every problem."""
    grid = sweep.get("grid") or {}
    problems: list[Problem] = []
    if not grid:
        problems.append(
            Problem(
                path="sweep.grid",
                message="the sweep grid is empty",
                hint="add 'dotted.field.path: [values]' entries, or remove sweep",
                origin=origin_of(("sweep", "grid"), marks),
            )
        )
    axes: list[tuple[str, list[Any]]] = []
    seen: dict[Path, str] = {}
    for key, values in grid.items():
        path = parse_path(key)
        gpath = ("sweep", "grid", key)
        problem = _key_problem(api_version, key, path, marks)
        if problem is not None:
            problems.append(problem)
            continue
        clash = next((other for p, other in seen.items() if p[: len(path)] == path or path[: len(p)] == p), None)
        if clash is not None:
            problems.append(
                Problem(
                    path=f"sweep.grid.{key}",
                    message=f"'{key}' overlaps the grid key '{clash}'",
                    hint="sweep each field through one key",
                    origin=origin_of(gpath, marks),
                )
            )
            continue
        seen[path] = key
        if not values:
            problems.append(
                Problem(
                    path=f"sweep.grid.{key}",
                    message=f"'{key}' has no values (the grid would be empty)",
                    hint="give at least one value, e.g. [1, 2]",
                    origin=origin_of(gpath, marks),
                )
            )
            continue
        for i, value in enumerate(values):
            for p in value_problems(api_version, path, value, {path: origin_of(gpath + (i,), marks)}):
                inner = "" if p.path == dotted(path) else f"{p.path}: "
                problems.append(
                    Problem(path=f"sweep.grid.{key}[{i}]", message=inner + p.message, hint=p.hint, origin=p.origin)
                )
        axes.append((key, list(values)))
    if problems:
        return [], problems
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))], []
