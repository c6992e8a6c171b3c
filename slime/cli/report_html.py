"""The report page: one self-contained HTML file of one or more runs (sections in the order a reader asks).

Runs (spec, lock) · spec diff (two or more runs) · curves · preflight · restarts · diagnosis · final metrics
· rollouts. Everything is inline: figures are SVG (:mod:`slime.cli.report_plots`), the script and
stylesheet are :mod:`slime.cli.report_assets`, and a Content-Security-Policy allows no request at all,
so the file opens the same on a laptop as on the login node it was made on.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from typing import Any

from slime.cli import report_plots as plots
from slime.cli.report_assets import CSS, JS
from slime.cli.report_data import RunView, TaskView, diagnosis, lock_summary, spec_diff

__all__ = ["CSP", "render_page"]

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
SECTIONS = (
    ("runs", "Runs"),
    ("diff", "Spec diff"),
    ("curves", "Curves"),
    ("preflight", "Placement / preflight"),
    ("restarts", "Restarts"),
    ("diagnosis", "Diagnosis"),
    ("final", "Final metrics"),
    ("rollouts", "Rollouts"),
)
TIME_AXIS_SECTION = "Reward and evaluation"  # the curves also drawn against time

e = html.escape


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f'<td class="num">{v:.6g}</td>'
    if v is None:
        return '<td class="num muted">-</td>'
    if isinstance(v, (int, bool)):
        return f'<td class="num">{e(json.dumps(v))}</td>'
    return f"<td>{e(v if isinstance(v, str) else json.dumps(v))}</td>"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    h = "".join(f"<th>{e(str(x))}</th>" for x in head)
    body = "".join("<tr>" + "".join(_cell(v) for v in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>'


def swatch(color: str) -> str:
    return f'<span class="swatch" style="background:{color}"></span>'


def series_labels(runs: Sequence[RunView]) -> list[tuple[RunView, TaskView, str, str]]:
    """(run, task, label, colour) per curve series: one per task of each run."""
    out = []
    for run in runs:
        for t in run.tasks:
            label = run.label if len(run.tasks) == 1 else f"{run.label} task {t.index}"
            out.append((run, t, label, plots.COLORS[len(out) % len(plots.COLORS)]))
    return out


def runs_section(runs: Sequence[RunView]) -> str:
    parts = []
    for run in runs:
        rows: list[tuple[str, Any]] = [("run dir", str(run.root))]
        for t in run.tasks:
            st = t.state or {}
            word = st.get("state") or ("not started" if not t.metrics else "unknown")
            rows.append((f"task {t.index}", f"{word}; rollout {st.get('rollout_id')}, step {st.get('step')}"))
            if t.overrides:
                rows.append((f"task {t.index} sweep point", json.dumps(t.overrides)))
        rows += lock_summary(run.lock)
        spec = json.dumps(run.resolved, indent=1)
        parts.append(
            f'<h3 id="run-{e(run.root.name)}">{e(run.label)}</h3>'
            + table(("", ""), rows, "kv")
            + f"<details><summary>resolved spec (resolved.json)</summary><pre>{e(spec)}</pre></details>"
        )
    return "".join(parts)


def diff_section(runs: Sequence[RunView]) -> str:
    if len(runs) < 2:
        return '<p class="muted">One run: nothing to compare (give two or more runs to see their spec diff).</p>'
    diff = spec_diff([r.resolved for r in runs])
    if not diff:
        return '<p class="note">The resolved specs are identical.</p>'
    rows = [[path, *vals] for path, vals in diff]
    note = f'<p class="note">{len(diff)} field(s) differ between the resolved specs (resolved.json).</p>'
    return note + table(("field", *[r.label for r in runs]), rows, "diff")


def _single_values(series: list[tuple[RunView, TaskView, str, str]], keys: set[str]) -> str:
    """Numbers logged once (the warm-up line's sft/* and first eval): a table instead of curves."""
    found: dict[str, list[Any]] = {}
    for i, (_, t, _, _) in enumerate(series):
        for r in t.metrics:
            for k, v in r.items():
                if k not in keys and k not in plots.X_KEYS and isinstance(v, (int, float)):
                    found.setdefault(k, [None] * len(series))[i] = v
    if not found:
        return ""
    rows = [[k, *vals] for k, vals in sorted(found.items())]
    return "<h3>Logged once</h3>" + table(("metric", *[s[2] for s in series]), rows, "once")


def _charts(series: list[tuple[RunView, TaskView, str, str]], keys: list[str], x: str) -> str:
    xlabel = "rollout" if x == "rollout_id" else "cumulative time/step_s (s)"
    out = []
    for key in keys:
        lines = [plots.series_of(t.metrics, key, x, label, color) for _, t, label, color in series]
        lines = [s for s in lines if s is not None]
        if lines:
            svg = plots.line_chart(key, lines, xlabel)
            out.append(f'<div class="chart" data-metric="{e(key)}" data-axis="{x}">{svg}</div>')
    return '<div class="charts">' + "".join(out) + "</div>"


def curves_section(runs: Sequence[RunView]) -> str:
    series = series_labels(runs)
    groups = plots.group_metrics([t.metrics for _, t, _, _ in series])
    if not groups:
        return '<p class="muted">No metrics.jsonl lines with rollouts yet.</p>'
    legend = " ".join(f"{swatch(c)}{e(label)}" for _, _, label, c in series)
    timed = any("time/step_s" in r for _, t, _, _ in series for r in t.metrics)
    switch = (
        '<p class="note">x axis: <label><input type="radio" name="xaxis" value="rollout" checked> rollout</label> '
        '<label><input type="radio" name="xaxis" value="time"> time (cumulative time/step_s; metrics.jsonl '
        "records no wall clock)</label></p>"
        if timed
        else ""
    )
    parts = [f'<p class="legend">{legend}</p>', switch]
    for title, keys in groups:
        parts.append(f"<h3>{e(title)}</h3>")
        parts.append(f'<div data-x="rollout">{_charts(series, keys, "rollout_id")}</div>')
        if timed and title == TIME_AXIS_SECTION:
            parts.append(f'<div data-x="time" style="display:none">{_charts(series, keys, "time")}</div>')
    parts.append(_single_values(series, {k for _, keys in groups for k in keys}))
    return "".join(parts)


def _preflight_task(label: str, pf: dict[str, Any]) -> str:
    ok = pf.get("ok")
    verdict = '<b class="ok">PASSED</b>' if ok else '<b class="bad">FAILED</b>' if ok is False else "?"
    head = f"<h3>{e(label)}: {verdict}</h3>"
    head += f'<p class="note">job {e(str(pf.get("job_id")))}, {pf.get("ray_nodes")} Ray node(s), '
    head += f"{pf.get('seconds')} s (bootstrap {pf.get('bootstrap_seconds')} s)</p>"
    nodes = [
        [
            n.get("rank"),
            n.get("host"),
            n.get("ip"),
            ", ".join(map(str, n.get("gpus") or [])) or "-",
            "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in (n.get("roles") or {}).items()),
        ]
        for n in pf.get("nodes") or []
        if isinstance(n, dict)
    ]
    slots = [
        [s.get("slot"), s.get("host"), s.get("gpu"), s.get("bundle"), ", ".join(map(str, s.get("roles") or []))]
        for s in pf.get("slots") or []
        if isinstance(s, dict)
    ]
    checks = [
        ["ok" if c.get("ok") else "FAILED", c.get("name"), c.get("node") or "", c.get("message"), c.get("fix") or ""]
        for c in pf.get("checks") or []
        if isinstance(c, dict)
    ]
    return (
        head
        + table(("rank", "host", "IP", "GPUs", "roles"), nodes, "nodes")
        + table(("slot", "host", "GPU", "bundle", "roles"), slots, "slots")
        + table(("", "check", "node", "message", "fix"), checks, "checks")
    )


def preflight_section(runs: Sequence[RunView]) -> str:
    parts = [_preflight_task(label, t.preflight) for _, t, label, _ in series_labels(runs) if t.preflight]
    return "".join(parts) or '<p class="muted">No preflight record (preflight.json) in these runs.</p>'


def _timeline(run: RunView, t: TaskView) -> str:
    t0 = run.jobs.get("submitted_at") or run.lock.get("created_at")
    times = [r.get("time") for r in t.restarts]
    if not isinstance(t0, (int, float)) or not all(isinstance(x, (int, float)) for x in times):
        return ""
    end = (t.state or {}).get("updated")
    end = end if isinstance(end, (int, float)) else max(times)
    bounds = [t0, *times, end]
    spans = [(a - t0, b - t0, f"run {i + 1}") for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    events = [
        (
            x - t0,
            f"{r.get('cause')} @ rollout {r.get('rollout_id')}",
            "#b00020" if r.get("budget") == "failures" else "#333",
        )
        for x, r in zip(times, t.restarts)
    ]
    return '<div class="timeline">' + plots.timeline_chart(spans, events) + "</div>"


def restarts_section(runs: Sequence[RunView]) -> str:
    parts = []
    for run, t, label, _ in series_labels(runs):
        if not t.restarts:
            continue
        rows = [
            [
                r.get("restart"),
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])) if r.get("time") else None,
                r.get("cause"),
                r.get("budget"),
                r.get("by"),
                r.get("job_id"),
                r.get("rollout_id"),
                r.get("checkpoint"),
                ", ".join(map(str, r["nodes"])) if isinstance(r.get("nodes"), list) else r.get("nodes"),
                r.get("detail"),
            ]
            for r in t.restarts
        ]
        head = ("restart", "time", "cause", "budget", "by", "job", "rollout", "resumes from", "nodes", "detail")
        parts.append(f"<h3>{e(label)}: {len(rows)} restart(s)</h3>" + _timeline(run, t) + table(head, rows, "restarts"))
    return "".join(parts) or '<p class="muted">No restart or requeue recorded (tasks/&lt;i&gt;/restarts.jsonl).</p>'


