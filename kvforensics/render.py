"""Text for people at a terminal: frames as tables fitted to its width, numbers grouped, times in
the one format the report prints, and lines and commands wrapped to the same width.

A table never runs past the width: long text is cut with an ellipsis, and a column that does not
fit even so is left out and named under the table (``--format csv`` or ``json`` has them all).
Ids a reader types back (requests, tenants, nodes) and times are shown whole. The table is laid
out here, not by rich's ``Table``: an exposure list has as many rows as the case (rich lays out
about a thousand rows a second, too slow for a list of a million); rich measures the cells.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import polars as pl
from rich.cells import cell_len, set_cell_size

from forensics.text import AS_LOGGED, shown, time_text

#: The width when stdout is no terminal and COLUMNS does not say one.
DEFAULT_WIDTH = 100
#: No table is laid out narrower than this (COLUMNS=5 would leave nothing to read).
NARROWEST = 20
ELLIPSIS = "…"
GAP = "  "  # between two columns
#: A text column that is no id is cut to this many cells at most; an id or a time to this many
#: (a forged id of a kilobyte is cut too).
LONGEST_TEXT = 60
LONGEST_WHOLE = 48
#: A text column cut to fit keeps at least this many cells; one not named first is shown only
#: where it has this many (or its whole text, if shorter).
SHORTEST_CUT = 8
READABLE = 24
#: A header is broken over lines (after ``_`` or a space) only where that saves more cells than this.
HEADER_SLACK = 3
_WHOLE_NAMES = frozenset({"node", "certainty", "severity", "id", "op", "event", "kind", "source", "reason",
                          "evidence"})
_WHOLE_ENDINGS = ("request", "request_id", "tenant", "tenant_id", "_node", "transfer_id", "_on", "_reason")
_HEADER_BREAKS = re.compile(r"(?<=[_ ])")


def width() -> int:
    """The width to fit: COLUMNS where set, else the terminal's, else :data:`DEFAULT_WIDTH`."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return max(NARROWEST, int(columns))
    try:
        if sys.stdout.isatty():
            return max(NARROWEST, os.get_terminal_size(sys.stdout.fileno()).columns)
    except (OSError, ValueError, AttributeError):
        pass
    return DEFAULT_WIDTH


def number(value: int | float) -> str:
    """A count or a measure, grouped by thousands."""
    return f"{value:,}"


