"""The case's copy of every input file's text, line by line: each record's verbatim line.

Ingest keeps each text file (JSON Lines, CSV, an engine log) in ``source_lines``: pieces of
about :data:`PIECE_BYTES` of whole lines as read, each a zstd frame, with the number of its
first line and how many lines it holds. A string per record cost the ingest more than any other
column (bench/README.md); a piece of a thousand lines costs one compression, on the threads that
read ahead. A Parquet file has no lines: its records' text is the JSON the reader made of each
row (``doc``). :func:`texts` reads lines back.
"""

from __future__ import annotations

import csv
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial

import duckdb
import numpy as np
import pyarrow as pa
import zstandard

from forensics.store import scan

#: About how much text (uncompressed) one row of ``source_lines`` holds: reading one line back
#: decompresses its piece (about a millisecond).
PIECE_BYTES = 1 << 20
#: About how many bytes of frames go into ``source_lines`` in one statement while a file is read.
STORE_BYTES = 32 << 20
#: zstd level 1: about 1 GB/s on logs; higher levels gain little on them.
LEVEL = 1

#: A piece: the number of its first line, how many lines it holds, the zstd frame of their text.
Piece = tuple[int, int, bytes]

#: Where a line ends in a file read as text (CSV, engine logs): as Python's universal newlines.
_TEXT_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)")


