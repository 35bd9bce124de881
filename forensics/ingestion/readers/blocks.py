"""The fast path's split of plain JSON lines into typed blocks: a file's block at a time, or many
small files split as one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from forensics.ingestion import source
from forensics.ingestion.readers.lines import _line_bounds, _long_details
from forensics.ingestion.readers.logfile import Limits
from forensics.ingestion.readers.tables import _lines_of


@dataclass(frozen=True)
class Block:
    """Part of a file's records: plain lines read typed by the fast path, the others as lines."""

    #: the plain lines of each kind, for validate.plain_stage_sql: in the order of schema.KINDS,
    #: then None for a kind the schema does not know; each kind's rows in file order
    kinds: tuple[tuple[str | None, pa.Table], ...]
    lines: pa.Table  # LINES_SCHEMA, for validate.stage_sql
    nbytes: int  # how much of the file (decompressed) the block covers
    text: tuple[source.Piece, ...] = ()  # the fast path: the block's lines for ``source_lines``

    @property
    def plain_rows(self) -> int:
        """How many plain lines it holds."""
        return sum(rows.num_rows for _, rows in self.kinds)


#: A small file's bytes as one block, to be split with other files' (:func:`_split_files`, which
#: finds where their lines end, for them all at once): its bytes (decompressed, ending with a
#: newline), and its lines too long to read (index: length), which it holds the start of.
WholeBlock = tuple[np.ndarray, dict[int, int]]


def _split_files(blocks: Sequence[WholeBlock], limits: Sequence[Limits]) -> FilesSplit:
    """Small files, a block each (with each file's limits), split as one block: each file's
    rows as :func:`_split` gives them, numbered by its own lines, kept together file by file."""
    from forensics.ingestion.fast import jsonlines

    data = np.concatenate([block[0] for block in blocks])
    byte_at = np.cumsum([0, *(len(block[0]) for block in blocks)])
    ends = jsonlines.newlines(data, 0)  # (each file's block ends with one: the lines of a file are its own)
    line_at = np.searchsorted(ends, byte_at)
    unreadable = {int(line_at[i]) + k: why for i, (block, limit) in enumerate(zip(blocks, limits, strict=True))
                  if block[1] for k, why in _long_details(block[1], limit).items()}
    whole = _split(data, 0, ends, unreadable, with_text=False)  # (numbered by the line's place in data)
    firsts = np.ones(len(blocks), dtype=np.int64)
    kinds = tuple((kind, *_by_file(rows, line_at, firsts)) for kind, rows in whole.kinds)
    lines, lines_at = _by_file(whole.lines, line_at, firsts)
    compressor = zstandard.ZstdCompressor(level=source.LEVEL)
    texts = tuple(tuple(source.pieces(block[0], 1, ends[line_at[i] : line_at[i + 1]] - byte_at[i], compressor))
                  for i, block in enumerate(blocks))
    return FilesSplit(kinds, lines, lines_at, tuple(len(block[0]) for block in blocks), texts,
                      tuple(_plain_rows(kinds, len(blocks))))


def _plain_rows(kinds: Sequence[tuple[str | None, pa.Table, np.ndarray]], files: int) -> list[int]:
    """How many plain lines each of ``files`` files split together holds."""
    rows = np.zeros(files, dtype=np.int64)
    for _, _, at in kinds:
        rows += np.diff(at)
    return [int(n) for n in rows]


