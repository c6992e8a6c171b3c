"""Tables that read in an 80-column terminal: one line per row, the least important columns dropped.

``rich`` draws the table; :class:`FitTable` decides beforehand, at the width rich offers (so
``status --watch`` refits on resize), which columns give way: short forms first, then cut flex
columns, then the least important columns dropped, with leftover room given back. Every column is
``no_wrap``; ``wide=True`` (``-o wide``) keeps every column whole.
Not guaranteed: a row fits a terminal narrower than its never-dropped columns' minimum widths (it
is cut, still on one line).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

__all__ = ["GAP", "Col", "FitTable", "fit_text", "shorten_path"]

GAP = 2  # columns between cells (rich's padding 1 on each side, no box)

Cell = str | tuple[str, str]  # rich markup; or (full, short) forms of it


@dataclass(frozen=True)
class Col:
    header: str
    priority: int = 0  # 0: never dropped; larger: dropped earlier
    flex: bool = False  # may be shortened with an ellipsis
    min_width: int = 8  # a flex column is not shortened below this
    cap: int | None = None  # a flex column is cut to this before any column is dropped
    justify: str = "left"
    wide_only: bool = False  # shown with -o wide only


def _text(cell: str) -> Text:
    return Text.from_markup(cell)


def _width(cell: str) -> int:
    return _text(cell).cell_len


@dataclass
class FitTable:
    """A table fitted to the width it is rendered at (see the module doc)."""

    cols: Sequence[Col]
    rows: Sequence[Sequence[Cell]]
    wide: bool = False

    def _natural(self, i: int, short: bool) -> int:
        forms = [(c[1] if short else c[0]) if isinstance(c, tuple) else c for c in (row[i] for row in self.rows)]
        return max([len(self.cols[i].header)] + [_width(f) for f in forms])

    def layout(self, width: int) -> tuple[list[int], list[bool], dict[int, int]]:
        """(shown column indexes, short form used per column, widths of cut flex columns)."""
        cols = self.cols
        if self.wide:
            return list(range(len(cols))), [False] * len(cols), {}
        empty = {i for i in range(len(cols)) if all(not _width(_full(row[i])) for row in self.rows)}
        shown = [i for i, c in enumerate(cols) if not c.wide_only and i not in empty]
        full = {i: self._natural(i, False) for i in shown}
        short = [False] * len(cols)
        widths = dict(full)

        def excess() -> int:
            return sum(widths.values()) + GAP * (len(widths) - 1) - width

        by_least = sorted(shown, key=lambda i: (-cols[i].priority, -i))
        has_short = [i for i in by_least if any(isinstance(row[i], tuple) for row in self.rows)]
        for i in has_short:  # 1. short forms keep the information
            if excess() <= 0:
                break
            short[i], widths[i] = True, self._natural(i, True)
        for i in by_least:  # 2. flex columns down to their cap
            if excess() <= 0:
                break
            if cols[i].flex and cols[i].cap is not None:
                widths[i] = min(widths[i], cols[i].cap)
        for i in by_least:  # 3. least important first: shorten to min_width, else drop
            if excess() <= 0:
                break
            if cols[i].flex:
                widths[i] = max(min(widths[i], cols[i].min_width), widths[i] - excess())
            if excess() > 0 and cols[i].priority > 0:
                del widths[i]
        for i in reversed(has_short):  # 4. room left: full forms back, most important first
            if i in widths and short[i] and excess() + full[i] - widths[i] <= 0:
                short[i], widths[i] = False, full[i]
        for i in reversed(by_least):  # then cut flex columns get it
            if i in widths and excess() < 0 and widths[i] < (natural := self._natural(i, short[i])):
                widths[i] = min(natural, widths[i] - excess())
        kept = [i for i in shown if i in widths]
        return kept, short, {i: widths[i] for i in kept if widths[i] < self._natural(i, short[i])}

    def table(self, width: int) -> Table:
        shown, short, shrunk = self.layout(width)
        table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold")
        for i in shown:
            c = self.cols[i]
            table.add_column(c.header, no_wrap=True, overflow="ellipsis", justify=c.justify, max_width=shrunk.get(i))  # type: ignore[arg-type]
        for row in self.rows:
            cells = [row[i] for i in shown]
            forms = [(c[1] if short[i] else c[0]) if isinstance(c, tuple) else c for i, c in zip(shown, cells)]
            table.add_row(*(_text(f) for f in forms))
        return table

    def natural_width(self) -> int:
        """The width with every column at full width and form (what ``-o wide`` needs)."""
        widths = [max([len(c.header)] + [_width(_full(r[i])) for r in self.rows]) for i, c in enumerate(self.cols)]
        return sum(widths) + GAP * (len(widths) - 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)


def _full(cell: Cell) -> str:
    return cell[0] if isinstance(cell, tuple) else cell


def shorten_path(path: str, width: int) -> str:
    """``path`` in at most ``width`` columns: its tail after an ellipsis (the run dir's name is the
    informative end)."""
    if len(path) <= width:
        return path
    return "…" + path[len(path) - max(1, width - 1) :]


def fit_text(markup: str, width: int) -> Text:
    """One line of markup, cut with an ellipsis at ``width`` (header lines above a table)."""
    text = _text(markup)
    text.truncate(width, overflow="ellipsis")
    text.no_wrap = True
    return text
