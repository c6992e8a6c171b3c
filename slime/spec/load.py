"""Parse once at the edge: YAML (+ ``--set`` overrides) → JSON Schema → frozen, resolved Spec.

``load_spec`` is the only way a spec enters the program. It gathers every
problem from every stage (YAML values, ``--set`` overrides, schema, the rules a
schema problem cannot affect (``slime.spec.partial``), sweep keys and values,
cross-field rules of every sweep task) and raises one :class:`SpecError`; on
success it returns a :class:`LoadedSpec` whose tasks are resolved, validated
``Spec`` objects. A spec that converts cleanly skips jsonschema entirely (the
cold-start budget of ``slime-submit validate``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path as FsPath
from typing import Any, Literal

from slime.spec.errors import Origin, Problem, SpecError
from slime.spec.overrides import apply_value, parse_override, parse_path, remark
from slime.spec.schema import SUPPORTED_VERSIONS, dotted, origin_of, schema_problems
from slime.spec.sweep import expand
from slime.spec.values import normalise
from slime.spec.versions import CURRENT, move_path, upgrade
from slime.spec.yamlmarks import Marks, load_yaml

PathCheck = bool | Literal["warn"]  # see load_spec

__all__ = ["LoadedSpec", "Task", "load_spec", "load_spec_text", "parse_override", "parse_path"]

_MSGSPEC_AT = re.compile(r"^(?P<message>.*?)(?: - at `\$(?P<path>.*)`)?$", re.S)


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
    overrides: tuple[str, ...] = ()  # the --set PATH=VALUE texts applied to ``text`` (recorded in lock.json)
    written_version: str = CURRENT  # the apiVersion of ``text`` (an older one was upgraded in memory)
    site: Any = None  # slime.spec.clusters.SiteRecord: the cluster profile applied, and each field's source

    @property
    def is_sweep(self) -> bool:
        return self.spec.sweep is not None


def _problem(path: str, message: str, hint: str | None, marks: Marks, *, severity="error", task=None) -> Problem:
    return Problem(
        path=path, message=message, hint=hint, origin=origin_of(parse_path(path), marks), severity=severity, task=task
    )


def _converts(data: Any) -> bool:
    import msgspec

    from slime.spec.types import Spec

    try:
        msgspec.convert(data, Spec)
    except msgspec.ValidationError:
        return False
    return True


def _msgspec_problem(text: str, marks: Marks, task: int | None) -> Problem:
    """msgspec's 'Expected `int`, got `float` - at `$.train.seed`' as a problem at train.seed."""
    m = _MSGSPEC_AT.match(text)
    message, where = (m.group("message"), (m.group("path") or "").lstrip(".")) if m else (text, "")
    from slime.spec.schema import subschema

    sub = subschema(CURRENT, parse_path(where)) or {}
    return Problem(
        path=where,
        message=message,
        origin=origin_of(parse_path(where), marks),
        task=task,
        hint=f"expected: {sub['description']}" if sub.get("description") else None,
    )


def _typed(
    api_version: str, data: dict, base_dir: FsPath, marks: Marks, *, check_paths: PathCheck, task: int | None
) -> tuple[Any, list[Problem]]:
    import msgspec

    from slime.spec.resolve import resolve
    from slime.spec.rules import check, check_raw
    from slime.spec.types import Spec

    try:
        spec = msgspec.convert(data, Spec)
    except msgspec.ValidationError as exc:  # schema passed: a constraint only msgspec knows (int vs 1.0)
        return None, [_msgspec_problem(str(exc), marks, task)]
    problems = [_problem(path, msg, hint, marks, severity=sev, task=task) for sev, (path, msg, hint) in check_raw(spec)]
    spec = resolve(spec, base_dir)
    problems += [
        _problem(path, msg, hint, marks, severity=sev, task=task)
        for sev, (path, msg, hint) in check(spec, check_paths=check_paths)
    ]
    return spec, problems


def _version(data: Any, marks: Marks, file: str) -> tuple[str | None, list[Problem]]:
    if not isinstance(data, dict):
        return None, [
            Problem(
                path="",
                message="the spec must be a YAML mapping",
                origin=Origin(file=file, line=1),
                hint="start from specs/quickstart.yaml",
            )
        ]
    version = data.get("apiVersion")
    if version in SUPPORTED_VERSIONS:
        return version, []
    what = "missing" if version is None else f"unknown apiVersion {version!r}"
    return None, [
        Problem(
            path="apiVersion",
            message=f"apiVersion is {what}" if version is None else what,
            hint=f"supported versions: {', '.join(SUPPORTED_VERSIONS)}",
            origin=origin_of(("apiVersion",), marks),
        )
    ]


