"""Text from the logs and the file system made safe to show: on a terminal, in a CSV, in a case.

Logs and file names are written by whatever left them behind. Shown raw, an escape sequence
in a request id acts on the terminal of whoever lists it (sets its title, clears its screen), a
newline in a file name forges a line of a summary, a right-to-left override turns a node name
around, and a cell starting with ``=`` is a formula to a spreadsheet. Everything the toolkit
prints of such text goes through one of these.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

#: Characters that act on a terminal or on how text around them displays: C0 and C1 controls
#: and DEL, and the Unicode controls of direction and invisible formatting (the bidi embeddings,
#: overrides and isolates; marks; zero-width characters; the line and paragraph separators).
#: The one format of a time, in the terminal and in the report: microseconds, in UTC.
TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f UTC"
#: Integer columns that hold a position or a number to type back or search for (a page, a seq, a
#: line, an HTTP status), printed as they are; every other integer is grouped by thousands.
AS_LOGGED = frozenset({"boot", "seq", "first_seq", "line", "line_no", "file_id", "lo", "hi", "page", "page_id",
                       "status"})


def time_text(value: dt.datetime) -> str:
    """A time as the toolkit prints it everywhere (:data:`TIME_FORMAT`); a time without a zone is UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime(TIME_FORMAT)


_CONTROLS = (
    "\x00-\x08\x0b-\x1f\x7f-\x9f"
    "\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
)
_IN_LINE = re.compile(f"[{_CONTROLS}]")
_ONE_LINE = re.compile(f"[\t\n{_CONTROLS}]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, as os.fsdecode keeps it
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}"


def printable(text: str) -> str:
    """A log line for the terminal: controls and direction marks shown as escapes (tabs kept)."""
    return _SURROGATE.sub(_escape, _IN_LINE.sub(_escape, text))


def shown(value: object) -> str:
    """A value (a path, an id) as one safe line: every control, tab and newline included, shown as
    an escape, and a file name's bytes that are not UTF-8 as ``\\xNN``."""
    text = os.fsdecode(value) if isinstance(value, Path | bytes) else str(value)
    return _SURROGATE.sub(_escape, _ONE_LINE.sub(_escape, text))


def path_text(path: Path | str) -> str:
    """A path as the case stores it: valid UTF-8 whatever bytes its name has (those shown as
    ``\\xNN``, see :func:`shown`; other characters as they are)."""
    return _SURROGATE.sub(_escape, os.fsdecode(path))


#: What a spreadsheet reads as the start of a formula (OWASP's list for CSV injection).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")


def csv_cell(text: str) -> str:
    """A string for a CSV cell: a leading formula character neutralised with ``'`` (as
    spreadsheets' own convention says), and controls shown as escapes."""
    if text.startswith(_FORMULA_START):
        text = "'" + text
    return shown(text)
