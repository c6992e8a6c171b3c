"""``status --watch [SECONDS]``: the status screen redrawn in place until the run ends.

rich's ``Live`` redraws :class:`slime.cli.jobs_view.StatusView` every SECONDS, refitted to the
terminal (a resize is followed, a tall sweep is cut, never scrolled). The watch ends by itself when
no task is pending/running/requeued, with exit 0 whatever the run's outcome (``status`` reports, it
does not judge); Ctrl-C exits 130, so a script can tell the two apart. ``--json`` prints one status
document per refresh (JSON lines); when piped, rich prints the final screen only.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from slime.core.errors import ExitCode

__all__ = ["watch_status"]


def watch_status(fetch: Callable[[], tuple[Any, dict]], interval: float, args: argparse.Namespace) -> int:
    """Poll ``fetch() -> (RunStatus, JSON doc)`` every ``interval`` seconds until the run ended."""
    try:
        if args.json:
            return _watch_json(fetch, interval)
        return _watch_live(fetch, interval, args.output == "wide")
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED


def _watch_json(fetch, interval: float) -> int:
    while True:
        st, doc = fetch()
        print(json.dumps(doc), flush=True)
        if not st.state.is_active:
            return ExitCode.OK
        time.sleep(interval)


def _watch_live(fetch, interval: float, wide: bool) -> int:
    from rich.console import Console
    from rich.live import Live

    from slime.cli.jobs_view import StatusView

    console = Console(highlight=False)
    every = f"{interval:g}s"
    with Live(console=console, auto_refresh=False, vertical_overflow="ellipsis") as live:
        while True:
            st, doc = fetch()
            now = time.strftime("%H:%M:%S")
            if st.state.is_active:
                footer = f"[dim]every {every} · {now} · Ctrl-C stops watching[/]"
            else:
                footer = f"[dim]run ended ({st.state}); stopped watching at {now}[/]"
            live.update(StatusView(doc, wide=wide, footer=footer), refresh=True)
            if not st.state.is_active:
                return ExitCode.OK
            time.sleep(interval)