def _upgrade(data: dict, marks: Marks, file: str) -> list:
    """An older document upgraded in memory (``slime.spec.versions``), its marks moved with it; returns
    ``[notice, *moves]`` (empty for a current one)."""
    was, moves = upgrade(data)
    if was is None:
        return []
    for key in sorted(marks, key=len):
        if (moved := move_path(key, moves)) != key:
            marks[moved] = marks.pop(key)
    notice = Problem(
        path="apiVersion",
        message=f"a {was} spec, upgraded to {CURRENT} in memory",
        hint=f"`slime-submit upgrade {file}` rewrites the file, keeping its comments",
        origin=origin_of(("apiVersion",), marks),
        severity="warning",
    )
    return [notice, *moves]


def _moved_overrides(overrides: tuple[str, ...] | list[str], upgraded: list) -> list[str]:
    """``--set`` paths written for the file's own (older) version, moved like its fields."""
    moves = upgraded[1:]
    if not moves:
        return list(overrides)
    out = []
    for text in overrides:
        key, sep, value = text.partition("=")
        path = tuple(key.strip().split("."))
        out.append(".".join(move_path(path, moves)) + sep + value if sep else text)
    return out


def _without_reported(problems: list[Problem], reported: list[Problem]) -> list[Problem]:
    """Drop problems at or under a path that already has one (an invalid YAML value fails the schema too)."""
    paths = {p.path for p in reported}
    return [p for p in problems if not any(p.path == r or p.path.startswith((r + ".", r + "[")) for r in paths)]


def _collapse(per_task: list[list[Problem]]) -> list[Problem]:
    """A problem every task has is reported once, without a task index; the rest per task."""
    if len(per_task) < 2:
        return [p for ps in per_task for p in ps]

    def key(p: Problem) -> tuple:
        return (p.path, p.message, p.hint, p.severity)

    counts: dict[tuple, int] = {}
    for ps in per_task:
        for k in {key(p) for p in ps}:
            counts[k] = counts.get(k, 0) + 1
    out: list[Problem] = []
    emitted: set[tuple] = set()
    for ps in per_task:
        for p in ps:
            k = key(p)
            if counts[k] == len(per_task):
                if k not in emitted:
                    emitted.add(k)
                    out.append(
                        Problem(
                            path=p.path,
                            message=p.message + f" (in all {len(per_task)} sweep tasks)",
                            hint=p.hint,
                            origin=p.origin,
                            severity=p.severity,
                        )
                    )
            else:
                out.append(p)
    return out


def _apply_overrides(data: Any, marks: Marks, overrides: tuple[str, ...] | list[str], file: str) -> list[Problem]:
    problems: list[Problem] = []
    for text in overrides:
        parsed = parse_override(text)
        if isinstance(parsed, Problem):
            problems.append(parsed)
            continue
        if not isinstance(data, dict):
            continue  # the document itself is wrong; _version says so
        path, value = parsed
        origin = Origin(file=file, override=f"--set {text}")
        created, error = apply_value(data, path, value)
        if error:
            problems.append(
                Problem(
                    path=dotted(path),
                    message=error,
                    origin=origin,
                    hint="fix the path of the override (see `slime-submit explain FIELD`)",
                )
            )
            continue
        remark(marks, path, value, created, origin)
    return problems


def _sweep_tasks(
    api_version: str, data: dict, marks: Marks, base_dir: FsPath, check_paths: PathCheck, points: list[dict[str, Any]]
) -> tuple[list[Task], list[Problem]]:
    import msgspec

    # The data is plain JSON here (normalise ran), so an encode-once/decode-per-task copy is exact
    # and ~10x faster than copy.deepcopy for a 1,000-task grid.
    body = msgspec.json.encode({k: v for k, v in data.items() if k != "sweep"})
    tasks: list[Task] = []
    per_task: list[list[Problem]] = []
    for index, point in enumerate(points):
        task_data = msgspec.json.decode(body)
        task_marks = dict(marks)
        errors: list[Problem] = []
        for key, value in point.items():
            path = parse_path(key)
            origin = origin_of(("sweep", "grid", key), marks)
            created, error = apply_value(task_data, path, value)
            if error:
                errors.append(Problem(path=f"sweep.grid.{key}", message=error, origin=origin, task=index))
            else:
                remark(task_marks, path, value, created, origin)
        spec = None
        if not errors:
            spec, errors = _typed(
                api_version, task_data, base_dir, task_marks, check_paths=check_paths, task=index
            )  # a sweep may vary paths too
        per_task.append(errors)
        tasks.append(Task(index=index, overrides=point, spec=spec))
    return tasks, _collapse(per_task)


