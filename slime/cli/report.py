"""``slime-submit report RUN [RUN ...] [-o FILE] [--open]``: one self-contained HTML page of one or more runs.

Figures are static SVG drawn by matplotlib: already a runtime dependency, no JavaScript library to inline
(plotly's would add megabytes to every page), and the page renders the same anywhere, printed or offline.
RUN is what ``status`` takes (a run dir, a short id or a job id under ``--dir``). The page's sections:
:mod:`slime.cli.report_html`; its rollout viewer: :mod:`slime.cli.report_viewer`. ``slime-submit rollouts``
(:mod:`slime.cli.rollouts`) browses the saved rollouts in the terminal. Exit codes: 0 written, 2 no such
run. Imports at module level: the standard library only (the CLI builds every parser on each start).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from slime.core.errors import ExitCode

__all__ = ["ENTRIES", "configure", "print_finished", "register", "report_path", "smoke_report", "write_report"]

REPORT_NAME = "report.html"  # default output: in the (first) run dir
ENTRIES: dict[str, tuple[str, str]] = {
    "report": ("slime.cli.report:configure", "one self-contained HTML page of run(s): spec, diff, curves, rollouts"),
    "rollouts": ("slime.cli.rollouts:configure", "browse a run's saved rollouts in the terminal (filter, sort, page)"),
}


def register(table: dict[str, tuple[Callable, str]]) -> None:
    """Add ``report`` and ``rollouts`` to the CLI's subcommand table (``slime.cli.main``)."""
    from slime.core.registry import load_object

    for name, (ref, help_text) in ENTRIES.items():
        table[name] = (load_object(ref), help_text)


def configure(p: argparse.ArgumentParser) -> None:
    from slime.cli.report_viewer import DEFAULT_MAX_SAMPLES

    p.add_argument(
        "target",
        nargs="*",
        metavar="RUN",
        help="run dir(s), short id(s) or job id(s); 2+ are compared (default: newest)",
    )
    p.add_argument("-o", "--output", type=Path, default=None, help=f"the HTML file (default: RUN/{REPORT_NAME})")
    p.add_argument("--open", action="store_true", help="open it in the default browser once written")
    p.add_argument("--dir", type=Path, default=None, metavar="D", help="where short ids and job ids are looked up")
    p.add_argument(
        "--max-samples",
        type=int,
        default=DEFAULT_MAX_SAMPLES,
        metavar="N",
        help=f"saved samples the rollout viewer embeds per run/task (whole rollouts; default {DEFAULT_MAX_SAMPLES})",
    )
    p.add_argument(
        "--rollout", type=int, action="append", default=None, metavar="K", help="embed rollout K (repeatable)"
    )
    p.add_argument("--json", action="store_true", help="print {'report': PATH} as JSON")
    p.set_defaults(func=run)


def report_path(run_dir: Path) -> Path:
    """Where a run's report is written by default (what ``smoke`` and a finished run print)."""
    return Path(run_dir) / REPORT_NAME


def write_report(run_dirs: list[Path], output: Path | None = None, *, max_samples: int | None = None,
                 rollouts: list[int] | None = None) -> Path:  # fmt: skip
    """Render the report of ``run_dirs`` to ``output`` (default: the first run's ``report.html``)."""
    from slime.cli.report_data import load_run
    from slime.cli.report_html import render_page, series_labels
    from slime.cli.report_viewer import DEFAULT_MAX_SAMPLES, embed, viewer_html

    runs = [load_run(d) for d in run_dirs]
    sources = [(label, t.paths.dir, t.spec or run.resolved) for run, t, label, _ in series_labels(runs)]
    emb = embed(sources, max_samples if max_samples is not None else DEFAULT_MAX_SAMPLES, rollouts)
    page = render_page(runs, viewer_html(emb))
    out = Path(output) if output is not None else report_path(runs[0].root)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out


def run(args: argparse.Namespace) -> int:
    import json

    from slime.cli.jobs import UsageError, resolve_target

    try:
        dirs = [resolve_target(t, args.dir)[0].root for t in args.target or [None]]
    except UsageError as exc:
        from slime.cli.commands import _error

        _error(args.json, "usage", str(exc))
        return ExitCode.SPEC
    missing = missing_modules()
    if missing:
        from slime.cli.commands import _error

        _error(args.json, "usage", f"report needs {' and '.join(missing)}: pip install 'slime-submit[runtime]'")
        return ExitCode.SPEC
    out = write_report(dirs, args.output, max_samples=args.max_samples, rollouts=args.rollout)
    if args.json:
        print(json.dumps({"report": str(out)}))
    else:
        print(f"report: {out}")
    if args.open:
        import webbrowser

        webbrowser.open(out.resolve().as_uri())
    return ExitCode.OK


def missing_modules(names: tuple[str, ...] = ("matplotlib", "pyarrow")) -> list[str]:
    """The modules of ``names`` that are not installed (the runtime extra has them)."""
    from importlib.util import find_spec

    return [n for n in names if find_spec(n) is None]


def smoke_report(run_dir: Path | str | None) -> str | None:
    """Write the report of a (kept) smoke run; its path, or None when it could not be made (never raises:
    the smoke's verdict does not depend on it)."""
    if run_dir is None:
        return None
    try:
        return str(write_report([Path(run_dir)]))
    except Exception:  # noqa: BLE001 - a report is an extra; the smoke says what failed
        return None


def print_finished(run_dir: Path | str, returncode: int) -> None:
    """After a local run that ended well: write its report and print where (``submit`` calls this)."""
    paths = Path(run_dir)
    if returncode != 0 or not any(paths.glob("tasks/*/summary.json")):
        return
    out = smoke_report(paths)
    if out:
        print(f"report: {out}  (slime-submit report {paths.name} --open)")