@dataclass(frozen=True)
class FilesSplit:
    """Small files split as one (:func:`_split_files`): each table holds the rows of every file,
    file by file, the ``i``-th file's from ``at[i]`` to ``at[i + 1]``. A group of small files goes
    in from these tables as they are (a table a file cost more to put together again than to load)."""

    kinds: tuple[tuple[str | None, pa.Table, np.ndarray], ...]  # as Block.kinds, with where each file's rows start
    lines: pa.Table
    lines_at: np.ndarray
    nbytes: tuple[int, ...]  # each file's
    texts: tuple[tuple[source.Piece, ...], ...]  # each file's lines for ``source_lines``
    plain_rows: tuple[int, ...]  # each file's plain lines

    def block(self, part: int) -> Block:
        """The ``part``-th file's block, as :func:`_split` gives it."""
        mine = tuple((kind, rows.slice(at[part], at[part + 1] - at[part]))
                     for kind, rows, at in self.kinds if at[part + 1] > at[part])
        at = self.lines_at
        return Block(mine, self.lines.slice(at[part], at[part + 1] - at[part]), self.nbytes[part], self.texts[part])


@dataclass(frozen=True)
class FilePart:
    """A small file's rows, as its share of a :class:`FilesSplit`."""

    split: FilesSplit
    part: int

    @property
    def nbytes(self) -> int:
        """How much of the file (decompressed) its rows cover."""
        return self.split.nbytes[self.part]

    @property
    def plain_rows(self) -> int:
        """How many plain lines it holds."""
        return self.split.plain_rows[self.part]


def _by_file(rows: pa.Table, line_at: np.ndarray, firsts: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    """Rows of several files' lines (``line_no``: the line's place among them all, in order; the
    files' lines start at ``line_at``) numbered by their own file's lines (from ``firsts``), and
    where each file's rows start (and the last ends)."""
    numbers = rows.column("line_no").to_numpy()
    at = np.searchsorted(numbers, line_at)
    files = np.repeat(np.arange(len(firsts)), np.diff(at))
    own = numbers - line_at[files] + firsts[files]
    return rows.set_column(rows.schema.get_field_index("line_no"), "line_no", pa.array(own)), at


def _split(data: bytes | np.ndarray, first_line: int, ends: np.ndarray | None = None,
           unreadable: dict[int, str] | None = None, *, with_text: bool = True) -> Block:
    """A block's plain lines, typed, and its other lines (``ends``: where its lines end, if known;
    ``unreadable``: lines by index quarantined as unreadable, and why: never plain; ``with_text``:
    its lines for ``source_lines`` too)."""
    from forensics.ingestion.fast import jsonlines

    buf = np.frombuffer(data, dtype=np.uint8)
    if ends is None:
        ends = jsonlines.newlines(buf, 0)
    starts, stops = _line_bounds(buf, ends)
    text = tuple(source.pieces(buf, first_line, ends)) if with_text else ()
    if len(data) >= 2**31:  # the fast path keeps offsets in int32
        return Block((), _lines_of(data, np.arange(len(starts)), starts, stops, first_line, unreadable),
                     len(data), text)
    plain, kinds = jsonlines.plain_columns(buf, starts, stops)
    if unreadable and plain[list(unreadable)].any():  # the start of a long line can be a record itself
        plain, kinds = _not_plain(plain, kinds, list(unreadable))
    parts = tuple(
        (kind, pa.table({"line_no": rows + first_line, "part": np.zeros(len(rows), dtype=np.int16), **cols}))
        for kind, rows, cols in kinds
    )
    others = _lines_of(data, np.flatnonzero(~plain), starts, stops, first_line, unreadable)
    return Block(parts, others, len(data), text)


def _viewless(values: pa.Array) -> pa.Array:
    """String views as strings (Arrow takes no rows of a view array)."""
    return values.cast(pa.large_string()) if values.type == pa.string_view() else values


def _not_plain(plain: np.ndarray, kinds: Any, rows: list[int]) -> tuple[np.ndarray, Any]:
    """The fast path's split with ``rows`` taken out of the plain lines."""
    plain = plain.copy()
    plain[rows] = False
    out = []
    for kind, kind_rows, cols in kinds:
        keep = ~np.isin(kind_rows, rows)
        out.append((kind, kind_rows[keep], {k: _viewless(v).filter(pa.array(keep)) for k, v in cols.items()}))
    return plain, out
