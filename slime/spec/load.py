"""Parse once at the edge: YAML (+ ``--set`` overrides) → JSON Schema → frozen, resolved Spec.

``load_spec`` is the only way a spec enters the program. It gathers every
problem from every stage (schema, sweep keys and values, cross-field rules of
every sweep task) and raises one :class:`SpecError`; on success it returns a
:class:`LoadedSpec` whose tasks are resolved, validated ``Spec`` objects.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any

from slime.spec.errors import Origin, Problem, SpecError
from slime.spec.schema import SUPPORTED_VERSIONS, dotted, field_names, origin_of, schema_for, schema_problems, subschema
from slime.spec.yamlmarks import Marks, Path, load_yaml, parse_scalar

__all__ = ["LoadedSpec", "Task", "load_spec", "load_spec_text", "parse_override", "parse_path"]

# Array tasks share one allocation, so nothing that shapes it may vary per task.
_UNSWEEPABLE = ("apiVersion", "kind", "name", "cluster", "sweep", "logging")


@dataclass(frozen=True, kw_only=True, slots=True)
class Task:
    """One runnable point of the spec: index, the overrides that made it, its resolved spec."""

    index: int
    overrides: dict[str, Any]
    spec: Any  # slime.spec.types.Spec (typed lazily to keep this module's import light)


@dataclass(frozen=True, kw_only=True, slots=True)
class LoadedSpec:
    source: FsPath
    text: str
    spec: Any  # the resolved base Spec (sweep not applied)
    tasks: tuple[Task, ...]
    warnings: tuple[Problem, ...] = field(default=())

    @property
    def is_sweep(self) -> bool:
        return self.spec.sweep is not None


def parse_path(text: str) -> Path:
    """'data.eval[0].path' or 'data.eval.0.path' → ('data', 'eval', 0, 'path')."""
    out: list[str | int] = []
    for part in re.split(r"\.|(?=\[)", text):
        if not part:
            continue
        m = re.fullmatch(r"\[(\d+)\]", part)
        if m:
            out.append(int(m.group(1)))
        elif part.isdigit():
            out.append(int(part))
        else:
            out.append(part)
    return tuple(out)


def parse_override(text: str) -> tuple[Path, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise SpecError([Problem(path="", message=f"bad override {text!r}",
                                 hint="use --set dotted.field.path=value, e.g. --set train.seed=3",
                                 origin=Origin(file="<command line>", override=f"--set {text}"))])
    return parse_path(key.strip()), parse_scalar(value)


def _set(data: Any, path: Path, value: Any) -> None:
    node = data
    for part, nxt in zip(path[:-1], path[1:]):
        if isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
            continue
        if not isinstance(node, dict):
            return
        if not isinstance(node.get(part), (dict, list)):
            node[part] = [] if isinstance(nxt, int) else {}
        node = node[part]
    last = path[-1]
    if isinstance(node, list) and isinstance(last, int):
        while len(node) <= last:
            node.append({})
        node[last] = value
    elif isinstance(node, dict):
        node[last] = value


def _mark_all(marks: Marks, path: Path, value: Any, origin: Origin) -> None:
    marks[path] = origin
    if isinstance(value, dict):
        for k, v in value.items():
            _mark_all(marks, path + (str(k),), v, origin)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _mark_all(marks, path + (i,), v, origin)


def _problem(path: str, message: str, hint: str | None, marks: Marks, *, severity="error", task=None) -> Problem:
    return Problem(path=path, message=message, hint=hint, origin=origin_of(parse_path(path), marks),
                   severity=severity, task=task)


def _typed(api_version: str, data: dict, base_dir: FsPath, marks: Marks, *, check_paths: bool,
           task: int | None) -> tuple[Any, list[Problem]]:
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.rules import check
    from slime.spec.types import Spec

    try:
        spec = msgspec.convert(data, Spec)
    except msgspec.ValidationError as exc:  # schema passed, so this is a constraint msgspec alone knows
        return None, [Problem(path="", message=str(exc), origin=origin_of((), marks), task=task)]
    spec = resolve(spec, base_dir)
    problems = [_problem(path, msg, hint, marks, severity=sev, task=task)
                for sev, (path, msg, hint) in check(spec, check_paths=check_paths)]
    return spec, problems


def _version(data: Any, marks: Marks, file: str) -> tuple[str | None, list[Problem]]:
    if not isinstance(data, dict):
        return None, [Problem(path="", message="the spec must be a YAML mapping", origin=Origin(file=file, line=1),
                              hint="start from specs/quickstart.yaml")]
    version = data.get("apiVersion")
    if version in SUPPORTED_VERSIONS:
        return version, []
    what = "missing" if version is None else f"unknown apiVersion {version!r}"
    return None, [Problem(path="apiVersion", message=f"apiVersion is {what}" if version is None else what,
                          hint=f"supported versions: {', '.join(SUPPORTED_VERSIONS)}",
                          origin=origin_of(("apiVersion",), marks))]


def _sweep_tasks(api_version: str, data: dict, marks: Marks) -> tuple[list[dict[str, Any]], list[Problem]]:
    from jsonschema import Draft202012Validator

    grid = data["sweep"]["grid"]
    problems: list[Problem] = []
    root = schema_for(api_version)
    axes: list[tuple[str, list[Any]]] = []
    for key, values in grid.items():
        gpath = ("sweep", "grid", key)
        path = parse_path(key)
        sub = subschema(api_version, path)
        if path and path[0] in _UNSWEEPABLE:
            problems.append(Problem(path=f"sweep.grid.{key}", message=f"'{key}' cannot be swept",
                                    hint=f"array tasks share one allocation and run dir; sweepable sections: "
                                         f"model, train, rollout, data, reward, algorithm, agent",
                                    origin=origin_of(gpath, marks)))
            continue
        if sub is None:
            parent = path[:-1]
            names = field_names(api_version, parent) if parent else list(root["$defs"]["Spec"]["properties"])
            close = difflib.get_close_matches(str(path[-1]), names, n=1, cutoff=0.6)
            hint = (f"did you mean '{dotted(parent + (close[0],))}'? " if close else "") + \
                (f"fields of {dotted(parent)}: {', '.join(names)}" if parent else f"sections: {', '.join(names)}")
            problems.append(Problem(path=f"sweep.grid.{key}", message=f"'{key}' is not a spec field path",
                                    hint=hint, origin=origin_of(gpath, marks)))
            continue
        validator = Draft202012Validator({"$defs": root["$defs"], **sub})
        for i, value in enumerate(values):
            for err in validator.iter_errors(value):
                problems.append(Problem(path=f"sweep.grid.{key}[{i}]", message=f"{value!r}: {err.message}",
                                        hint=sub.get("description"), origin=origin_of(gpath + (i,), marks)))
        axes.append((key, list(values)))
    if problems:
        return [], problems
    keys = [k for k, _ in axes]
    return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in axes))], []


def load_spec_text(text: str, *, file: str = "<spec>", base_dir: FsPath | None = None,
                   overrides: tuple[str, ...] | list[str] = (), check_paths: bool = False) -> LoadedSpec:
    base_dir = base_dir or FsPath.cwd()
    data, marks = load_yaml(text, file)
    problems: list[Problem] = []
    for text_override in overrides:
        path, value = parse_override(text_override)
        if isinstance(data, dict):
            _set(data, path, value)
            _mark_all(marks, path, value, Origin(file=file, override=f"--set {text_override}"))
    api_version, vproblems = _version(data, marks, file)
    if vproblems:
        raise SpecError(vproblems)
    problems += schema_problems(api_version, data, marks)
    if problems:
        raise SpecError(problems)

    base, base_problems = _typed(api_version, data, base_dir, marks, check_paths=check_paths, task=None)
    tasks: list[Task] = []
    if data.get("sweep") is None:
        problems += base_problems
        tasks.append(Task(index=0, overrides={}, spec=base))
    else:
        points, sweep_problems = _sweep_tasks(api_version, data, marks)
        problems += sweep_problems
        body = {k: v for k, v in data.items() if k != "sweep"}
        for index, point in enumerate(points):
            task_data = copy.deepcopy(body)
            for key, value in point.items():
                _set(task_data, parse_path(key), value)
            task_marks = dict(marks)
            for key in point:
                _mark_all(task_marks, parse_path(key), point[key], origin_of(("sweep", "grid", key), marks))
            spec, task_problems = _typed(api_version, task_data, base_dir, task_marks,
                                         check_paths=check_paths and index == 0, task=index)
            problems += task_problems
            tasks.append(Task(index=index, overrides=point, spec=spec))
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise SpecError(problems)
    return LoadedSpec(source=FsPath(file), text=text, spec=base, tasks=tuple(tasks),
                      warnings=tuple(p for p in problems if p.severity == "warning"))


def load_spec(path: str | FsPath, *, overrides: tuple[str, ...] | list[str] = (),
              check_paths: bool = False) -> LoadedSpec:
    """Load, validate and resolve the spec file at ``path`` (raises SpecError with every problem)."""
    p = FsPath(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError([Problem(path="", message=f"spec file not found: {p}", origin=Origin(file=str(p)),
                                 hint="check the path")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError([Problem(path="", message=f"cannot read spec file: {exc}", origin=Origin(file=str(p)))]) from None
    return load_spec_text(text, file=str(p), base_dir=p.resolve().parent, overrides=overrides,
                          check_paths=check_paths)
