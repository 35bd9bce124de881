"""SGLang's line formats, in the order a line is offered to them, and a line as the passes read it."""

from __future__ import annotations

import re
from typing import Any

from forensics.adapters.base import LineFormat, Options
from forensics.adapters.sglang.batches import BatchFormat
from forensics.adapters.sglang.config import ConfigFormat
from forensics.adapters.sglang.errors import ErrorFormat
from forensics.adapters.sglang.flush import FlushFormat
from forensics.adapters.sglang.log import Facts, LogLine, split
from forensics.adapters.sglang.mooncake import FailureFormat
from forensics.adapters.sglang.requests import RequestFormat
from forensics.adapters.sglang.retract import RetractFormat
from forensics.adapters.sglang.timestats import TimeStatsFormat

#: The line formats, in the order a line is offered to them (a line's format is its index here).
FORMATS: tuple[LineFormat[LogLine, Facts, Any], ...] = (
    RequestFormat(), TimeStatsFormat(), FailureFormat(), ErrorFormat(), ConfigFormat(), BatchFormat(), FlushFormat(),
    RetractFormat())
REQUESTS = 0
CONFIG = 4
assert isinstance(FORMATS[REQUESTS], RequestFormat) and isinstance(FORMATS[CONFIG], ConfigFormat)
_READS = tuple(f.read for f in FORMATS)

#: What a line reads as: the line, its format's index (-1: none) and what the format read.
Read = tuple[LogLine, int, Any]


def read_line(text: str, options: Options) -> Read:
    """A line as the passes read it: its prefix split off, and its format's index and value (:func:`_read`)."""
    line = split(text, options.year)
    return (line, *_read(line, text, options))


def _read(line: LogLine, text: str, options: Options) -> tuple[int, Any]:
    """The format of a line (its index in FORMATS) and what it read of it (an Untranslatable
    for a malformed line of that format); for uvicorn's access line of a generate request, -1
    and its HTTP status; (-1, None) for a line of no format the adapter reads."""
    if (value := _READS[REQUESTS](line, options)) is not None:  # (a request line: no other format reads it)
        return REQUESTS, value
    if ' HTTP/' in text and (access := _ACCESS.search(text)) is not None:
        return -1, int(access["status"])
    for k in range(1, len(_READS)):
        value = _READS[k](line, options)
        if value is not None:
            return k, value
    return -1, None


#: uvicorn's access line of a generate request (``INFO:     ADDR - "POST /generate HTTP/1.1" 200 OK``)
_ACCESS = re.compile(r' - "POST /(?:generate|v1/chat/completions|v1/completions)[?\S]* HTTP/[\d.]+" '
                     r'(?P<status>\d{3})\b')
