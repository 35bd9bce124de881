"""A file's records as Arrow tables of lines, a chunk at a time (JSON Lines, CSV, Parquet, or an
engine log through its adapter), and its text for ``source_lines``: the path off the fast path."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import itertools
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forensics import adapters
from forensics.adapters.base import LINES_SCHEMA, UNREADABLE_MARK
from forensics.errors import UnreadableFile
from forensics.ingestion import source
from forensics.ingestion.readers.discovery import companions
from forensics.ingestion.readers.lines import (
    _line_blocks,
    _line_bounds,
    _long_details,
    bounded_lines,
    long_line_detail,
    text_lines,
)
from forensics.ingestion.readers.logfile import KEPT_OF_LONG_LINE, Limits, LogFile
from forensics.ingestion.readers.opening import _decoding, open_binary
from forensics.schema import integer_fields
from forensics.text import shown

CHUNK_BYTES = 32 << 20
_INT_CELL = re.compile(r"-?(0|[1-9][0-9]*)")


def read_chunks(
    log: LogFile,
    options: adapters.Options | None = None,
    notes: adapters.Notes | None = None,
    on_ignored: Callable[[int], None] | None = None,
) -> Iterator[pa.Table]:
    """The file's records as Arrow tables of (line_no, part, raw, doc), a chunk at a time.

    A file an adapter reads comes translated: ``doc`` holds the canonical record.
    """
    with _decoding(log):
        if log.adapter != "canonical":
            adapter = adapters.get(log.adapter)
            assert adapter.translate is not None
            options = options or adapters.Options()
            long_lines: dict[int, int] = {}
            outcomes = adapter.translate(text_lines(log, long_lines), log.path, options,
                                         notes if notes is not None else adapters.Notes(), companions(log, options))
            yield from adapters.chunks(_long_unreadable(outcomes, long_lines, log.limits),
                                       options.node_for(log.path), on_ignored or (lambda n: None))
        elif log.format == "jsonl":
            yield from _jsonl_chunks(log)
        elif log.format == "csv":
            yield from _csv_chunks(log)
        else:
            yield from _parquet_chunks(log)


def _long_unreadable(outcomes: Iterator[adapters.Outcome], long_lines: dict[int, int],
                     limits: Limits) -> Iterator[adapters.Outcome]:
    """An adapter's outcomes, each line too long to read (whatever the adapter made of its start)
    quarantined as unreadable."""
    for line_no, raw, result in outcomes:
        length = long_lines.get(line_no)
        yield (line_no, raw, result) if length is None else (
            line_no, raw, adapters.Unreadable(long_line_detail(length, limits)))


def _jsonl_chunks(log: LogFile) -> Iterator[pa.Table]:
    for data, first_line, ends, long in _line_blocks(log, None, CHUNK_BYTES):
        yield _lines_table(data, first_line, ends, _long_details(long, log.limits))


def source_pieces(log: LogFile) -> Iterator[source.Piece]:
    """A file's text for ``source_lines``, read apart from its records: for files off the fast path
    (whose blocks bring their text). Lines are numbered as the file's reader numbers them. A
    Parquet file has no lines."""
    if log.format == "parquet":
        return
    with _decoding(log):
        if log.adapter == "canonical" and log.format == "jsonl":
            for data, first_line, ends, _ in _line_blocks(log, None, CHUNK_BYTES):
                yield from source.pieces(data, first_line, ends)
        else:  # CSV and engine logs are read as text, which ends lines at "\r" too
            with open_binary(log) as fh:
                lines = (raw.decode("utf-8", "surrogateescape")
                         for raw, _ in bounded_lines(fh, log.limits.max_line_bytes))
                first = next(lines, None)
                if first is not None:
                    yield from source.text_pieces(itertools.chain([first.removeprefix("\ufeff")], lines))


def _lines_table(data: bytes | np.ndarray, first_line: int, ends: np.ndarray | None = None,
                 unreadable: dict[int, str] | None = None) -> pa.Table:
    """Every newline-terminated line of ``data``, numbered from ``first_line`` (``unreadable``:
    lines by index that are quarantined as unreadable, and why)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if ends is None:
        ends = np.flatnonzero(buf == 10)
    starts, stops = _line_bounds(buf, ends)
    # the lines end to end: every byte up to the last newline but the terminators ("\r\n" or "\n")
    covered = int(ends[-1]) + 1 if len(ends) else 0
    keep = np.ones(covered, dtype=bool)
    keep[ends] = False
    keep[stops[stops < ends]] = False
    offsets = np.concatenate([[0], np.cumsum(stops - starts)]).astype(np.int64)
    return _lines_table_of(data, buf[:covered][keep], offsets, starts, stops, first_line, unreadable=unreadable)


