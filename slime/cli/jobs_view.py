"""How ``list`` and ``status`` look on a terminal: one line per row at 80 columns, ``-o wide`` for all.

The JSON documents of ``list --json`` / ``status --json`` are built in :mod:`slime.cli.jobs`; this
module only turns them into rich renderables (:class:`slime.cli.tables.FitTable` picks the columns
at the width they are drawn at). Cells that have a compact form give it as ``(full, short)``:
``rollout/reward_mean=0.75`` becomes ``reward=0.75`` when the terminal is narrow.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.text import Text

from slime.cli.runids import short_id
from slime.cli.tables import Col, FitTable, fit_text, shorten_path
from slime.core.states import RunState

__all__ = ["ListView", "StatusView", "age", "elapsed", "state_markup", "when"]

_COLORS = {
    RunState.SUCCEEDED: "green",
    RunState.RUNNING: "cyan",
    RunState.PENDING: "magenta",
    RunState.REQUEUED: "magenta",
    RunState.SUSPENDED: "magenta",
    RunState.PREEMPTED: "magenta",
    RunState.FAILED: "red",
    RunState.TIMEOUT: "red",
    RunState.CANCELLED: "yellow",
    RunState.UNKNOWN: "dim",
}


def state_markup(state: RunState | str) -> str:
    return f"[{_COLORS.get(RunState.parse(str(state)), 'white')}]{state}[/]"


def age(t: float | None) -> str:
    if t is None:
        return "?"
    return elapsed(max(0.0, time.time() - t))


def elapsed(seconds: float | None) -> str:
    """42s, 4m12s, 1h03m, 2d04h."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(t: float | None) -> str:
    if t is None:
        return "?"
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ({age(t)} ago)"


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _metric(m: dict | None) -> str | tuple[str, str]:
    """``name=value`` and its short form ``leaf=value`` (``rollout/reward_mean`` → ``reward``)."""
    if not m:
        return ""
    name, value = str(m["name"]), _value(m.get("value"))
    leaf = name.removeprefix("eval/") if name.startswith("eval/") else name.rsplit("/", 1)[-1]
    leaf = leaf.removesuffix("_mean")
    return (escape(f"{name}={value}"), escape(f"{leaf}={value}"))


def _rate(th: dict | None) -> str:
    if not th:
        return ""
    v = th.get("value")
    if not isinstance(v, (int, float)):
        return ""
    num = f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
    return escape(f"{num} {th.get('unit', '')}".strip())


# ----------------------------------------------------------------------------- list
LIST_COLUMNS = (
    Col("ID"),
    Col("NAME", flex=True, min_width=8, cap=24),
    Col("STATE"),
    Col("TASKS", priority=4, justify="right"),
    Col("STEP", priority=1, justify="right"),
    Col("STARTED", priority=2),
    Col("JOBS", priority=3, flex=True, min_width=6, cap=16),
    Col("LAUNCHER", priority=5),
    Col("RUN DIR", priority=6, flex=True, min_width=12),
)
REPORT_COLUMN = Col("REPORT")  # list --report: never dropped; its short form when the terminal is narrow


def _report_cell(page: str | None) -> str | tuple[str, str]:
    """A link to the report page: its ``file://`` URI in full, ``report.html`` when narrow; ``-`` when none."""
    if not page:
        return "-"
    uri = Path(page).resolve().as_uri()
    return f"[link={uri}]{escape(uri)}[/link]", f"[link={uri}]{escape(Path(page).name)}[/link]"


def list_rows(rows: Sequence[dict[str, Any]], notes: dict[str, str], *, report: bool = False) -> list[list[Any]]:
    """The table's cells of each run (``report``: with the REPORT column last)."""
    out = []
    for r in rows:
        note = notes.get(r["run_dir"])
        state = state_markup(r["state"])
        out.append(
            [
                escape(short_id(Path(r["run_dir"]).name)),
                escape(r["name"]) + (f" [dim]({r['chain']['step']}/{r['chain']['of']})[/]" if r.get("chain") else ""),
                (state + f" [yellow]({escape(note)})[/]", state + " [yellow]![/]") if note else state,
                str(r["tasks"]),
                "-" if r["last_step"] is None else str(r["last_step"]),
                (when(r["started"]), age(r["started"]) + " ago") if r["started"] else "?",
                escape(", ".join(r["job_ids"]) or "-"),
                escape(r["launcher"]),
                escape(Path(r["run_dir"]).name),
            ]
        )
        if report:
            out[-1].append(_report_cell(r.get("report")))
    return out


