"""Implementations of the spec-level subcommands (submit, validate, render, schema, explain, import)."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from slime.core.errors import ExitCode, InfraError
from slime.spec import SpecError
from slime.spec.errors import Problem


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def print_problems(problems: list[Problem], *, stderr: bool = True) -> None:
    from rich.markup import escape

    con = _console(stderr=stderr)
    errors = [p for p in problems if p.severity == "error"]
    for p in problems:
        color = "red" if p.severity == "error" else "yellow"
        where = f"[bold]{escape(str(p.origin))}[/]: " if p.origin else ""
        task = f" [dim]\\[sweep task {p.task}][/]" if p.task is not None else ""
        subject = f"[cyan]{escape(p.subject())}[/]{task}: " if p.subject() or task else ""
        con.print(f"{where}[{color}]{p.severity}[/]: {subject}{escape(p.message)}")
        if p.hint:
            con.print(f"    [dim]hint:[/] {escape(p.hint)}")
    if errors:
        con.print(f"[red]{len(errors)} problem{'s' if len(errors) != 1 else ''}[/]; nothing was submitted.")


def run_guarded(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand, mapping known failures to exit codes and messages (never a traceback)."""
    from slime.core.registry import UnknownPlugin

    as_json = getattr(args, "json", False)
    try:
        return func(args)
    except SpecError as exc:
        if as_json:
            print(json.dumps({"ok": False, "problems": [p.to_json() for p in exc.problems]}, indent=2))
        else:
            print_problems(exc.problems)
        return ExitCode.SPEC
    except UnknownPlugin as exc:
        _error(as_json, "usage", str(exc))
        return ExitCode.SPEC
    except InfraError as exc:
        _error(as_json, "infrastructure", str(exc))
        return ExitCode.INFRA
    except KeyboardInterrupt:
        _error(as_json, "interrupted", "interrupted")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return ExitCode.OK
    except Exception:  # noqa: BLE001 - a bug: say so, with the traceback, exit 1
        print("slime-submit hit an internal error (a bug; please report it with this traceback):", file=sys.stderr)
        traceback.print_exc()
        return ExitCode.BUG


def _error(as_json: bool, kind: str, message: str) -> None:
    if as_json:
        print(json.dumps({"ok": False, "error": kind, "message": message}))
    else:
        from rich.markup import escape

        _console(stderr=True).print(f"[red]{kind} error:[/] {escape(message)}")


def _load(args: argparse.Namespace, *, check_paths: bool | Literal["warn"] = False):
    from slime.cli.init_cmd import load_checked  # load_spec, and no <FILL: ...> placeholder left

    return load_checked(args.spec, overrides=args.overrides, check_paths=check_paths)


# ----------------------------------------------------------------------------- validate
def validate(args: argparse.Namespace) -> int:
    from slime.cli.init_cmd import load_checked

    results, all_problems, failed = [], [], False
    for path in args.specs:
        try:
            loaded = load_checked(path, overrides=args.overrides, check_paths=args.check_paths)
        except SpecError as exc:
            failed = True
            all_problems.extend(exc.problems)
            results.append({"spec": path, "ok": False, "problems": [p.to_json() for p in exc.problems]})
            continue
        all_problems.extend(loaded.warnings)
        results.append(
            {"spec": path, "ok": True, "tasks": len(loaded.tasks), "warnings": [p.to_json() for p in loaded.warnings]}
        )
    if args.json:
        print(json.dumps({"ok": not failed, "results": results}, indent=2))
    else:
        print_problems(all_problems)
        con = _console()
        for r in results:
            if r["ok"]:
                con.print(f"[green]valid[/]: {r['spec']} ({r['tasks']} task{'s' if r['tasks'] != 1 else ''})")
    return ExitCode.SPEC if failed else ExitCode.OK


# ----------------------------------------------------------------------------- compile / submit
def _dryrun(args: argparse.Namespace, *, preflight_only: bool = False, force: bool = False, preview: bool = False):
    """(loaded spec, its launcher, the launcher's dry run) for ``args``."""
    from launchers import get_launcher
    from launchers.base import SubmitOptions

    # A preview may run where the job's files are not (a laptop, for a cluster's paths): warn, don't refuse.
    loaded = _load(args, check_paths="warn" if preview else True)
    launcher = get_launcher(loaded.spec.cluster.launcher)
    options = SubmitOptions(preflight_only=preflight_only, force=force)
    return loaded, launcher, launcher.dryrun(loaded, options)


def render(args: argparse.Namespace) -> int:
    from slime.backends.preview import engine_previews

    # submit --dry-run lands here too: show what that submit would run (--preflight-only changes the script)
    loaded, _, dry = _dryrun(
        args, preflight_only=getattr(args, "preflight_only", False), force=getattr(args, "force", False), preview=True
    )
    dry = dry.with_engines(engine_previews(loaded))
    if args.json:
        print(json.dumps(dry.to_json(), indent=2))
    else:
        print_problems(list(loaded.warnings))
        sys.stdout.write(dry.render())
    return ExitCode.OK


def submit(args: argparse.Namespace) -> int:
    if args.dry_run:
        return render(args)
    loaded, launcher, dry = _dryrun(args, preflight_only=args.preflight_only, force=args.force)
    if not args.json:
        print_problems(list(loaded.warnings))
    submission = launcher.submit(dry)
    if args.json:
        print(json.dumps(submission.to_json(), indent=2))
    else:
        con = _console()
        if submission.job_ids:
            con.print(f"submitted job {', '.join(submission.job_ids)}")
        con.print(f"run dir: {submission.run_dir}")
        if not submission.job_ids:  # a local run, finished: its report (slime.cli.report)
            from slime.cli.report import print_finished

            print_finished(submission.run_dir, submission.returncode)
    return submission.returncode


