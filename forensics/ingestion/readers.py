"""Finding log files and reading them as numbered lines, whatever their format and compression."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import gzip
import io
import json
import os
import queue
import re
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forensics import adapters, compiled
from forensics.adapters.base import LINES_SCHEMA
from forensics.errors import InputNotFound, UnreadableFile, UnrecognisedFile
from forensics.ingestion import source
from forensics.schema import integer_fields

CHUNK_BYTES = 32 << 20
#: DuckDB's row group. Rows inserted in whole groups are written straight to the case file; an
#: insert of part of a group waits in the transaction and goes through the write-ahead log at
#: commit, which costs about as much again.
ROW_GROUP = 122_880
#: JSON Lines for the fast path come in blocks of whole row groups (the next block splits while
#: this one loads), read this much at a time; lines too long for that are cut at this size.
PLAIN_BLOCK_LINES = 2 * ROW_GROUP
PLAIN_READ_BYTES = 64 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PARQUET_MAGIC = b"PAR1"
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_INT_CELL = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class LogFile:
    """A file to ingest: where it is and how to decode it."""

    path: Path
    format: str  # jsonl, csv or parquet; or "text" for a file an adapter translates
    compression: str  # none, gzip or zstd
    adapter: str = "canonical"  # the adapter that reads it (forensics.adapters)
    fast: bool = True  # whether its plain JSON lines may take the compiled fast path


#: Plain JSON lines take the compiled fast path (with ``fast=None``) where their files add up to
#: this much: below, the SQL validator is quicker than compiling it, and even than loading its
#: cached machine code (the sample's whole job: 9.7 s so, 11.1 s with the fast path cached).
FAST_FROM_BYTES = 32 << 20


def discover(
    paths: list[Path], adapter: str | None = None, *, fast: bool | None = None
) -> tuple[list[LogFile], list[Path]]:
    """Files to ingest under ``paths``, in a stable order, and the files passed over.

    A file named explicitly must be a log file; inside folders, files of other kinds
    (READMEs, checksums) are passed over and listed. Each file's format is recognised from
    its name and first lines, or is ``adapter`` where one is forced (``--format``); ``fast``
    says whether plain JSON lines may take the compiled fast path (None: where they add up to
    :data:`FAST_FROM_BYTES`). Either path gives the same records.
    """
    found: list[LogFile] = []
    skipped: list[Path] = []
    for path in paths:
        if not path.exists():
            raise InputNotFound(f"{path}: no such file or folder")
        if path.is_dir():
            for child in sorted(p for p in path.rglob("*") if p.is_file()):
                if any(part.startswith(".") for part in child.relative_to(path).parts):
                    continue
                log = identify(child, explicit=False, adapter=adapter)
                if log is None:
                    skipped.append(child)
                else:
                    found.append(log)
        else:
            log = identify(path, explicit=True, adapter=adapter)
            if log is None:
                raise UnrecognisedFile(
                    f"{path}: not a log file this tool reads (canonical JSON Lines, CSV or Parquet, "
                    f"or an engine log an adapter recognises: {', '.join(adapters.ADAPTERS)}; "
                    "optionally .gz or .zst); name one with --format"
                )
            found.append(log)
    if fast is None:  # the fast path where it pays: loading its machine code alone takes a second
        plain = [log for log in found if log.adapter == "canonical" and log.format == "jsonl"]
        fast = sum(log.path.stat().st_size for log in plain) >= FAST_FROM_BYTES
    if not fast:
        found = [dataclasses.replace(log, fast=False) for log in found]
    elif any(fast_path(log) for log in found):
        compiled.announce("reader")
    return found, skipped


def identify(path: Path, *, explicit: bool, adapter: str | None = None) -> LogFile | None:
    """The format and compression of a file, from its name and first bytes; None if neither fits.

    A file named explicitly whose name says nothing is taken as JSON Lines if it starts with ``{``.
    JSON Lines that are not canonical records, and files with other names (``.log``, ``.txt``,
    none), are offered to the adapters' sniffs; ``adapter`` forces one.
    """
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise UnreadableFile(f"{path}: cannot be read ({exc.strerror})") from exc
    suffixes = [s.lower() for s in path.suffixes]
    compression = "none"
    if head.startswith(_GZIP_MAGIC):
        compression = "gzip"
    elif head.startswith(_ZSTD_MAGIC):
        compression = "zstd"
    elif suffixes and suffixes[-1] in _COMPRESSIONS:
        compression = _COMPRESSIONS[suffixes[-1]]
    if suffixes and suffixes[-1] in _COMPRESSIONS:
        suffixes = suffixes[:-1]
    fmt = _FORMATS.get(suffixes[-1]) if suffixes else None
    if head.startswith(_PARQUET_MAGIC):
        fmt = "parquet"
    if adapter is not None and adapter != "canonical":
        return LogFile(path, "text", compression, adapters.get(adapter).name)
    if adapter == "canonical":
        if fmt is None and head[:1] in (b"{", b"\xef"):
            fmt = "jsonl"
        return LogFile(path, fmt, compression) if fmt is not None else None
    if fmt == "jsonl" or (fmt is None and (explicit or adapters.log_like(path))):
        found = adapters.sniff(_head(LogFile(path, "text", compression)))
        if found is not None and found.name != "canonical":
            return LogFile(path, "text", compression, found.name)
        if found is not None and fmt is None:
            fmt = "jsonl"
    if fmt is None and explicit and compression == "none" and head[:1] in (b"{", b"\xef"):
        fmt = "jsonl"
    if fmt is None:
        return None
    return LogFile(path, fmt, compression)


def _head(log: LogFile) -> list[str]:
    """The first lines of a file, decompressed, for the adapters' sniffs."""
    try:
        with open_binary(log) as fh:
            data = fh.read(1 << 20)
    except (OSError, EOFError, ValueError):
        return []
    return data.decode("utf-8", "replace").splitlines()[: adapters.SNIFF_LINES]


def text_lines(log: LogFile) -> adapters.Lines:
    """The file's non-blank lines as ``(line_no, text)``, from the start at every call."""

    def lines() -> Iterator[tuple[int, str]]:
        with open_binary(log) as fh:
            text = io.TextIOWrapper(fh, encoding="utf-8", errors="backslashreplace")
            for line_no, line in enumerate(text, 1):
                line = line.rstrip("\r\n")
                if line.strip():
                    yield line_no, line

    return lines


def source_pieces(log: LogFile) -> Iterator[source.Piece]:
    """A file's text for ``source_lines``, read apart from its records: for files off the fast path
    (whose blocks bring their text). Lines are numbered as the file's reader numbers them. A
    Parquet file has no lines."""
    if log.format == "parquet":
        return
    with _decoding(log):
        if log.adapter == "canonical" and log.format == "jsonl":
            for data, first_line, ends in _line_blocks(log, None, CHUNK_BYTES):
                yield from source.pieces(data, first_line, ends)
        else:  # CSV and engine logs are read as text, which ends lines at "\r" too
            with io.TextIOWrapper(open_binary(log), encoding="utf-8-sig", errors="surrogateescape", newline="") as text:
                yield from source.text_pieces(text)


class _AsOpened(io.RawIOBase):
    """A file read no further than the size it had when opened: a log still written to (a live
    log) ends where it ended then, and the ingest finds it changed, rather than reading on forever."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("rb", buffering=0)
        self._size = os.fstat(self._fh.fileno()).st_size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            return self._fh.seek(self._size + offset)
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)[: max(0, self._size - self._fh.tell())]
        return (self._fh.readinto(view) or 0) if len(view) else 0

    def close(self) -> None:
        self._fh.close()
        super().close()


def open_binary(log: LogFile) -> IO[bytes]:
    """The file's decompressed bytes as a stream, up to the size the file had when opened."""
    raw = io.BufferedReader(_AsOpened(log.path))
    if log.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if log.compression == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    return raw


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
            outcomes = adapter.translate(text_lines(log), log.path, options,
                                         notes if notes is not None else adapters.Notes())
            yield from adapters.chunks(outcomes, options.node_for(log.path), on_ignored or (lambda n: None))
        elif log.format == "jsonl":
            yield from _jsonl_chunks(log)
        elif log.format == "csv":
            yield from _csv_chunks(log)
        else:
            yield from _parquet_chunks(log)


@contextmanager
def _decoding(log: LogFile) -> Iterator[None]:
    """A file that fails to decode (bad compression, not its format) raises UnreadableFile."""
    try:
        yield
    except (OSError, EOFError, ValueError, pa.ArrowException) as exc:
        if isinstance(exc, UnreadableFile):
            raise
        raise UnreadableFile(f"{log.path}: cannot be decoded as {log.format} ({exc})") from exc


def _jsonl_chunks(log: LogFile) -> Iterator[pa.Table]:
    for data, first_line, ends in _line_blocks(log, None, CHUNK_BYTES):
        yield _lines_table(data, first_line, ends)


def _line_blocks(
    log: LogFile, lines: int | None, read_bytes: int
) -> Iterator[tuple[np.ndarray, int, np.ndarray]]:
    """The file's bytes in blocks of whole lines, each ending with a newline, with its first
    line's number and where its lines end.

    With ``lines``, each block but the last has exactly that many lines, unless they would take
    more than ``read_bytes``; without it, each read's whole lines make a block. The file is read
    into numpy buffers and the blocks are views of them: no copy but the few lines carried from
    one read to the next.
    """
    newlines: Callable[[np.ndarray, int], np.ndarray] = _newlines
    if log.fast:
        from forensics.ingestion.fast import jsonlines

        newlines = jsonlines.newlines
    next_line = 1
    carry = np.empty(0, dtype=np.uint8)
    carry_ends = np.empty(0, dtype=np.int64)  # where the lines in ``carry`` end
    with open_binary(log) as fh:
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
                    yield data, next_line, carry_ends
                return
            ends = np.concatenate([carry_ends, newlines(data[len(carry):], len(carry))])
            start, used = 0, 0
            for last in range(lines - 1, len(ends), lines) if lines else ():
                stop = int(ends[last]) + 1
                yield data[start:stop], next_line, ends[used : last + 1] - start
                next_line += last + 1 - used
                start, used = stop, last + 1
            if used < len(ends) and (lines is None or len(data) - start > read_bytes):
                stop = int(ends[-1]) + 1  # (with ``lines``: lines too long for a read, cut by size)
                yield data[start:stop], next_line, ends[used:] - start
                next_line += len(ends) - used
                start, used = stop, len(ends)
            carry = data[start:]
            carry_ends = ends[used:] - start


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


def _lines_table(data: bytes | np.ndarray, first_line: int, ends: np.ndarray | None = None) -> pa.Table:
    """Every newline-terminated line of ``data``, numbered from ``first_line``."""
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
    return _lines_table_of(data, buf[:covered][keep], offsets, starts, stops, first_line)


def _lines_of(
    data: bytes | np.ndarray, rows: np.ndarray, starts: np.ndarray, stops: np.ndarray, first_line: int
) -> pa.Table:
    """The lines ``rows`` of ``data`` as a chunk for the validator; lines that are not UTF-8 kept escaped."""
    from forensics.ingestion.fast import jsonlines

    buf = np.frombuffer(data, dtype=np.uint8)
    offsets, text = jsonlines.gather(buf, rows, starts, stops)
    return _lines_table_of(data, text, offsets, starts[rows], stops[rows], first_line, rows)


def _lines_table_of(data: bytes | np.ndarray, text: np.ndarray, offsets: np.ndarray, starts: np.ndarray,
                    stops: np.ndarray, first_line: int, rows: np.ndarray | None = None) -> pa.Table:
    """Lines (their ``text`` end to end at ``offsets``; ``starts``/``stops`` in ``data``) as a chunk
    for the validator, numbered from ``first_line`` (``rows``: their indices, else 0, 1, ...)."""
    n = len(starts)
    numbers = (np.arange(n) if rows is None else rows) + first_line
    lines = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(text))
    try:
        lines.validate(full=True)
    except pa.ArrowInvalid:
        lines = _decode_lossless(data, starts, stops)
    table = pa.table(
        {"line_no": numbers, "part": np.zeros(n, dtype=np.int16), "raw": lines,
         "doc": pa.nulls(n, pa.large_string())},
        schema=LINES_SCHEMA,
    )
    return batched(table)


