"""Finding log files and reading them as numbered lines, whatever their format and compression."""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import decimal
import gzip
import hashlib
import io
import itertools
import json
import os
import queue
import re
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from forensics import adapters, compiled
from forensics.adapters.base import LINES_SCHEMA, UNREADABLE_MARK
from forensics.errors import BadOption, FileChanged, InputNotFound, UnreadableFile, UnrecognisedFile
from forensics.ingestion import source
from forensics.schema import integer_fields
from forensics.text import path_text, shown

CHUNK_BYTES = 32 << 20
#: DuckDB's row group. Rows inserted in whole groups are written straight to the case file; an
#: insert of part of a group waits in the transaction and goes through the write-ahead log at
#: commit, which costs about as much again.
ROW_GROUP = 122_880
#: JSON Lines for the fast path come in blocks of whole row groups (the next block splits while
#: this one loads), read this much at a time; lines too long for that are cut at this size.
PLAIN_BLOCK_LINES = 2 * ROW_GROUP
PLAIN_READ_BYTES = 64 << 20
#: A file up to this size (as stored) is small: ingest reads it whole and puts it in with the
#: small files around it (forensics.ingestion.pipeline), and the fast path splits it with them.
SMALL_FILE = 1 << 20
#: Small files are split together, up to this many files or bytes at once (a split's fixed cost,
#: 0.75 ms, is everything for a file of 50 lines).
SPLIT_FILES = 512
SPLIT_BYTES = 16 << 20
#: A small file is read this much at a time: a buffer of PLAIN_READ_BYTES cost 0.5 ms a file. A
#: file found small and this large when read whole (:func:`read_small`) has changed since found.
SMALL_READ_BYTES = 2 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PARQUET_MAGIC = b"PAR1"
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
_INT_CELL = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class Limits:
    """How far the reader goes with one file: its bounds on memory and time, set by options."""

    #: The longest line read (``--max-line-bytes``): a longer line is quarantined as unreadable
    #: with its first :data:`KEPT_OF_LONG_LINE` bytes, never held whole in memory.
    max_line_bytes: int = 16 << 20
    #: How many times its own size a compressed file may decompress to (``--max-expansion``); a
    #: file that goes past it (a decompression bomb) is refused. Files decompressing to less than
    #: :data:`EXPANSION_FLOOR` are never refused.
    max_expansion: int = 1000

    def __post_init__(self) -> None:
        if self.max_line_bytes < KEPT_OF_LONG_LINE:
            raise BadOption(f"--max-line-bytes must be at least {KEPT_OF_LONG_LINE}")
        if self.max_expansion < 1:
            raise BadOption("--max-expansion must be at least 1")


#: What is kept of a line longer than :attr:`Limits.max_line_bytes`: its first bytes.
KEPT_OF_LONG_LINE = 4096
EXPANSION_FLOOR = 16 << 20


@dataclass(frozen=True)
class PassedOver:
    """A file inside a folder that is not read, and why; ``refused``: one that could not be read (a
    file or folder the system would not open), which ingest refuses as it does a damaged file,
    unlike what is not a log file."""

    path: str
    why: str
    refused: bool = False

    def as_dict(self) -> dict[str, str]:
        """As JSON-ready data."""
        return {"path": self.path, "why": self.why}


@dataclass(frozen=True)
class LogFile:
    """A file to ingest: where it is and how to decode it."""

    path: Path
    format: str  # jsonl, csv or parquet; or "text" for a file an adapter translates
    compression: str  # none, gzip or zstd
    adapter: str = "canonical"  # the adapter that reads it (forensics.adapters)
    fast: bool = True  # whether its plain JSON lines may take the compiled fast path
    limits: Limits = Limits()
    size: int | None = None  # its size (as stored) when found: whether it is small (:data:`SMALL_FILE`)

    @property
    def small(self) -> bool:
        """Whether the file is small (:data:`SMALL_FILE`): read whole and put in with others.
        The size found is enough (a file that grows on is found changed); without one, it is looked at."""
        if self.size is not None:
            return self.size <= SMALL_FILE
        try:
            return self.path.stat().st_size <= SMALL_FILE
        except OSError:
            return False  # (the reading says why)