@dataclass
class ListView:
    """``list``: a title line and the runs table."""

    parent: str
    rows: Sequence[dict[str, Any]]
    notes: dict[str, str] = field(default_factory=dict)
    wide: bool = False
    report: bool = False  # list --report: the REPORT column

    def table(self) -> FitTable:
        cols = (*LIST_COLUMNS, REPORT_COLUMN) if self.report else LIST_COLUMNS
        return FitTable(cols, list_rows(self.rows, self.notes, report=self.report), wide=self.wide)

    def natural_width(self) -> int:
        return max(self.table().natural_width(), len(self.parent) + 24)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if not self.rows:
            yield fit_text(f"no runs under {escape(self.parent)}", width)
            return
        title = "newest first, under {}"
        yield fit_text(title.format(escape(shorten_path(self.parent, width - len(title) + 2))), width)
        yield self.table()


# ----------------------------------------------------------------------------- status
STATUS_COLUMNS = (
    Col("TASK", justify="right"),
    Col("STATE"),
    Col("ROLLOUT", priority=1, justify="right"),
    Col("ELAPSED", priority=2, justify="right"),
    Col("METRIC", priority=2),
    Col("EVAL", priority=3),
    Col("THROUGHPUT", priority=3, justify="right"),
    Col("RESTARTS", priority=4),
    Col("JOB", priority=4),
    Col("STEP", priority=5, justify="right"),
    Col("NODES", priority=5, flex=True, min_width=6, cap=16),
    Col("SOURCE", priority=7),
    Col("REASON", flex=True, min_width=12, cap=40),
)


def _progress(t: dict[str, Any]) -> str:
    rid, n = t.get("rollout_id"), t.get("num_rollouts")
    done = None if rid is None else max(0, rid + 1)
    if done is None:
        return "-" if n is None else f"0/{n}"
    return f"{done}/{n}" if n is not None else str(done)


def status_rows(tasks: Sequence[dict[str, Any]]) -> list[list[Any]]:
    out = []
    for t in tasks:
        causes = t.get("restart_causes") or []
        restarts = str(t["restarts"])
        out.append(
            [
                str(t["task"]),
                state_markup(t["state"]),
                _progress(t),
                elapsed(t.get("elapsed_s")),
                _metric(t.get("metric")),
                _metric(t.get("eval")),
                _rate(t.get("throughput")),
                (escape(f"{restarts} ({', '.join(causes)})"), restarts) if causes else restarts,
                escape(t["job_id"] or "-"),
                "-" if t["step"] is None else str(t["step"]),
                escape(t["nodes"] or "-"),
                escape(t.get("source") or ""),
                escape(t["reason"] or ""),
            ]
        )
    return out


def chain_lines(chain: dict[str, Any] | None) -> list[str]:
    """``status`` of a chain step: one line per step of its chain, this one marked."""
    if not chain:
        return []
    after = "succeeded" if chain.get("on") == "ok" else "ended"
    out = [f"chain of {len(chain['steps'])} steps, each after the previous one {after}:"]
    for s in chain["steps"]:
        state = "this run" if s["this"] else (state_markup(s["state"]) if s["state"] else escape(s.get("note") or "-"))
        where = short_id(Path(s["run_dir"]).name) if s.get("run_dir") else "-"
        jobs = escape(", ".join(s.get("job_ids") or []) or "-")
        mark = ">" if s["this"] else " "
        out.append(f"  {mark} {s['step']}. [bold]{escape(s['name'])}[/]  {state}  id {escape(where)}  job {jobs}")
    return out


@dataclass
class StatusView:
    """``status``: two header lines (name, state, job, start; short id and run dir), the tasks table,
    and an optional footer (``--watch`` says when it refreshed)."""

    doc: dict[str, Any]
    wide: bool = False
    footer: str | None = None

    def header(self, width: int) -> list[str]:
        d = self.doc
        ids = ", ".join(d["job_ids"]) or "-"
        first = (
            f"[bold]{escape(d['name'])}[/] {state_markup(d['state'])}  {escape(d['launcher'])}  job {escape(ids)}  "
            f"started {when(d['started'])}" + ("  [dim](preflight only)[/]" if d.get("preflight_only") else "")
        )
        root = d["run_dir"]
        lead = f"id {short_id(Path(root).name)}  run dir "
        return [first, escape(lead) + escape(root if self.wide else shorten_path(root, width - len(lead)))]

    def natural_width(self) -> int:
        return max([self.table().natural_width()] + [Text.from_markup(h).cell_len for h in self.header(1 << 30)])

    def table(self) -> FitTable:
        return FitTable(STATUS_COLUMNS, status_rows(self.doc["tasks"]), wide=self.wide)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for line in self.header(options.max_width):
            yield fit_text(line, options.max_width)
        yield self.table()
        for t in self.doc["tasks"]:
            d = t.get("diagnosis")
            if d:
                what = f"[red]{escape(d['cause'])}[/] {escape(d['title'])}"
                yield fit_text(f"task {t['task']} last failure: {what} (slime-submit why)", options.max_width)
        for line in chain_lines(self.doc.get("chain")):
            yield fit_text(line, options.max_width)
        if self.footer:
            yield fit_text(self.footer, options.max_width)