def batched(table: pa.Table, rows: int = 32_768) -> pa.Table:
    """The table in batches small enough that DuckDB scans it on every core."""
    return pa.Table.from_batches(table.to_batches(max_chunksize=rows), schema=table.schema)


@dataclass(frozen=True)
class Block:
    """Part of a file's records: plain lines read typed by the fast path, the others as lines."""

    #: the plain lines of each kind, for validate.plain_stage_sql: in the order of schema.KINDS,
    #: then None for a kind the schema does not know; each kind's rows in file order
    kinds: tuple[tuple[str | None, pa.Table], ...]
    lines: pa.Table  # LINES_SCHEMA, for validate.stage_sql
    nbytes: int  # how much of the file (decompressed) the block covers
    text: tuple[source.Piece, ...] = ()  # the fast path: the block's lines for ``source_lines``


def fast_path(log: LogFile) -> bool:
    """Whether the file's plain lines take the compiled fast path (canonical JSON Lines)."""
    return log.fast and log.adapter == "canonical" and log.format == "jsonl"


def read_blocks(
    log: LogFile,
    ahead: ReadAhead,
    options: adapters.Options | None = None,
    notes: adapters.Notes | None = None,
    on_ignored: Callable[[int], None] | None = None,
) -> Iterator[Block]:
    """The file's records a block at a time; canonical JSON Lines take the fast path where plain,
    read by ``ahead``, the ingest's reader of its fast-path files (this is the next of them)."""
    if fast_path(log):
        yield from ahead.blocks(log)
    else:
        for chunk in read_chunks(log, options, notes, on_ignored):
            yield Block((), chunk, int(chunk["raw"].nbytes))