def load_spec_text(
    text: str,
    *,
    file: str = "<spec>",
    base_dir: FsPath | None = None,
    overrides: tuple[str, ...] | list[str] = (),
    check_paths: PathCheck = False,
) -> LoadedSpec:
    """Validate and resolve spec text (``file`` names it in messages; relative paths resolve against ``base_dir``)."""
    try:
        return _load_text(text, file, base_dir or FsPath.cwd(), overrides, check_paths)
    except RecursionError:
        raise SpecError(
            [
                Problem(
                    path="",
                    message="the spec is nested too deeply",
                    origin=Origin(file=file),
                    hint="specs are a few levels deep; check for runaway brackets",
                )
            ]
        ) from None


def _load_text(
    text: str, file: str, base_dir: FsPath, overrides: tuple[str, ...] | list[str], check_paths: PathCheck
) -> LoadedSpec:
    data, marks = load_yaml(text, file)
    api_version, vproblems = _version(data, marks, file)
    upgraded = _upgrade(data, marks, file) if not vproblems else []
    problems = _apply_overrides(data, marks, _moved_overrides(overrides, upgraded), file)
    if vproblems:
        raise SpecError(problems + vproblems)
    written, api_version = api_version, CURRENT
    problems += upgraded[:1]  # the notice
    site = None
    if isinstance(data.get("cluster"), dict) and data["cluster"].get("profile") is not None:
        from slime.spec.clusters import apply_profile  # spec > profile > defaults, field by field

        site, site_problems = apply_profile(data, marks, base_dir, file)
        problems += site_problems
    data, bad_values = normalise(data, marks)
    if bad_values or not _converts(data):
        # jsonschema (a ~50 ms import) runs only for a spec with problems: it reports all of them,
        # where msgspec stops at the first. A test checks msgspec never accepts what the schema rejects.
        found = bad_values + _without_reported(schema_problems(api_version, data, marks), bad_values)
        if found:  # plus every rule problem those fields cannot have caused: all problems in one pass
            from slime.spec.partial import independent_rule_problems

            found += independent_rule_problems(data, marks, found, base_dir, check_paths=check_paths)
            raise SpecError(problems + found)
    # (a malformed --set was skipped: the rest of the spec is still checked below)

    base, base_problems = _typed(api_version, data, base_dir, marks, check_paths=check_paths, task=None)
    if data.get("sweep") is None:
        problems += base_problems
        tasks = [Task(index=0, overrides={}, spec=base)]
    else:
        points, sweep_problems = expand(api_version, data["sweep"], marks)
        if sweep_problems:  # no tasks to check: report the base spec's own problems too
            problems += sweep_problems + base_problems
            tasks = []
        else:
            tasks, task_problems = _sweep_tasks(api_version, data, marks, base_dir, check_paths, points)
            # Tasks carry no sweep section: what the rules say about the sweep itself, only the base spec shows.
            problems += task_problems + [p for p in base_problems if p.path.startswith("sweep.")]
    if any(p.severity == "error" for p in problems):
        raise SpecError(problems)
    return LoadedSpec(
        source=FsPath(file),
        text=text,
        spec=base,
        tasks=tuple(tasks),
        warnings=tuple(p for p in problems if p.severity == "warning"),
        overrides=tuple(overrides),
        written_version=written,
        site=site,
    )


def load_spec(
    path: str | FsPath, *, overrides: tuple[str, ...] | list[str] = (), check_paths: PathCheck = False
) -> LoadedSpec:
    """Load, validate and resolve the spec file at ``path`` (raises SpecError with every problem).

    ``check_paths``: local data/model paths must exist (True), a missing one is a warning (``"warn"``:
    previews such as ``render``, where the files may live only on the cluster), or unchecked (False).
    """
    p = FsPath(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError(
            [Problem(path="", message=f"spec file not found: {p}", origin=Origin(file=str(p)), hint="check the path")]
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            [Problem(path="", message=f"cannot read spec file: {exc}", origin=Origin(file=str(p)))]
        ) from None
    return load_spec_text(text, file=str(p), base_dir=p.resolve().parent, overrides=overrides, check_paths=check_paths)
