"""``slime-submit why RUN``: why a task failed or hung, on one screen (``--json`` for tools).

Reads only the run dir (``slime.diagnosis.explain``): it works on a copy taken off the cluster.
Exit 0 when it printed an answer (also "nothing failed"); 2 for a bad target.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from slime.core.errors import ExitCode

__all__ = ["configure", "why"]


def configure(p: argparse.ArgumentParser) -> None:
    from slime.cli.jobs import _common, _guard

    _common(p)
    p.set_defaults(func=_guard(why))


def _code_name(code: Any) -> str:
    try:
        return f"{code} ({ExitCode(int(code)).name.lower()})"
    except (TypeError, ValueError):
        return str(code)


def _where(d: dict[str, Any]) -> str:
    parts = [
        f"node {d['node']}" if d.get("node") else None,
        d.get("who"),
        f"phase {d['phase']}" if d.get("phase") else None,
        f"rollout {d['rollout']}" if d.get("rollout") is not None else None,
        f"step {d['step']}" if d.get("step") is not None else None,
    ]
    return " · ".join(p for p in parts if p) or "-"


def render(ex: Any):
    """The one-screen rich renderable of an ``Explanation``."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.table import Table

    d = ex.diagnosis
    head = f"task {ex.task}: {ex.state or 'unknown'}" + (f", exit {_code_name(ex.exit_code)}" if ex.exit_code else "")
    grid = Table.grid(padding=(0, 1))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    if d is None:
        grid.add_row("What", "nothing failed" if ex.state in ("succeeded", "running", None) else "no failure record")
        return Panel(grid, title=escape(head), title_align="left")
    grid.add_row("What", f"[red]{escape(d['cause'])}[/]: {escape(d['title'])}")
    grid.add_row("Where", escape(_where(d)))
    if d.get("frame"):
        grid.add_row("Frame", escape(d["frame"]))
    ev = "\n".join(escape(re.sub(r"\x1b\[[0-9;]*m", "", line)) for line in (d.get("evidence") or [])[:5])
    if ev:
        grid.add_row("Evidence", ev)
    grid.add_row("Fix", f"[green]{escape(d['fix'])}[/]")
    if d.get("stacks"):
        grid.add_row("Stacks", escape(f"{d['stacks']}/ ({len(ex.stack_files)} processes)"))
    if ex.restarts:
        last = ex.restarts[-1]
        grid.add_row("Restarts", escape(f"{len(ex.restarts)}, last: {last.get('cause')} ({last.get('detail')})"))
    src = {"logs": "read from the logs (no record)", "record": f"{ex.failures} failure record(s)"}.get(ex.source, "")
    return Panel(grid, title=escape(head), subtitle=escape(src), title_align="left", subtitle_align="right")


def why(args: argparse.Namespace) -> int:
    from pathlib import Path

    from slime.cli.jobs import _console, _task_arg, resolve_target
    from slime.core.paths import RunPaths
    from slime.diagnosis.explain import explain

    if args.target and (Path(args.target) / "tasks").is_dir():  # a run dir, also a partial copy of one
        paths, implied = RunPaths(Path(args.target).resolve()), None
    else:
        paths, implied = resolve_target(args.target, args.dir)
    task = _task_arg(args, implied, max(1, len(paths.task_indices())))
    ex = explain(paths, task or 0)
    if args.json:
        print(json.dumps(ex.to_json(), indent=2))
        return ExitCode.OK
    _console().print(render(ex))
    return ExitCode.OK
