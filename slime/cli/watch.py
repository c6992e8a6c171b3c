"""``status --watch [SECONDS]``: the status screen redrawn in place until the run ends.

rich's ``Live`` redraws the view (:class:`slime.cli.jobs_view.StatusView`, refitted to the terminal's
width every time, so a resize is followed) every SECONDS; its height is bounded by the terminal
(``vertical_overflow="ellipsis"``: a sweep with more tasks than rows is cut, never scrolled). The
watch ends by itself when no task is pending/running/requeued any more, leaving the final screen
with a line saying so, exit code 0 (whatever state the run ended in: ``status`` reports, it does
not judge). Ctrl-C stops watching without a message and exits 130 (128 + SIGINT, as a shell
reports it), so a script can tell "watched to the end" from "interrupted".

``--json``: one compact status document per refresh (JSON lines), the last one once the run ended.
Not a terminal (piped): rich prints the final screen only.
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