def diagnosis_section(runs: Sequence[RunView]) -> str:
    parts = []
    for _, t, label, _ in series_labels(runs):
        rows = diagnosis(t)
        if rows:
            body = "".join(f"<tr><th>{e(k)}</th><td><pre>{e(v)}</pre></td></tr>" for k, v in rows)
            parts.append(f'<h3>{e(label)}</h3><table class="diagnosis">{body}</table>')
    return "".join(parts) or '<p class="ok">Nothing failed: no error, failed preflight check or failure restart.</p>'


def final_section(runs: Sequence[RunView]) -> str:
    series = [(t, label) for _, t, label, _ in series_labels(runs)]
    keys = sorted({k for t, _ in series for k in (t.summary or {})})
    if not keys:
        return '<p class="muted">No summary.json yet (it is written when a run finishes).</p>'
    rows = [[k, *[(t.summary or {}).get(k) for t, _ in series]] for k in keys]
    return table(("metric", *[label for _, label in series]), rows, "final")


def render_page(runs: Sequence[RunView], viewer: str) -> str:
    """The whole page; ``viewer`` is the rollout viewer's section body (slime.cli.report_viewer)."""
    title = "slime-submit report: " + ", ".join(r.label for r in runs)
    bodies = {
        "runs": runs_section(runs),
        "diff": diff_section(runs),
        "curves": curves_section(runs),
        "preflight": preflight_section(runs),
        "restarts": restarts_section(runs),
        "diagnosis": diagnosis_section(runs),
        "final": final_section(runs),
        "rollouts": viewer,
    }
    nav = "".join(f'<a href="#{k}">{e(v)}</a>' for k, v in SECTIONS)
    sections = "".join(f'<section id="{k}"><h2>{e(v)}</h2>{bodies[k]}</section>' for k, v in SECTIONS)
    made = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f'<meta name="viewport" content="width=device-width"><title>{e(title)}</title>'
        f'<link rel="icon" href="data:,"><style>{CSS}</style></head><body>'
        f'<header><h1>{e(title)}</h1><div class="sub">made {e(made)} by slime-submit report</div></header>'
        f"<nav>{nav}</nav><main>{sections}</main><script>{JS}</script></body></html>\n"
    )