def plural(n: int, one: str, many: str | None = None) -> str:
    """``n`` things, grouped by thousands: ``1 disagreement``, ``2 disagreements``."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _length(text: str) -> int:
    return len(text) if text.isascii() else cell_len(text)


def cut(text: str, cells: int) -> str:
    """``text`` in at most ``cells`` terminal cells, an ellipsis ending what was cut."""
    if _length(text) <= cells:
        return text
    if cells <= 1:
        return ELLIPSIS[:cells]
    return set_cell_size(text, cells - 1).rstrip() + ELLIPSIS


def cut_start(text: str, cells: int) -> str:
    """``text`` in at most ``cells`` terminal cells, an ellipsis starting it where its start was cut
    (a path keeps its file's name)."""
    if _length(text) <= cells:
        return text
    if cells <= 1:
        return ELLIPSIS[:cells]
    return ELLIPSIS + set_cell_size(text[::-1], cells - 1).rstrip()[::-1]


#: Columns whose values are cut at their start, not their end: paths, whose end names the file.
PATHS = ("file", "path")


def _pad(text: str, cells: int, right: bool) -> str:
    fill = " " * (cells - _length(text))
    return fill + text if right else text + fill


@dataclass
class _Column:
    """One column being laid out: its header, its cells, and the widths it can take."""

    name: str
    cells: list[str]
    right: bool  # numbers, aligned right
    whole: bool  # an id or a time: never cut below its natural width (but for LONGEST_WHOLE)
    natural: int = 0  # its whole header on one line and its longest cell (capped)
    content: int = 0  # its longest cell (capped)
    least: int = 0
    width: int = 0

    def __post_init__(self) -> None:
        pieces = [p for p in _HEADER_BREAKS.split(self.name) if p]
        longest_cell = max((_length(c) for c in self.cells), default=0)
        piece = max((_length(p) for p in pieces), default=1)
        self.content = min(longest_cell, LONGEST_WHOLE if self.whole else LONGEST_TEXT)
        self.natural = max(_length(self.name), self.content)
        cell_least = min(longest_cell, LONGEST_WHOLE) if self.whole else min(longest_cell, SHORTEST_CUT)
        # a header is broken only where that saves a few cells ("request_id" over "req-long" stays whole)
        header = _length(self.name) if _length(self.name) - cell_least <= HEADER_SLACK else piece
        self.least = max(header, cell_least, 1)

    def header_lines(self) -> list[str]:
        """The header in this column's width: on one line, or broken after ``_`` or a space."""
        lines: list[str] = []
        for piece in (p for p in _HEADER_BREAKS.split(self.name) if p):
            if lines and _length(lines[-1] + piece) <= self.width:
                lines[-1] += piece
            else:
                lines.append(piece)
        return [cut(line.rstrip(), self.width) for line in lines] or [""]


def _whole(name: str, dtype: pl.DataType) -> bool:
    return (dtype.is_temporal() or name in _WHOLE_NAMES or name.endswith(_WHOLE_ENDINGS))


def _cells(series: pl.Series, null: str) -> list[str]:
    """A column's values as text: numbers grouped (not positions), times in the one format,
    text from the logs with its controls shown as escapes."""
    dtype = series.dtype
    values = series.to_list()
    if dtype == pl.Boolean:
        return [null if v is None else ("true" if v else "false") for v in values]
    if dtype.is_integer() and series.name in AS_LOGGED:
        return [null if v is None else str(v) for v in values]
    if dtype.is_numeric():
        return [null if v is None else number(v) for v in values]
    if isinstance(dtype, pl.Datetime):
        return [null if v is None else time_text(v) for v in values]
    if isinstance(dtype, pl.List):
        return [null if v is None else shown(", ".join(str(x) for x in v)) for v in values]
    return [null if v is None else shown(v) for v in values]


def _fit(columns: list[_Column], cells: int, first: Sequence[str]) -> list[_Column]:
    """The columns that fit in ``cells``, in their order, each given its width. Those named in
    ``first`` come first, each at its least width; then the others in order, each where it fits at
    a readable width (:data:`READABLE` cells of text, a number or an id whole, its header broken if
    need be), else left out; what is left over widens the kept ones towards their natural width
    (whole headers), in that order."""
    by_name = {c.name: c for c in columns}
    ranked = [by_name[n] for n in first if n in by_name] + [c for c in columns if c.name not in first]
    kept: list[_Column] = []
    used = -len(GAP)
    for column in ranked:
        want = column.least if column.name in first else max(column.least, min(column.content, READABLE))
        if used + len(GAP) + want <= cells:
            kept.append(column)
            used += len(GAP) + want
            column.width = want
    if not kept:  # not even the first at its least: it alone, cut to the width
        ranked[0].width = cells
        return [ranked[0]]
    spare = cells - used
    for column in kept:
        grow = min(spare, column.natural - column.width)
        column.width += grow
        spare -= grow
    return [c for c in columns if c in kept]


def table(frame: pl.DataFrame, cells: int, *, first: Sequence[str] = (), null: str = "",
          indent: int = 0) -> list[str]:
    """``frame`` as the lines of a table at most ``cells`` wide (with ``indent`` spaces before
    each): a header, a rule, a row a line; the columns left out said in a last line."""
    room = max(NARROWEST, cells - indent)
    columns = [_Column(name, _cells(frame[name], null), dtype.is_numeric() and dtype != pl.Boolean,
                       _whole(name, dtype)) for name, dtype in frame.schema.items()]
    if not columns:
        return []
    kept = _fit(columns, room, first)
    margin = " " * indent
    headers = [c.header_lines() for c in kept]
    lines = []
    for i in range(max(len(h) for h in headers)):
        lines.append(margin + GAP.join(_pad(h[i] if i < len(h) else "", c.width, c.right)
                                       for c, h in zip(kept, headers, strict=True)).rstrip())
    lines.append(margin + GAP.join("─" * c.width for c in kept))
    cuts = [cut_start if c.name in PATHS else cut for c in kept]
    for row in zip(*(c.cells for c in kept), strict=True):
        lines.append(margin + GAP.join(_pad(shorten(v, c.width), c.width, c.right)
                                       for v, c, shorten in zip(row, kept, cuts, strict=True)).rstrip())
    left_out = [c.name for c in columns if c not in kept]
    if left_out:
        lines += wrap(f"({len(left_out)} column{'s' if len(left_out) != 1 else ''} not shown at {cells} columns: "
                      f"{', '.join(left_out)}; --format csv or json has them all)", cells, indent=indent)
    return lines


def wrap(text: str, cells: int, *, indent: int = 0, hanging: int = 0) -> list[str]:
    """A paragraph as lines at most ``cells`` wide (a word longer than that is broken)."""
    return textwrap.wrap(text, max(NARROWEST, cells), initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + hanging), break_on_hyphens=False) or [""]


def command(argv: Iterable[str], cells: int, *, indent: int = 2) -> list[str]:
    """A command line to copy, its arguments shell-quoted; where it is wider than ``cells``,
    continued on the next lines with a backslash (the shell reads it as one line)."""
    words = [shlex.quote(shown(a)) for a in argv]
    lines = [" " * indent + words[0]]
    for word in words[1:]:
        if _length(lines[-1]) + 1 + _length(word) + 2 <= cells:  # (room for " \" after it)
            lines[-1] += " " + word
        else:
            lines[-1] += " \\"
            lines.append(" " * (indent + 4) + word)
    return lines
