"""The report's figures as static SVG text drawn by matplotlib (curves overlaid across runs, restart timelines).

matplotlib is imported lazily (``Figure`` without pyplot: no backend, no global state). Text stays text
(``svg.fonttype: none``) so figures are small and searchable, and every figure gets its own
``svg.hashsalt`` so the ids of many SVGs inlined in one page never collide.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["COLORS", "SECTIONS", "Series", "group_metrics", "line_chart", "timeline_chart"]

#: one colour per run/task series, in order (matplotlib's tab10)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
#: curve sections, in order: a metric goes to the first whose patterns it contains
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward and evaluation", ("rollout/reward", "rollout/accuracy", "reward", "accuracy", "pass@", "eval/")),
    ("KL, entropy, clipping, TIS and staleness", ("kl", "entropy", "clip", "tis", "ratio", "stale", "offpolicy")),
    ("Loss and optimizer", ("loss", "grad_norm", "train/lr", "adv", "logprob_diff", "value", "critic")),
    ("Response length", ("len", "truncated")),
    ("Throughput", ("perf/",)),
    ("Time per phase", ("time/",)),
    ("Agent", ("agent/",)),
    ("Rollout groups and samples", ("rollout/",)),
    ("Other", ("",)),
)
X_KEYS = ("rollout_id", "step")
_counter = itertools.count()


@dataclass(frozen=True)
class Series:
    """One run/task's values of one metric against x."""

    label: str
    color: str
    x: list[float]
    y: list[float]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def group_metrics(tables: Sequence[list[dict[str, Any]]]) -> list[tuple[str, list[str]]]:
    """(section title, metric keys) of the numeric keys the metrics tables have at two or more rollouts."""
    seen: dict[str, int] = {}
    for rows in tables:
        for r in rows:
            for k, v in r.items():
                if k not in X_KEYS and _num(v):
                    seen[k] = seen.get(k, 0) + 1
    keys = sorted(k for k, n in seen.items() if n >= 2 and any(_curve_points(rows, k) >= 2 for rows in tables))
    out: dict[str, list[tuple[int, str]]] = {}
    for k in keys:  # within a section: by the first pattern a key matches, then by name
        title, pats = next((t, pats) for t, pats in SECTIONS if any(p in k for p in pats))
        out.setdefault(title, []).append((next(i for i, p in enumerate(pats) if p in k), k))
    return [(t, [k for _, k in sorted(out[t])]) for t, _ in SECTIONS if t in out]


def _curve_points(rows: list[dict[str, Any]], key: str) -> int:
    return sum(1 for r in rows if _num(r.get(key)))


def series_of(rows: list[dict[str, Any]], key: str, x: str, label: str, color: str) -> Series | None:
    """``key`` against ``x`` (``rollout_id``, or ``time``: cumulative ``time/step_s``); None without points."""
    xs, ys, clock = [], [], 0.0
    for r in rows:
        if x == "time":
            clock += float(r["time/step_s"]) if _num(r.get("time/step_s")) else 0.0
        xv = clock if x == "time" else r.get(x)
        if _num(r.get(key)) and _num(xv):
            xs.append(float(xv))
            ys.append(float(r[key]))
    return Series(label, color, xs, ys) if xs else None


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: inlined in HTML


def _rc() -> dict[str, Any]:
    return {"svg.fonttype": "none", "svg.hashsalt": f"slime-report-{next(_counter)}", "font.size": 8}


def line_chart(title: str, series: Sequence[Series], xlabel: str, *, size: tuple[float, float] = (4.2, 2.6)) -> str:
    """One metric's curves, one line per series, as SVG text."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    with matplotlib.rc_context(_rc()):
        fig = Figure(figsize=size, dpi=96)  # fixed margins: constrained layout draws every figure twice
        fig.subplots_adjust(left=0.17, right=0.97, top=0.89, bottom=0.17)
        ax = fig.add_subplot()
        for s in series:
            marker = "o" if len(s.x) <= 30 else None
            ax.plot(s.x, s.y, color=s.color, marker=marker, markersize=2.5, linewidth=1.2, label=s.label)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel)
        if xlabel == "rollout":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, linewidth=0.3, alpha=0.6)
        return _svg(fig)


def timeline_chart(spans: Sequence[tuple[float, float, str]], events: Sequence[tuple[float, str, str]]) -> str:
    """The runs of a restarted task: ``spans`` (start s, end s, label) as bars, ``events`` (time s, text,
    colour) as marked lines, on one time axis (seconds since the run was submitted)."""
    import matplotlib
    from matplotlib.figure import Figure

    with matplotlib.rc_context(_rc()):
        fig = Figure(figsize=(8.4, 1.2 + 0.1 * len(spans)), dpi=96, layout="constrained")
        ax = fig.add_subplot()
        for i, (start, end, label) in enumerate(spans):
            ax.broken_barh([(start, max(end - start, 0.0))], (0.2, 0.6), color=COLORS[i % len(COLORS)], alpha=0.7)
            ax.text(start + (end - start) / 2, 0.5, label, ha="center", va="center", fontsize=7)
        for t, text, color in events:
            ax.axvline(t, color=color, linewidth=1.5)
            ax.text(t, 1.02, text, rotation=20, fontsize=7, color=color, ha="left", va="bottom")
        ax.set_ylim(0, 1.4)
        ax.set_yticks([])
        ax.set_xlabel("seconds since the run was submitted")
        return _svg(fig)