#: How much lower (Linux nice) the scheduling priority of the ingest's reader and splitters is.
BACKGROUND_NICE = 10


def background_nice() -> int | None:
    """The nice value :data:`BACKGROUND_NICE` below the calling thread's priority; None where
    nice is not per thread (it is on Linux; elsewhere it would be the whole process's)."""
    if sys.platform != "linux":
        return None
    return min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + BACKGROUND_NICE)


def in_background(nice: int | None) -> None:
    """Run the calling thread at nice value ``nice`` (:func:`background_nice`; None: as it is)."""
    if nice is None:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except OSError:
        pass  # not allowed here (a sandbox): the ingest is only slower


class ReadAhead:
    """The fast-path files of an ingest, read and split in worker threads ahead of their loading.

    One thread reads the files in order (decompressing them) and hands each block to two
    threads that split it (the compiled fast path releases the GIL), while DuckDB loads the
    blocks before it; reading runs on into the next file while this one settles and commits.
    At most ``depth`` blocks wait read and not yet taken: 6 keeps the split threads busy while a
    DuckDB insert finishes on one thread (3 to 6% faster than 3, bench/README.md; 10 was slower).
    The files must be taken in order, each with :meth:`blocks` or :meth:`skip`.

    The reader and the splitters run at a lower scheduling priority than the loader
    (:data:`BACKGROUND_NICE`): they are ahead of it, and DuckDB's inserts are the ingest's
    critical path, so they take the CPU the inserts leave (13% faster on 2 cores, bench/README.md).
    """

    _END = object()

    def __init__(self, logs: Sequence[LogFile], depth: int = 6) -> None:
        self._logs = [log for log in logs if fast_path(log)]
        self._queues: list[queue.Queue[Any]] = [queue.Queue() for _ in self._logs]
        self._taken = 0
        self._passed: set[int] = set()  # files to pass over: the reader stops reading them
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._nice = background_nice()
        self._pool = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="kvf-split", initializer=in_background, initargs=(self._nice,))
        self._reader = threading.Thread(target=self._read, name="kvf-read", daemon=True)
        self._reader.start()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self) -> None:
        in_background(self._nice)
        for index, (log, out) in enumerate(zip(self._logs, self._queues, strict=True)):
            try:
                for data, first_line, ends in _line_blocks(log, PLAIN_BLOCK_LINES, PLAIN_READ_BYTES):
                    while not self._slots.acquire(timeout=0.1):
                        if self._stop.is_set():
                            return
                    if self._stop.is_set():
                        return
                    if index in self._passed:
                        self._slots.release()
                        break
                    out.put(self._pool.submit(_split, data, first_line, ends))
            except BaseException as exc:  # handed to the loader, which says what the file is
                out.put(exc)
            out.put(self._END)

    def _next(self, log: LogFile) -> queue.Queue[Any]:
        assert self._logs[self._taken] is log, "fast-path files are taken in order"
        self._taken += 1
        return self._queues[self._taken - 1]

    def blocks(self, log: LogFile) -> Iterator[Block]:
        """The next file's blocks, split."""
        out = self._next(log)
        with _decoding(log):
            while (item := out.get()) is not self._END:
                if isinstance(item, BaseException):
                    raise item
                self._slots.release()
                yield item.result()

    def next_ready(self) -> bool:
        """Whether the file being taken (with :meth:`blocks`) has its next block split already, or
        no block left: what the loader would wait for is there."""
        if not self._taken:
            return False
        out = self._queues[self._taken - 1]
        with out.mutex:
            if not out.queue:
                return False
            item = out.queue[0]
        return item is self._END or isinstance(item, BaseException) or item.done()

    def skip(self, log: LogFile) -> None:
        """Pass over the next file (already in the case): the reader stops reading it."""
        self._passed.add(self._taken)
        out = self._next(log)
        while (item := out.get()) is not self._END:
            if not isinstance(item, BaseException):
                self._slots.release()
                item.cancel()

    def close(self) -> None:
        """Stop reading, and wait for the threads."""
        self._stop.set()
        self._reader.join()
        self._pool.shutdown(cancel_futures=True)