def pieces(data: bytes | np.ndarray, first_line: int, ends: np.ndarray,
           compressor: zstandard.ZstdCompressor | None = None) -> list[Piece]:
    """The lines of ``data`` (JSON Lines; the newline of each at ``ends``, the last at its end),
    numbered from ``first_line``, in pieces of about :data:`PIECE_BYTES` (``compressor``: one to
    use again, for many small files in one thread; a new one costs as much as 8 KB compressed)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if not len(ends):
        return []
    compressor = compressor or zstandard.ZstdCompressor(level=LEVEL)
    if int(ends[-1]) < PIECE_BYTES:  # (one piece: most files' blocks, all of a small file's)
        return [(first_line, len(ends), compressor.compress(buf[: int(ends[-1]) + 1].data))]
    # each piece ends at the first line end at or past a multiple of PIECE_BYTES
    marks = np.arange(PIECE_BYTES - 1, int(ends[-1]) + PIECE_BYTES, PIECE_BYTES)
    lasts = np.unique(np.minimum(np.searchsorted(ends, marks), len(ends) - 1))
    out: list[Piece] = []
    start_byte = start_line = 0
    for last in lasts.tolist():
        stop = int(ends[last]) + 1
        frame = compressor.compress(buf[start_byte:stop].data)
        out.append((first_line + start_line, last + 1 - start_line, frame))
        start_byte, start_line = stop, last + 1
    return out


def text_pieces(lines: Iterable[str]) -> Iterator[Piece]:
    """A text file's lines (each with its line end, as Python reads text with ``newline=""``;
    invalid UTF-8 as surrogate escapes), numbered from 1, in pieces."""
    compressor = zstandard.ZstdCompressor(level=LEVEL)
    first = 1
    for group in _groups(lines):
        yield first, len(group), compressor.compress("".join(group).encode("utf-8", "surrogateescape"))
        first += len(group)


def _groups(lines: Iterable[str]) -> Iterator[list[str]]:
    """The lines in groups of about :data:`PIECE_BYTES`, each line ending with its line end."""
    held: list[str] = []
    size = 0
    for line in lines:
        if not line.endswith(("\n", "\r")):
            line += "\n"  # the file's last line: every line in a piece ends
        held.append(line)
        size += len(line)
        if size >= PIECE_BYTES:
            yield held
            held, size = [], 0
    if held:
        yield held


class Store:
    """Files' pieces on their way to ``source_lines``: held until about :data:`STORE_BYTES` of
    frames wait, then inserted in one statement (a file's pieces are never all held at once);
    :meth:`flush` inserts the rest."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.batch: list[tuple[int, Piece]] = []
        self.size = 0

    def add(self, file_id: int, pieces: Iterable[Piece]) -> None:
        """Keep the pieces of file ``file_id`` (inserting what waits once it is enough)."""
        for piece in pieces:
            self.batch.append((file_id, piece))
            self.size += len(piece[2])
            if self.size >= STORE_BYTES:
                self.flush()

    def flush(self) -> None:
        """Insert what waits."""
        if not self.batch:
            return
        batch = self.batch
        table = pa.table({
            "file_id": pa.array([f for f, _ in batch], pa.int32()),
            "first_line": pa.array([p[0] for _, p in batch], pa.int64()),
            "line_count": pa.array([p[1] for _, p in batch], pa.int32()),
            "text": pa.array([p[2] for _, p in batch], pa.binary()),
        })
        scan(self.con, table, "source_pieces", "INSERT INTO source_lines SELECT * FROM source_pieces")
        self.batch, self.size = [], 0


def store(con: duckdb.DuckDBPyConnection, file_id: int, kept: Iterable[Piece]) -> None:
    """Keep pieces of a file in ``source_lines`` (:class:`Store`)."""
    stored = Store(con)
    stored.add(file_id, kept)
    stored.flush()


def texts(con: duckdb.DuckDBPyConnection, keys: str) -> pa.Table:
    """The verbatim text of the records at ``keys`` (a relation with ``file_id, line_no``), as
    ``(file_id, line_no, text)``: the line without its line end; a CSV row that goes on over more
    lines, with them. Lines of files the case holds no text of (Parquet) are left out."""
    rows = con.execute(
        f"""
        SELECT s.file_id, any_value(f.format), s.first_line, any_value(s.text),
               list(DISTINCT k.line_no ORDER BY k.line_no)
        FROM source_lines s JOIN files f USING (file_id)
        JOIN (SELECT DISTINCT file_id, line_no FROM {keys}) k
          ON k.file_id = s.file_id AND k.line_no >= s.first_line AND k.line_no < s.first_line + s.line_count
        GROUP BY s.file_id, s.first_line ORDER BY s.file_id, s.first_line
        """
    ).fetchall()
    out: dict[str, list[object]] = {"file_id": [], "line_no": [], "text": []}
    decompressor = zstandard.ZstdDecompressor()
    for file_id, fmt, first_line, frame, wanted in rows:
        piece = decompressor.decompress(frame).decode("utf-8", "surrogateescape")
        # JSON Lines end at newlines only; CSV and engine logs, read as text, at "\r" too
        lines = piece.split("\n") if fmt == "jsonl" else _TEXT_LINE.findall(piece)
        for line_no in wanted:
            at = line_no - first_line
            if fmt == "csv":
                text = _csv_row(lines, at, partial(_more_lines, con, file_id, first_line + len(lines)))
            elif fmt == "jsonl":  # as the reader cuts a line: its newline and one carriage return
                text = lines[at].removesuffix("\r")
            else:
                text = lines[at].rstrip("\r\n")
            out["file_id"].append(file_id)
            out["line_no"].append(line_no)
            out["text"].append(text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))
    return pa.table(out, schema=pa.schema([("file_id", pa.int32()), ("line_no", pa.int64()), ("text", pa.string())]))


def _csv_row(lines: list[str], at: int, more: Callable[[], Iterator[str]]) -> str:
    """The CSV row that starts at ``lines[at]`` (each with its line end), whole: a quoted cell may
    hold line ends, and the row then goes on over the next lines (past the piece, from ``more()``)."""
    taken: list[str] = []

    def counted() -> Iterator[str]:
        for line in itertools.chain(lines[at:], more()):
            taken.append(line)
            yield line

    next(csv.reader(counted()), None)
    return "".join(taken).rstrip("\r\n")


def _more_lines(con: duckdb.DuckDBPyConnection, file_id: int, from_line: int) -> Iterator[str]:
    """The file's lines from ``from_line`` on, piece by piece (a CSV row that crosses a piece)."""
    decompressor = zstandard.ZstdDecompressor()
    while True:
        row = con.execute(
            "SELECT first_line, text FROM source_lines WHERE file_id = ? AND first_line = ?", [file_id, from_line]
        ).fetchall()
        if not row:
            return
        lines = _TEXT_LINE.findall(decompressor.decompress(row[0][1]).decode("utf-8", "surrogateescape"))
        yield from lines
        from_line += len(lines)


__all__ = ["LEVEL", "PIECE_BYTES", "Piece", "pieces", "store", "text_pieces", "texts"]