#: Plain JSON lines take the compiled fast path (with ``fast=None``) where their files add up to
#: this much: below, the SQL validator is quicker than compiling it, and even than loading its
#: cached machine code (the sample's whole job: 9.7 s so, 11.1 s with the fast path cached).
FAST_FROM_BYTES = 32 << 20


def discover(
    paths: list[Path], adapter: str | None = None, *, fast: bool | None = None, limits: Limits | None = None,
) -> tuple[list[LogFile], list[PassedOver]]:
    """Files to ingest under ``paths``, in a stable order, and the files passed over, with why.

    A file named explicitly must be a regular file and a log file; inside folders, files of other
    kinds (READMEs, checksums) and anything that is not a regular file (a FIFO, a device, a
    socket, a broken link) are passed over and listed. A file or folder the system will not open
    (no permission), named or inside a folder, is passed over as refused: ingest refuses it as it
    does a damaged file. Each file's format is recognised from its name and first lines, or is
    ``adapter`` where one is forced (``--format``); ``fast`` says whether plain JSON lines may take
    the compiled fast path (None: where they add up to :data:`FAST_FROM_BYTES`). Either path gives
    the same records. ``limits``: the reader's bounds.
    """
    found: list[LogFile] = []
    skipped: list[PassedOver] = []
    for path in paths:
        if not os.path.lexists(path):
            raise InputNotFound(f"{shown(path)}: no such file or folder")
        if path.is_dir():
            children, unlisted = _tree(path)
            skipped += unlisted
            looked = [_look_at(child, adapter, limits, explicit=False) for child in children]
        else:
            looked = [_look_at(path, adapter, limits, explicit=True)]
        found += [x for x in looked if isinstance(x, LogFile)]
        skipped += [x for x in looked if isinstance(x, PassedOver)]
    if fast is None:  # the fast path where it pays: loading its machine code alone takes a second
        plain = [log for log in found if log.adapter == "canonical" and log.format == "jsonl"]
        fast = sum(log.path.stat().st_size if log.size is None else log.size for log in plain) >= FAST_FROM_BYTES
    if not fast:
        found = [dataclasses.replace(log, fast=False) for log in found]
    elif any(fast_path(log) for log in found):
        compiled.announce("reader")
    return found, skipped


def _tree(folder: Path) -> tuple[list[Path], list[PassedOver]]:
    """Everything under ``folder`` but its folders (hidden names left out; links to folders listed,
    not followed), in a stable order, and the folders in it that could not be listed, refused."""
    children: list[Path] = []
    unlisted: list[PassedOver] = []

    def refuse(exc: OSError) -> None:
        unlisted.append(PassedOver(path_text(exc.filename), f"a folder that cannot be listed ({exc.strerror})",
                                   refused=True))

    for top, folders, files in os.walk(folder, onerror=refuse):
        inside = Path(top)
        children += [inside / name for name in files if not name.startswith(".")]
        children += [inside / name for name in folders if not name.startswith(".") and (inside / name).is_symlink()]
        folders[:] = [name for name in folders if not name.startswith(".")]
    # (in the paths' own order, their parts': a Python comparison a pair cost 0.25 s for 20,000 files)
    return sorted(children, key=_parts), sorted(unlisted, key=lambda p: p.path)


def _parts(path: Path) -> tuple[str, ...]:
    return path.parts


def _look_at(path: Path, adapter: str | None, limits: Limits | None, *, explicit: bool) -> LogFile | PassedOver:
    """``path`` as a log file to read (within ``limits``), or passed over with why: refused where
    the system will not open it, as a damaged file is; listed where it is no log file or no regular
    file, an error where it was named (``explicit``)."""
    try:
        special, size = _regular(path)
        log = None
        if special is None:
            log = identify(path, explicit=explicit, adapter=adapter, size=size, limits=limits or Limits())
    except UnreadableFile as exc:
        return PassedOver(path_text(path), str(exc).removeprefix(f"{shown(path)}: "), refused=True)
    if special is not None:
        if explicit:
            raise UnreadableFile(f"{shown(path)}: {special}; only regular files are read")
        return PassedOver(path_text(path), special)
    if log is None:
        if explicit:
            raise UnrecognisedFile(
                f"{shown(path)}: not a log file this tool reads (canonical JSON Lines, CSV or Parquet, "
                f"or an engine log an adapter recognises: {', '.join(adapters.ADAPTERS)}; "
                "optionally .gz or .zst); name one with --format"
            )
        return PassedOver(path_text(path), "not a log file")
    return log