def _lines_of(
    data: bytes | np.ndarray, rows: np.ndarray, starts: np.ndarray, stops: np.ndarray, first_line: int,
    unreadable: dict[int, str] | None = None,
) -> pa.Table:
    """The lines ``rows`` of ``data`` as a chunk for the validator; lines that are not UTF-8 kept escaped."""
    from forensics.ingestion.fast import jsonlines

    buf = np.frombuffer(data, dtype=np.uint8)
    offsets, text = jsonlines.gather(buf, rows, starts, stops)
    return _lines_table_of(data, text, offsets, starts[rows], stops[rows], first_line, rows, unreadable)


def _lines_table_of(data: bytes | np.ndarray, text: np.ndarray, offsets: np.ndarray, starts: np.ndarray,
                    stops: np.ndarray, first_line: int, rows: np.ndarray | None = None,
                    unreadable: dict[int, str] | None = None) -> pa.Table:
    """Lines (their ``text`` end to end at ``offsets``; ``starts``/``stops`` in ``data``) as a chunk
    for the validator, numbered from ``first_line`` (``rows``: their indices, else 0, 1, ...;
    ``unreadable``: indices of lines quarantined as unreadable, and why)."""
    n = len(starts)
    numbers = (np.arange(n) if rows is None else rows) + first_line
    lines = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        lines = _decode_lossless(data, starts, stops)
    docs = pa.nulls(n, pa.large_string())
    if unreadable:
        indices = np.arange(n) if rows is None else rows
        docs = pa.array([None if (why := unreadable.get(int(i))) is None else UNREADABLE_MARK + why
                         for i in indices.tolist()], pa.large_string())
    table = pa.table(
        {"line_no": numbers, "part": np.zeros(n, dtype=np.int16), "raw": lines, "doc": docs},
        schema=LINES_SCHEMA,
    )
    return batched(table)


def batched(table: pa.Table, rows: int = 32_768) -> pa.Table:
    """The table in batches small enough that DuckDB scans it on every core."""
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), schema=table.schema)


def _decode_lossless(data: bytes | np.ndarray, starts: np.ndarray, stops: np.ndarray) -> pa.Array:
    """Lines of a chunk with invalid UTF-8: bad lines kept with escapes, so they fail as not JSON."""
    out: list[str] = []
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        piece = bytes(data[a:b])
        try:
            out.append(piece.decode("utf-8"))
        except UnicodeDecodeError:
            # a NUL prefix can never start valid JSON, so the line is quarantined verbatim-escaped
            out.append("\x00" + piece.decode("utf-8", "backslashreplace"))
    return pa.array(out, pa.large_string())


def _csv_cell(name: str, value: str, ints: frozenset[str]) -> Any:
    if name in ints and _INT_CELL.fullmatch(value):
        return int(value)
    return value