def _split(data: bytes | np.ndarray, first_line: int, ends: np.ndarray | None = None) -> Block:
    """A block's plain lines, typed, and its other lines (``ends``: where its lines end, if known)."""
    from forensics.ingestion.fast import jsonlines

    buf = np.frombuffer(data, dtype=np.uint8)
    if ends is None:
        ends = jsonlines.newlines(buf, 0)
    starts, stops = _line_bounds(buf, ends)
    text = tuple(source.pieces(buf, first_line, ends))
    if len(data) >= 2**31:  # the fast path keeps offsets in int32
        return Block((), _lines_of(data, np.arange(len(starts)), starts, stops, first_line), len(data), text)
    plain, kinds = jsonlines.plain_columns(buf, starts, stops)
    parts = tuple(
        (kind, pa.table({"line_no": rows + first_line, "part": np.zeros(len(rows), dtype=np.int16), **cols}))
        for kind, rows, cols in kinds
    )
    others = _lines_of(data, np.flatnonzero(~plain), starts, stops, first_line)
    return Block(parts, others, len(data), text)


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
    ints = integer_fields()
    with open_binary(log) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8-sig", errors="strict", newline="")
        consumed: list[tuple[int, str]] = []
        counter = [0]

        def lines() -> Iterator[str]:
            for line in text:
                counter[0] += 1
                consumed.append((counter[0], line))
                yield line

        reader = csv.reader(lines())
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        rows: dict[str, list[Any]] = {"line_no": [], "part": [], "raw": [], "doc": []}
        consumed.clear()
        for cells in reader:
            first_no = consumed[0][0]
            raw = "".join(line for _, line in consumed).rstrip("\r\n")
            consumed.clear()
            if not raw.strip():
                continue
            if len(cells) != len(header):
                doc = f"\x00CSV row has {len(cells)} cells, the header {len(header)}"
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


def _json_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    return value


def _parquet_chunks(log: LogFile) -> Iterator[pa.Table]:
    with open_binary(log) as fh:
        parquet = pq.ParquetFile(io.BytesIO(fh.read()) if log.compression != "none" else fh)
        row = 0
        for batch in parquet.iter_batches(batch_size=100_000):
            docs = [
                json.dumps(
                    {k: _json_value(v) for k, v in rec.items() if v is not None},
                    ensure_ascii=False,
                )
                for rec in batch.to_pylist()
            ]
            numbers = np.arange(row + 1, row + 1 + len(docs), dtype=np.int64)
            row += len(docs)
            yield pa.table({"line_no": numbers, "part": np.zeros(len(docs), dtype=np.int16), "raw": docs,
                            "doc": docs}, schema=LINES_SCHEMA)