def not_regular(path: Path) -> str | None:
    """Why ``path`` is not read, if it is not a regular file (links followed): None if it is one.
    :class:`UnreadableFile` where the system will not even say what it is (no permission)."""
    return _regular(path)[0]


def _regular(path: Path) -> tuple[str | None, int]:
    """:func:`not_regular`, and the file's size."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return "a broken symbolic link" if path.is_symlink() else "no such file", 0
    except OSError as exc:
        raise UnreadableFile(f"{shown(path)}: cannot be read ({exc.strerror})") from exc
    mode = found.st_mode
    if stat.S_ISREG(mode):
        return None, found.st_size
    if stat.S_ISDIR(mode):  # (met only as a link inside a folder: a folder named is searched)
        return "a link to a folder, not followed", 0
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"not a regular file ({what})", 0
    return "not a regular file", 0


def open_regular(path: Path) -> io.FileIO:
    """``path`` opened to read, refused unless it is a regular file: opened without blocking (a FIFO
    put in a file's place would block the open) and checked on the open file itself."""
    fd, _ = _open_regular_fd(path)
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return io.FileIO(fd, "rb", closefd=True)


def _open_regular_fd(path: Path) -> tuple[int, os.stat_result]:
    """:func:`open_regular`'s descriptor, still without blocking (which a regular file's reads
    ignore), and what the open file is (its size, when it was last written)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise UnreadableFile(f"{shown(path)}: cannot be read ({exc.strerror})") from exc
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        raise UnreadableFile(f"{shown(path)}: not a regular file; only regular files are read")
    return fd, found


@dataclass(frozen=True)
class Hashed:
    """A file as hashed: the SHA-256 and size of its bytes as stored, and when it was last written."""

    sha256: str
    size: int
    mtime_ns: int

    def unchanged(self, path: Path) -> bool:
        """Whether the file is as it was hashed (same size, not written since)."""
        try:
            now = path.stat()
        except OSError:
            return False
        return now.st_size == self.size and now.st_mtime_ns == self.mtime_ns


def changed(path: Path) -> FileChanged:
    """The error for a file written or truncated while it was read (a live log)."""
    return FileChanged(f"{shown(path)}: changed while it was read; ingest it again once nothing writes to it")


def identify(path: Path, *, explicit: bool, adapter: str | None = None, size: int | None = None,
             limits: Limits = Limits()) -> LogFile | None:
    """The format and compression of a file, from its name and first bytes; None if neither fits.
    ``size`` and ``limits``: the file's, as its :class:`LogFile` holds them.

    A file named explicitly whose name says nothing is taken as JSON Lines if it starts with ``{``.
    JSON Lines that are not canonical records, and files with other names (``.log``, ``.txt``,
    none), are offered to the adapters' sniffs; ``adapter`` forces one.
    """
    fd, _ = _open_regular_fd(path)
    try:
        head = os.read(fd, _HEAD_BYTES)
    except OSError as exc:
        raise UnreadableFile(f"{shown(path)}: cannot be read ({exc.strerror})") from exc
    finally:
        os.close(fd)
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
        return LogFile(path, "text", compression, adapters.get(adapter).name, limits=limits, size=size)
    if adapter == "canonical":
        if fmt is None and head[:1] in (b"{", b"\xef"):
            fmt = "jsonl"
        return LogFile(path, fmt, compression, limits=limits, size=size) if fmt is not None else None
    if fmt == "jsonl" or (fmt is None and (explicit or adapters.log_like(path))):
        found = _canonical_head(head) if compression == "none" else None
        if found is None:
            found = adapters.sniff(_head(LogFile(path, "text", compression)))
        if found is not None and found.name != "canonical":
            return LogFile(path, "text", compression, found.name, limits=limits, size=size)
        if found is not None and fmt is None:
            fmt = "jsonl"
    if fmt is None and explicit and compression == "none" and head[:1] in (b"{", b"\xef"):
        fmt = "jsonl"
    if fmt is None:
        return None
    return LogFile(path, fmt, compression, limits=limits, size=size)


#: How much of a file :func:`identify` reads first: its magic, and mostly enough for its first lines.
_HEAD_BYTES = 16 << 10


def _canonical_head(head: bytes) -> adapters.Adapter | None:
    """The canonical adapter where the whole lines in ``head`` (a file's first bytes, as stored)
    show a canonical record on the first line that is not blank, else None: then, and only then,
    the adapters' sniff of the file's head (:func:`_head`) says canonical, for the canonical sniff
    is tried first and reads that line alone. The file is not opened again (tens of thousands of
    small files: 30 us a file)."""
    canonical = adapters.ADAPTERS["canonical"]
    assert next(iter(adapters.ADAPTERS.values())) is canonical, "the canonical sniff is tried first"
    # the lines up to the first newline (not only "\n" ends a line) are enough where one is not blank
    first = head[: head.find(b"\n") + 1].decode("utf-8", "replace").splitlines()
    whole = first if any(line.strip().lstrip("\ufeff") for line in first) else \
        head.decode("utf-8", "replace").splitlines()[:-1]  # (the last line may go on past the head)
    return canonical if canonical.sniff(whole[: adapters.SNIFF_LINES]) else None


def _head(log: LogFile) -> list[str]:
    """The first lines of a file, decompressed, for the adapters' sniffs."""
    try:
        with open_binary(log) as fh:
            data = fh.read(1 << 20)
    except (OSError, EOFError, ValueError, zstandard.ZstdError):
        return []
    return data.decode("utf-8", "replace").splitlines()[: adapters.SNIFF_LINES]


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


class _AsOpened(io.RawIOBase):
    """A file read no further than the size it had when opened: a log still written to (a live
    log) ends where it ended then, and the ingest finds it changed, rather than reading on forever."""

    def __init__(self, path: Path) -> None:
        self._fh = open_regular(path)
        self._size = os.fstat(self._fh.fileno()).st_size

    @property
    def size(self) -> int:
        """The file's size when it was opened."""
        return self._size

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
    """The file's decompressed bytes as a stream, up to the size the file had when opened; a
    compressed file refused once it decompresses past :attr:`Limits.max_expansion` times its size."""
    raw_file = _AsOpened(log.path)
    return _decompressed(log, io.BufferedReader(raw_file), raw_file.size)


def _decompressed(log: LogFile, raw: IO[bytes], size: int) -> IO[bytes]:
    """:func:`open_binary` of the bytes ``raw`` gives (the file as stored, ``size`` bytes)."""
    if log.compression == "none":
        return raw
    if log.compression == "gzip":
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[assignment]
    else:
        stream = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True, closefd=True)
    bound = max(EXPANSION_FLOOR, size * log.limits.max_expansion)
    return io.BufferedReader(_Expanding(stream, bound, log), buffer_size=1 << 20)


class _Expanding(io.RawIOBase):
    """A decompressed stream that refuses to give more than ``bound`` bytes (a decompression bomb)."""

    def __init__(self, stream: IO[bytes], bound: int, log: LogFile) -> None:
        self._stream, self._bound, self._log, self._given = stream, bound, log, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._stream.readinto(buffer)  # type: ignore[attr-defined]
        self._given += n or 0
        if self._given > self._bound:
            raise UnreadableFile(
                f"{shown(self._log.path)}: decompresses to more than {self._log.limits.max_expansion:,} times its "
                f"size (past {self._bound:,} bytes): refused as a decompression bomb (--max-expansion to allow more)")
        return n or 0

    def close(self) -> None:
        self._stream.close()
        super().close()


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
                                         notes if notes is not None else adapters.Notes())
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


@contextmanager
def _decoding(log: LogFile) -> Iterator[None]:
    """A file that fails to decode (bad compression, not its format) raises UnreadableFile."""
    try:
        yield
    except (OSError, EOFError, ValueError, pa.ArrowException, zstandard.ZstdError) as exc:
        if isinstance(exc, UnreadableFile):
            raise
        raise UnreadableFile(f"{log.path}: cannot be decoded as {log.format} ({exc})") from exc


def _jsonl_chunks(log: LogFile) -> Iterator[pa.Table]:
    for data, first_line, ends, long in _line_blocks(log, None, CHUNK_BYTES):
        yield _lines_table(data, first_line, ends, _long_details(long, log.limits))


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


#: A small file's bytes as one block, to be split with other files' (:func:`_split_files`, which
#: finds where their lines end, for them all at once): its bytes (decompressed, ending with a
#: newline), and its lines too long to read (index: length), which it holds the start of.
WholeBlock = tuple[np.ndarray, dict[int, int]]


def read_small(log: LogFile) -> tuple[Hashed, WholeBlock | Iterator[LineBlock]]:
    """A small file read in one go, and hashed from the very bytes read: its only open in an
    ingest but :func:`identify`'s. Its bytes as one block (:data:`WholeBlock`), or where they make
    more than one (more lines than a block holds, or a file that decompresses to more than a
    split's bytes), its blocks as :func:`_line_blocks` gives them, decompressed as they are taken.

    The file is looked at (``fstat``) before and after the read, on the open file: written or
    truncated in between, or past :data:`SMALL_READ_BYTES` already (it was found small), it is
    :class:`~forensics.errors.FileChanged`.
    """
    fd, before = _open_regular_fd(log.path)
    try:
        if before.st_size > SMALL_READ_BYTES:
            raise changed(log.path)
        stored = _read_fd(fd, before.st_size)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if len(stored) != before.st_size or (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise changed(log.path)
    hashed = Hashed(hashlib.sha256(stored).hexdigest(), len(stored), before.st_mtime_ns)
    if log.compression == "none" and len(stored) < min(PLAIN_BLOCK_LINES, log.limits.max_line_bytes):
        # fewer bytes than a block's lines or the longest line: one block, each line whole
        data = np.frombuffer(stored, dtype=np.uint8)[3 if stored.startswith(b"\xef\xbb\xbf") else 0 :]
        if not len(data):
            return hashed, iter(())
        return hashed, (data if data[-1] == 10 else np.append(data, np.uint8(10)), {})
    blocks = _line_blocks(log, PLAIN_BLOCK_LINES, SMALL_READ_BYTES, stored)
    held = list(itertools.islice(blocks, 2))
    if len(held) == 1 and len(held[0][0]) <= SPLIT_BYTES:
        return hashed, (held[0][0], held[0][3])
    return hashed, itertools.chain(held, blocks)


def _read_fd(fd: int, size: int) -> bytes:
    """Up to ``size`` bytes of the open file ``fd``, fewer where it ends before."""
    pieces = []
    got = 0
    while got < size and (piece := os.read(fd, size - got)):
        pieces.append(piece)
        got += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


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

    With ``together``, small files are read whole, each in one read that hashes it too
    (:func:`read_small`), split many at once (:func:`_split_files`), and taken whole
    (:meth:`whole`); they may wait in any number while they add up to less than ``small_bytes``:
    the reader then runs on through thousands of them while the loader puts a group of them in.
    The files must be taken in order, each with :meth:`blocks`, :meth:`whole` or :meth:`skip`.

    The reader and the splitters run at a lower scheduling priority than the loader
    (:data:`BACKGROUND_NICE`): they are ahead of it, and DuckDB's inserts are the ingest's
    critical path, so they take the CPU the inserts leave (13% faster on 2 cores, bench/README.md).
    """

    _END = object()

    def __init__(self, logs: Sequence[LogFile], depth: int = 6, small_bytes: int = 64 << 20, *,
                 together: bool = False) -> None:
        self._logs = [log for log in logs if fast_path(log)]
        self._together = together
        self._whole = [self.reads_whole(log) for log in self._logs]
        self._queues: dict[int, queue.Queue[Any]] = {}  # (made as they are first wanted: 10,000 files, 0.5 s)
        self._queues_lock = threading.Lock()
        self._wholes: dict[int, _Whole] = {}  # files read whole, by index, until taken
        self._arrived = threading.Condition()
        self._taken = 0
        self._passed: set[int] = set()  # files to pass over: the reader stops reading them
        self._ended: set[int] = set()  # files whose every block (and end) has been taken
        self._slots = _Slots(depth, small_bytes)
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

    def reads_whole(self, log: LogFile) -> bool:
        """Whether ``log`` is read whole and hashed as it is read (a small fast-path file, ``together``),
        to be taken with :meth:`whole`: its hash is not to be made apart."""
        return self._together and fast_path(log) and log.size is not None and log.small

    def _read(self) -> None:
        in_background(self._nice)
        waiting: list[tuple[int, Hashed, WholeBlock]] = []  # small files read, to be split together
        waiting_bytes = 0
        for index, log in enumerate(self._logs):
            if self._whole[index]:
                try:
                    hashed, read = read_small(log)
                except BaseException as exc:  # handed to the loader, which says what the file is
                    self._arrive([(index, _Whole(None, (), exc))])
                    continue
                if isinstance(read, tuple):
                    if not self._slot(len(read[0])):
                        return
                    waiting.append((index, hashed, read))
                    waiting_bytes += len(read[0])
                    if len(waiting) >= SPLIT_FILES or waiting_bytes >= SPLIT_BYTES:
                        self._split_together(waiting)
                        waiting, waiting_bytes = [], 0
                    continue
                # more than one block: streamed as a large file's, for the loader takes them as they come
                self._split_together(waiting)
                waiting, waiting_bytes = [], 0
                self._arrive([(index, _Whole(hashed, (), None, streamed=True))])
                if not self._stream(index, log, read):
                    return
                continue
            self._split_together(waiting)
            waiting, waiting_bytes = [], 0
            if not self._stream(index, log, _line_blocks(log, PLAIN_BLOCK_LINES, PLAIN_READ_BYTES)):
                return
        self._split_together(waiting)

    def _stream(self, index: int, log: LogFile, blocks: Iterator[LineBlock]) -> bool:
        """The file's ``blocks`` to the splitters and its queue, one by one: False where the reading
        is to stop."""
        out = self._queue(index)
        try:
            for data, first_line, ends, long in blocks:
                if not self._slot(len(data)):
                    return False
                if index in self._passed:
                    self._slots.release(len(data))
                    break
                split = self._pool.submit(_split, data, first_line, ends, _long_details(long, log.limits))
                out.put(_Pending(split, len(data)))
        except BaseException as exc:  # handed to the loader, which says what the file is
            out.put(exc)
        out.put(self._END)
        return True

    def _slot(self, nbytes: int) -> bool:
        """Wait for a slot for a block of ``nbytes``: False where the reading is to stop."""
        while not self._slots.acquire(nbytes, timeout=0.1):
            if self._stop.is_set():
                return False
        return not self._stop.is_set()

    def _split_together(self, waiting: list[tuple[int, Hashed, WholeBlock]]) -> None:
        """Small files read (each one block) split as one; each file's share to the loader."""
        if not waiting:
            return
        limits = [self._logs[index].limits for index, _, _ in waiting]
        split = self._pool.submit(_split_files, [block for _, _, block in waiting], limits)
        self._arrive([(index, _Whole(hashed, (_Pending(split, len(block[0]), part),), None))
                      for part, (index, hashed, block) in enumerate(waiting)])

    def _arrive(self, wholes: Sequence[tuple[int, _Whole]]) -> None:
        """Files read whole, for the loader to take."""
        with self._arrived:
            self._wholes.update(wholes)
            self._arrived.notify()

    def _queue(self, index: int) -> queue.Queue[Any]:
        with self._queues_lock:
            if index not in self._queues:
                self._queues[index] = queue.Queue()
            return self._queues[index]

    def _next(self, log: LogFile) -> int:
        assert self._logs[self._taken] is log, "fast-path files are taken in order"
        self._taken += 1
        return self._taken - 1

    def whole(self, log: LogFile) -> tuple[Hashed, list[Block | FilePart]]:
        """The next file, read whole (:meth:`reads_whole`): its hash and its blocks, split (a file
        split with others as its share of their split). :class:`UnreadableFile` where it could not
        be read (then nothing of it is left to take)."""
        index = self._next(log)
        assert self._whole[index], "a file read whole"
        with self._arrived:
            while index not in self._wholes:
                self._arrived.wait()
            read = self._wholes.pop(index)
        for pending in read.pending:
            self._slots.release(pending.nbytes)
        if not read.streamed:
            self._ended.add(index)
        with _decoding(log):
            if read.error is not None:
                raise read.error
            assert read.hashed is not None
            parts: list[Block | FilePart] = [p.block() if p.part is None else FilePart(p.split.result(), p.part)
                                             for p in read.pending]
        if read.streamed:
            parts += self._streamed(index, log)
        return read.hashed, parts

    def blocks(self, log: LogFile) -> Iterator[Block]:
        """The next file's blocks, split."""
        for piece in self.parts(log):
            yield piece if isinstance(piece, Block) else piece.split.block(piece.part)

    def parts(self, log: LogFile) -> Iterator[Block | FilePart]:
        """The next file's blocks, split; a small file split with others as its share of their split
        (:meth:`blocks` gives it as a block of its own)."""
        if self._whole[self._taken]:
            yield from self.whole(log)[1]
            return
        yield from self._streamed(self._next(log), log)

    def _streamed(self, index: int, log: LogFile) -> Iterator[Block]:
        """The blocks of the file ``index`` from its queue, split, as they come."""
        out = self._queue(index)
        with _decoding(log):
            while (item := out.get()) is not self._END:
                if isinstance(item, BaseException):
                    raise item
                self._slots.release(item.nbytes)
                yield item.block()
            self._ended.add(index)
        with self._queues_lock:
            del self._queues[index]

    def next_ready(self) -> bool:
        """Whether the file being taken (with :meth:`blocks`) has its next block split already, or
        no block left: what the loader would wait for is there."""
        if not self._taken:
            return False
        if self._whole[self._taken - 1]:
            return True  # (taken whole: only :meth:`blocks` asks)
        out = self._queue(self._taken - 1)
        with out.mutex:
            if not out.queue:
                return False
            item = out.queue[0]
        return item is self._END or isinstance(item, BaseException) or item.split.done()

    def skip(self, log: LogFile) -> None:
        """Pass over the next file (already in the case): the reader stops reading it."""
        if self._whole[self._taken]:
            try:
                self.whole(log)
            except UnreadableFile:
                pass
            return
        self._passed.add(self._taken)
        index = self._next(log)
        self._drain(self._queue(index))
        self._ended.add(index)

    def abandon(self, log: LogFile) -> None:
        """Give up a file that failed, wherever its taking stands: the rest of it is passed over."""
        if self._taken and self._logs[self._taken - 1] is log:
            index = self._taken - 1
            if index not in self._ended:
                self._passed.add(index)
                self._drain(self._queue(index))
                self._ended.add(index)
        elif self._taken < len(self._logs) and self._logs[self._taken] is log:
            self.skip(log)

    def _drain(self, out: queue.Queue[Any]) -> None:
        while (item := out.get()) is not self._END:
            if not isinstance(item, BaseException):
                self._slots.release(item.nbytes)
                item.split.cancel()

    def close(self) -> None:
        """Stop reading, and wait for the threads."""
        self._stop.set()
        self._reader.join()
        self._pool.shutdown(cancel_futures=True)


@dataclass(frozen=True)
class _Whole:
    """A small file read whole by the reader (:func:`read_small`): its hash, and its block handed to
    the splitters (its part of a split of several files), or, ``streamed``, its blocks to come by
    its queue, each split alone; or why it could not be read."""

    hashed: Hashed | None
    pending: tuple[_Pending, ...]
    error: BaseException | None
    streamed: bool = False  # its blocks come by its queue, as a large file's do


@dataclass(frozen=True)
class _Pending:
    """A block read and handed to a splitter (alone, or as the ``part``-th of several files')."""

    split: Future[Any]  # a Block; with ``part``, a FilesSplit
    nbytes: int
    part: int | None = None

    def block(self) -> Block:
        """The block, split (waiting for it)."""
        done = self.split.result()
        return done if self.part is None else done.block(self.part)


class _Slots:
    """What the reader may hold read and not yet taken: ``depth`` blocks, or more while they add
    up to less than ``small_bytes``."""

    def __init__(self, depth: int, small_bytes: int) -> None:
        self._depth, self._small = depth, small_bytes
        self._blocks = self._bytes = 0
        self._changed = threading.Condition()

    def acquire(self, nbytes: int, timeout: float) -> bool:
        """Take a slot for a block of ``nbytes``, waiting at most ``timeout`` s: whether it was taken."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._blocks < self._depth or self._bytes + nbytes <= self._small, timeout):
                return False
            self._blocks += 1
            self._bytes += nbytes
            return True

    def release(self, nbytes: int) -> None:
        """Give back the slot of a block of ``nbytes``."""
        with self._changed:
            self._blocks -= 1
            self._bytes -= nbytes
            self._changed.notify()


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