def _csv_chunks(log: LogFile) -> Iterator[pa.Table]:
    """A CSV file's rows as records. A row that cannot be read (not UTF-8, a line too long, the
    wrong number of cells, a cell past the longest line) is quarantined as unreadable; the file
    goes on."""
    ints = integer_fields()
    limits = log.limits
    with open_binary(log) as fh:
        consumed: list[tuple[int, str]] = []
        trouble: dict[int, str] = {}  # line -> why it cannot be read

        def lines() -> Iterator[str]:
            for line_no, (raw, length) in enumerate(bounded_lines(fh, limits.max_line_bytes), 1):
                if line_no == 1:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    line = raw.decode("utf-8", "backslashreplace")
                    trouble[line_no] = f"not valid UTF-8 (a byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
                if length is not None:
                    trouble[line_no] = long_line_detail(length, limits)
                consumed.append((line_no, line))
                yield line

        reader = csv.reader(lines())
        csv.field_size_limit(max(limits.max_line_bytes, 1 << 17))
        header = _csv_row(reader)
        if header is None:
            return
        if isinstance(header, str) or trouble:
            raise UnreadableFile(f"{shown(log.path)}: its CSV header cannot be read "
                                 f"({header if isinstance(header, str) else next(iter(trouble.values()))})")
        header = [h.strip() for h in header]
        rows: dict[str, list[Any]] = {"line_no": [], "part": [], "raw": [], "doc": []}
        consumed.clear()
        trouble.clear()
        while (cells := _csv_row(reader)) is not None:
            first_no = consumed[0][0]
            raw = "".join(line for _, line in consumed).rstrip("\r\n")
            why = next((trouble[n] for n, _ in consumed if n in trouble), None)
            consumed.clear()
            trouble.clear()
            if why is None and isinstance(cells, str):
                why = cells
            if why is None and not raw.strip():
                continue
            if why is None and len(cells) != len(header):
                why = f"a CSV row of {len(cells)} cells, its header has {len(header)}"
            if why is not None:
                doc = UNREADABLE_MARK + why
            else:
                record = {h: _csv_cell(h, c, ints) for h, c in zip(header, cells, strict=True) if c != ""}
                doc = json.dumps(record, ensure_ascii=False)
            rows["line_no"].append(first_no)
            rows["part"].append(0)
            rows["raw"].append(raw)
            rows["doc"].append(doc)
            if len(rows["raw"]) >= 200_000:
                yield pa.table(rows, schema=LINES_SCHEMA)
                rows = {"line_no": [], "part": [], "raw": [], "doc": []}
        if rows["raw"]:
            yield pa.table(rows, schema=LINES_SCHEMA)


def _csv_row(reader: Iterator[list[str]]) -> list[str] | str | None:
    """The next row's cells; why it cannot be read (a cell past the field limit, a NUL); None at the end."""
    try:
        return next(reader)
    except StopIteration:
        return None
    except csv.Error as exc:
        return f"not readable as CSV ({exc})"


def _json_value(value: Any) -> Any:
    """A Parquet value JSON has no type for, as JSON: times as RFC 3339 text, other values as text
    (which the validator then quarantines as the wrong type, if the field is one it knows)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() and value.is_finite() else str(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    return str(value)  # durations, intervals and whatever else Arrow holds


def _parquet_chunks(log: LogFile) -> Iterator[pa.Table]:
    limits = log.limits
    with open_binary(log) as fh:
        parquet = pq.ParquetFile(io.BytesIO(fh.read()) if log.compression != "none" else fh)
        row = 0
        for batch in parquet.iter_batches(batch_size=10_000):
            raws, docs = [], []
            for rec in batch.to_pylist():
                doc = json.dumps({k: v if isinstance(v, str | int | float | bool | list | dict) else _json_value(v)
                                  for k, v in rec.items() if v is not None},
                                 ensure_ascii=False, default=_json_value)
                if len(doc) > limits.max_line_bytes:
                    raws.append(doc[:KEPT_OF_LONG_LINE])
                    docs.append(UNREADABLE_MARK + long_line_detail(len(doc), limits).replace("a line", "a row"))
                else:
                    raws.append(doc)
                    docs.append(doc)
            numbers = np.arange(row + 1, row + 1 + len(docs), dtype=np.int64)
            row += len(docs)
            yield pa.table({"line_no": numbers, "part": np.zeros(len(docs), dtype=np.int16), "raw": raws,
                            "doc": docs}, schema=LINES_SCHEMA)
