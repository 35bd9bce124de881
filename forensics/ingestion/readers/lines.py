"""Reading a file as lines, never holding more than the longest line allowed: as text, and as
blocks of whole lines in numpy buffers."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from typing import IO

import numpy as np

from forensics import adapters
from forensics.ingestion.readers.logfile import KEPT_OF_LONG_LINE, Limits, LogFile
from forensics.ingestion.readers.opening import _decompressed, open_binary


def text_lines(log: LogFile, long_lines: dict[int, int] | None = None) -> adapters.Lines:
    """The file's non-blank lines as ``(line_no, text)``, from the start at every call; a line
    longer than the file's limit comes as its first bytes, its number and length put in
    ``long_lines``."""

    def lines() -> Iterator[tuple[int, str]]:
        with open_binary(log) as fh:
            for line_no, (raw, length) in enumerate(bounded_lines(fh, log.limits.max_line_bytes), 1):
                line = raw.decode("utf-8", "backslashreplace").rstrip("\r\n")
                if length is not None and long_lines is not None:
                    long_lines[line_no] = length
                if line and not line.isspace():  # (a blank line, without copying the others)
                    yield line_no, line

    return lines


_TEXT_READ = 1 << 20


def bounded_lines(fh: IO[bytes], max_line: int) -> Iterator[tuple[bytes, int | None]]:
    """A text file's lines, each with its line end (``\n``, ``\r\n`` or ``\r``, as Python reads
    text), and None; or, for a line longer than ``max_line`` bytes, its first
    :data:`KEPT_OF_LONG_LINE` bytes with its line end, and its length. Never more than about
    ``max_line`` bytes are held, however long a line is."""
    pending = b""
    long_so_far = -1  # inside a line too long: its length so far (and ``prefix``, its start)
    prefix = b""
    while chunk := fh.read(_TEXT_READ):
        if chunk.endswith(b"\r"):  # a "\r\n" is never cut between two reads
            chunk += fh.read(1)
        if long_so_far >= 0:
            end = _EOL.search(chunk)
            if end is None:
                long_so_far += len(chunk)
                continue
            yield prefix + end.group(), long_so_far + end.start()
            long_so_far = -1
            chunk = chunk[end.end():]
        lines = (pending + chunk if pending else chunk).splitlines(keepends=True)
        pending = lines.pop() if lines and not lines[-1].endswith((b"\n", b"\r")) else b""
        for line in lines:
            body = len(line.rstrip(b"\r\n"))
            yield (line, None) if body <= max_line else (line[:KEPT_OF_LONG_LINE] + line[body:], body)
        if len(pending) > max_line:
            long_so_far, prefix, pending = len(pending), pending[:KEPT_OF_LONG_LINE], b""
    if long_so_far >= 0:
        yield prefix, long_so_far
    elif pending:
        yield (pending, None) if len(pending) <= max_line else (pending[:KEPT_OF_LONG_LINE], len(pending))


_EOL = re.compile(rb"\r\n|\r|\n")


def long_line_detail(length: int, limits: Limits) -> str:
    """Why a line too long is quarantined (its reason: unreadable)."""
    return (f"a line of {length:,} bytes, longer than the longest read ({limits.max_line_bytes:,}, "
            f"--max-line-bytes): its first {KEPT_OF_LONG_LINE:,} bytes are kept")


def _long_details(long: dict[int, int], limits: Limits) -> dict[int, str]:
    """Why each line too long (index in its block: length) is quarantined."""
    return {i: long_line_detail(n, limits) for i, n in long.items()}


#: A block of whole lines: its bytes, its first line's number, where its lines end, and the
#: lines too long to read (index in the block: length), which the block holds the start of.
LineBlock = tuple[np.ndarray, int, np.ndarray, dict[int, int]]


def _line_blocks(log: LogFile, lines: int | None, read_bytes: int, stored: bytes | None = None) -> Iterator[LineBlock]:
    """The file's bytes in blocks of whole lines, each ending with a newline (see :data:`LineBlock`);
    ``stored``: the file as stored, read already (:func:`read_small`), not opened again.

    With ``lines``, each block but the last has exactly that many lines, unless they would take
    more than ``read_bytes``; without it, each read's whole lines make a block. The file is read
    into numpy buffers and the blocks are views of them: no copy but the few lines carried from
    one read to the next. A line longer than the file's ``max_line_bytes`` is cut to its first
    :data:`KEPT_OF_LONG_LINE` bytes; one that goes on past a read is read on without being held.
    """
    newlines: Callable[[np.ndarray, int], np.ndarray] = _newlines
    if log.fast:
        from forensics.ingestion.fast import jsonlines

        newlines = jsonlines.newlines
    max_line = log.limits.max_line_bytes
    next_line = 1
    carry = np.empty(0, dtype=np.uint8)
    carry_ends = np.empty(0, dtype=np.int64)  # where the complete lines in ``carry`` end
    opened = open_binary(log) if stored is None else _decompressed(log, io.BytesIO(stored), len(stored))
    with opened as fh:
        first = True
        while True:
            buf = np.empty(len(carry) + read_bytes, dtype=np.uint8)
            buf[: len(carry)] = carry
            got = _read_into(fh, buf[len(carry):])
            data = buf[: len(carry) + got]
            if first and bytes(data[:3]) == b"\xef\xbb\xbf":
                data = data[3:]
            first = False
            if not got:
                if len(data):
                    if data[-1] != 10:
                        data = np.append(data, np.uint8(10))
                        carry_ends = np.append(carry_ends, len(data) - 1)
                    yield _bounded(data, next_line, carry_ends, max_line)
                return
            ends = np.concatenate([carry_ends, newlines(data[len(carry):], len(carry))])
            start, used = 0, 0
            for last in range(lines - 1, len(ends), lines) if lines else ():
                stop = int(ends[last]) + 1
                yield _bounded(data[start:stop], next_line, ends[used : last + 1] - start, max_line)
                next_line += last + 1 - used
                start, used = stop, last + 1
            if used < len(ends) and (lines is None or len(data) - start > read_bytes):
                stop = int(ends[-1]) + 1  # (with ``lines``: lines too long for a read, cut by size)
                yield _bounded(data[start:stop], next_line, ends[used:] - start, max_line)
                next_line += len(ends) - used
                start, used = stop, len(ends)
            carry = data[start:]
            carry_ends = ends[used:] - start
            open_from = int(carry_ends[-1]) + 1 if len(carry_ends) else 0  # where the unfinished line starts
            if len(carry) - open_from <= max_line:
                continue
            # the unfinished line is too long already: the lines before it go, then it is read on, not held
            if len(carry_ends):
                yield _bounded(carry[:open_from], next_line, carry_ends, max_line)
                next_line += len(carry_ends)
            length, rest = _read_past_line(fh, carry[open_from:], read_bytes)
            piece = np.frombuffer(bytes(carry[open_from : open_from + KEPT_OF_LONG_LINE]) + b"\n", np.uint8)
            yield piece, next_line, np.array([len(piece) - 1], np.int64), {0: length}
            next_line += 1
            if rest is None:
                return
            carry, carry_ends = rest, newlines(rest, 0)


def _read_past_line(fh: IO[bytes], start: np.ndarray, read_bytes: int) -> tuple[int, np.ndarray | None]:
    """Read on past the end of a line whose first bytes are ``start``: its length (without its
    newline or a "\r" before it), and what follows its newline (None: the file ended in it)."""
    length = len(start)
    last = int(start[-1]) if len(start) else -1
    scratch = np.empty(read_bytes, dtype=np.uint8)
    while got := _read_into(fh, scratch):
        at = np.flatnonzero(scratch[:got] == 10)
        if len(at):
            k = int(at[0])
            before = int(scratch[k - 1]) if k else last
            return length + k - (before == 13), scratch[k + 1 : got].copy()
        length += got
        last = int(scratch[got - 1])
    return length - (last == 13), None


def _bounded(data: np.ndarray, first_line: int, ends: np.ndarray, max_line: int) -> LineBlock:
    """A block with its lines longer than ``max_line`` cut to their first :data:`KEPT_OF_LONG_LINE`
    bytes (rare: the block is copied only where it has one)."""
    starts, stops = _line_bounds(data, ends)
    long = np.flatnonzero(stops - starts > max_line)
    if not len(long):
        return data, first_line, ends, {}
    keep = np.ones(len(data), dtype=bool)
    for i in long.tolist():  # (its "\r" too: a long line is kept as its start and a newline, however it ended)
        keep[int(starts[i]) + KEPT_OF_LONG_LINE : int(ends[i])] = False
    cut = data[keep]
    new_ends = np.flatnonzero(cut == 10)
    return cut, first_line, new_ends, {int(i): int(stops[i] - starts[i]) for i in long}


#: Bytes searched for newlines at a time by :func:`_newlines` (a mask the size of a whole read
#: costs 64 MiB, and the kernel's time to map it).
_NEWLINE_SLICE = 1 << 22


def _newlines(buf: np.ndarray, offset: int) -> np.ndarray:
    """Where ``buf``'s newlines are, plus ``offset``: numpy, slice by slice (the compiled
    :func:`forensics.ingestion.fast.jsonlines.newlines` does the same in one pass)."""
    found = [np.flatnonzero(buf[a : a + _NEWLINE_SLICE] == 10) + (a + offset)
             for a in range(0, len(buf), _NEWLINE_SLICE)]
    return np.concatenate(found) if found else np.empty(0, np.int64)


def _read_into(fh: IO[bytes], out: np.ndarray) -> int:
    """Fill ``out`` from ``fh`` as far as the stream goes: the number of bytes read."""
    got = 0
    while got < len(out):
        n = fh.readinto(out[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def _line_bounds(buf: np.ndarray, ends: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each newline-terminated line of ``buf`` starts and stops, its "\\r\\n" or "\\n" left out;
    ``ends``, where the reader found the newlines."""
    if ends is None:
        ends = np.flatnonzero(buf == 10)
    starts = np.empty_like(ends)
    starts[0:1] = 0
    starts[1:] = ends[:-1] + 1
    cr = np.zeros(len(ends), dtype=bool)
    nonempty = ends > starts
    cr[nonempty] = buf[ends[nonempty] - 1] == 13
    return starts, ends - cr