# ----------------------------------------------------------------------------- schema / explain
def schema(args: argparse.Namespace) -> int:
    from slime.spec.schema import SUPPORTED_VERSIONS, dump_schema

    if args.api_version not in SUPPORTED_VERSIONS:
        _error(False, "usage", f"unknown apiVersion {args.api_version!r}; supported: {', '.join(SUPPORTED_VERSIONS)}")
        return ExitCode.SPEC
    sys.stdout.write(dump_schema(args.api_version))
    return ExitCode.OK


def _type_text(sub: dict, root: dict) -> str:
    from slime.spec.schema import _deref

    sub = _deref(sub, root)
    if "anyOf" in sub:
        return " | ".join(_type_text(s, root) for s in sub["anyOf"])
    if "enum" in sub:
        return " | ".join(json.dumps(v) for v in sub["enum"])
    t = sub.get("type")
    if t == "array":
        if "prefixItems" in sub:
            return "[" + ", ".join(_type_text(s, root) for s in sub["prefixItems"]) + "]"
        return f"list[{_type_text(sub.get('items', {}), root) if sub.get('items') else 'any'}]"
    if t == "object":
        if "properties" in sub:
            return sub.get("title", "section")
        add = sub.get("additionalProperties")
        return f"map[str, {_type_text(add, root) if isinstance(add, dict) else 'any'}]"
    if t is None:
        return "any"
    bounds = [
        f"{k}={sub[k]}"
        for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "pattern")
        if k in sub
    ]
    return t + (f" ({', '.join(bounds)})" if bounds else "")


def explain(args: argparse.Namespace) -> int:
    from slime.spec.load import parse_path
    from slime.spec.schema import _deref, dotted, field_names, schema_for, subschema, suggest_path

    root = schema_for("slime/v2")
    path = parse_path(args.field)
    sub = subschema("slime/v2", path)
    if sub is None:
        parent = path[:-1]
        if parent and (subschema("slime/v2", parent) or {}).get("type") == "array":  # data.eval.name
            item = dotted(parent + (0,) + path[-1:])
            _error(args.json, "usage", f"'{dotted(parent)}' is a list: name an item's field, e.g. '{item}'")
            return ExitCode.SPEC
        names = field_names("slime/v2", parent) if parent else list(root["$defs"]["Spec"]["properties"])
        close = suggest_path(str(path[-1]) if path else "", parent, names)
        hint = f" did you mean '{dotted(close)}'?" if close else ""
        _error(args.json, "usage", f"'{args.field}' is not a spec field.{hint} Fields here: {', '.join(names)}")
        return ExitCode.SPEC
    desc = sub.get("description") or _deref(sub, root).get("description", "")
    info = {"field": args.field, "type": _type_text(sub, root), "default": sub.get("default"), "description": desc}
    children = field_names("slime/v2", path)
    if children:
        info["fields"] = children
    if args.json:
        print(json.dumps(info, indent=2))
        return ExitCode.OK
    con = _console()
    from rich.markup import escape

    con.print(f"[bold cyan]{escape(args.field)}[/]: {escape(info['type'])}")
    if "default" in sub:
        con.print(f"  default: {escape(json.dumps(info['default']))}")
    if desc:
        con.print(f"  {escape(desc)}")
    if children:
        con.print(f"  fields: {escape(', '.join(children))}")
    return ExitCode.OK


# ----------------------------------------------------------------------------- migration
def import_slime_args(args: argparse.Namespace) -> int:
    from slime.migrate.importer import convert_slime_args, read_source

    text = read_source(args.file)
    sourced = tuple(read_source(path) for path in getattr(args, "source", []))
    result = convert_slime_args(text, name=args.name, model=getattr(args, "model", None), sourced=sourced)
    accepted = result.accepted(drop_unmapped=getattr(args, "drop_unmapped", False))
    if accepted and args.output:
        from slime.core.paths import atomic_write

        try:
            atomic_write(Path(args.output), result.yaml)
        except OSError as exc:
            _error(
                args.json,
                "usage",
                f"cannot write -o {args.output}: {exc.strerror or exc}; "
                "give a file path in an existing, writable directory",
            )
            return ExitCode.SPEC
    elif accepted and not args.json:
        sys.stdout.write(result.yaml)
    if args.json:
        print(json.dumps(result.report() | {"accepted": accepted}, indent=2))
    else:
        _print_import(result, accepted)
    return ExitCode.OK if accepted else ExitCode.SPEC


def _print_import(result, accepted: bool) -> None:
    """The account on stderr: refused flags and contradictions first, then the notes."""
    from rich.markup import escape

    con = _console(stderr=True)
    refused = {f for f, _ in result.refused} | {f for f, _ in result.conflicts}
    for flag, why in result.conflicts:
        con.print(f"[red]contradiction[/]: {escape(flag)} ({escape(why)})")
    for flag, why in result.refused:
        con.print(f"[red]refused[/]: {escape(flag)} ({escape(why)})")
    for flag, why in result.unmapped:
        if flag not in refused:
            con.print(f"[yellow]dropped[/]: {escape(flag)} ({escape(why)})")
    for flag, why in result.differences:
        con.print(f"[yellow]differs from slime[/]: {escape(flag)} ({escape(why)})")
    if result.problems:
        print_problems(list(result.problems))
    con.print(
        f"mapped {len(result.mapped)} flag(s); {len(result.unmapped)} not mapped, of which "
        f"{len(result.refused)} change what is trained and {len(result.conflicts)} contradict (listed above)"
    )
    if not accepted:
        fix = " (or pass --drop-unmapped to drop the refused flags)" if result.refused and not result.conflicts else ""
        con.print(f"[red]no spec written[/]: fix the flags above{fix}")
