"""Ingest log files into a case: every record ingested, a duplicate, or quarantined.

Canonical files are read as they are; engine logs come translated by an adapter
(:mod:`forensics.adapters`) and from there on are handled exactly alike. Plain JSON lines (the
bulk of any real log) are read by a compiled fast path (:mod:`forensics.ingestion.fast`, for
logs large enough to gain from it, or as ``ingest(..., fast=...)`` says) straight into the
record tables; every other line is validated by SQL (:mod:`forensics.ingestion.validate`), the
reference both must agree with. The fast path's files are read and split in worker threads ahead of the loading
(:class:`forensics.ingestion.readers.ReadAhead`), in blocks of whole DuckDB row groups, which
DuckDB writes straight to the case file. Every line read is kept, compressed, in
``source_lines`` (:mod:`forensics.ingestion.source`), not as a string per record.

Each file is all in or all out: a process killed mid-way leaves the case as it was before
that file, and running the same command again finishes the job. A large file is a transaction of
its own; small files (a fleet's hourly logs: tens of thousands of them) are read whole (canonical
ones in one read, hashed from the same bytes) and go in a group at a time, one transaction, one
statement per table and one settling for the group
(:func:`~forensics.ingestion.settle.settle_together`), which ends exactly as they would one by
one, or where it might not, one transaction each. The outcome does not depend on file order: a
conflict on ``(node, boot, seq)`` keeps the record whose canonical JSON sorts first, even when the
winner arrives in a later file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib
import itertools
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics import adapters
from forensics.adapters import Notes, Options
from forensics.errors import UnreadableFile
from forensics.ingestion import source
from forensics.ingestion.readers import (
    LINES_SCHEMA,
    ROW_GROUP,
    Block,
    FilePart,
    FilesSplit,
    Hashed,
    Limits,
    LogFile,
    PassedOver,
    ReadAhead,
    batched,
    changed,
    discover,
    fast_path,
    open_regular,
    read_blocks,
    source_pieces,
)
from forensics.ingestion.settle import RECORD_TABLES, count, place, settle, settle_together
from forensics.ingestion.validate import LENIENT_SUSPECT, PLAIN_SOURCE, plain_stage_sql, prepare, stage_sql
from forensics.schema import KINDS, Reason
from forensics.store import HeldCase, connect, one, roll_back, scan
from forensics.text import path_text, shown
from forensics.version import __version__

#: The table of valid records of each kind (forensics/sql/schema.sql); ``records`` is a view of them.
#: Where a record was read: the first columns of every record table, which the loader fills.
_WHERE_READ = ("file_id", "line_no", "part")


def record_columns(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, ...]]:
    """Per kind, the columns of its record table besides where the record was read."""
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() "
        "WHERE schema_name = 'main' AND list_contains(?, table_name) ORDER BY table_name, column_index",
        [list(RECORD_TABLES.values())],
    ).fetchall()
    tables = {table: kind for kind, table in RECORD_TABLES.items()}
    columns: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for table, column in rows:
        if column not in _WHERE_READ:
            columns[tables[table]].append(column)
    return {kind: tuple(cols) for kind, cols in columns.items()}


#: Told how the file being read goes: its path, and how many of its bytes are read of how many.
Progress = Callable[[Path, int, int], None]


@runtime_checkable
class FilesProgress(Protocol):
    """A :data:`Progress` that is told too how many of the files named are read (in the case, there
    already, refused, or read whole and waiting for their group) of how many: what an ingest of
    thousands of small files shows."""

    def __call__(self, path: Path, done: int, total: int) -> None: ...

    def files(self, done: int, total: int) -> None: ...


@dataclass(frozen=True)
class Counts:
    """How the records read ended: the three always add up to ``read``."""

    read: int = 0
    ingested: int = 0
    duplicates: int = 0
    quarantined: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            self.read + other.read,
            self.ingested + other.ingested,
            self.duplicates + other.duplicates,
            self.quarantined + other.quarantined,
        )

    def as_dict(self) -> dict[str, int]:
        """As JSON-ready data."""
        return {
            "read": self.read,
            "ingested": self.ingested,
            "duplicates": self.duplicates,
            "quarantined": self.quarantined,
        }


@dataclass(frozen=True)
class FileResult:
    """One input file: its identity and how its records ended."""

    path: str
    sha256: str
    size: int
    format: str
    compression: str
    status: str  # "ingested", "already_in_case", or "refused" (``why``: nothing of it is in the case)
    counts: Counts
    adapter: str = "canonical"
    ignored: int = 0  # adapted files: lines that are no event (not records, so not in the counts)
    notes: tuple[str, ...] = ()  # what the adapter wants the operator to know
    why: str | None = None  # a refused file: why it could not be read

    def as_dict(self) -> dict[str, object]:
        """As JSON-ready data."""
        return {
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "format": self.format,
            "compression": self.compression,
            "adapter": self.adapter,
            "status": self.status,
            **self.counts.as_dict(),
            "lines_ignored": self.ignored,
            "notes": list(self.notes),
            **({"why": self.why} if self.why is not None else {}),
        }


@dataclass(frozen=True)
class IngestResult:
    """The outcome of one ingest: the files named, their counts, and the case's totals."""

    db: str
    files: tuple[FileResult, ...]
    skipped: tuple[PassedOver, ...]
    records: Counts
    case: Counts

    @property
    def refused(self) -> tuple[FileResult, ...]:
        """The files that could not be read (nothing of them is in the case)."""
        return tuple(f for f in self.files if f.status == "refused")

    @property
    def empty(self) -> bool:
        """Whether the files named held no record at all: nothing to analyse, which is an answer
        of its own (a file of malformed lines is not empty: its records are quarantined)."""
        return self.records.read == 0

    def as_dict(self) -> dict[str, object]:
        """As JSON-ready data."""
        return {
            "db": self.db,
            "records": self.records.as_dict(),
            "files": [f.as_dict() for f in self.files],
            "skipped": [p.as_dict() for p in self.skipped],
            "refused": len(self.refused),
            "case": self.case.as_dict(),
        }


def ingest(
    paths: Sequence[Path | str],
    db: Path | str | HeldCase,
    *,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    fast: bool | None = None,
    limits: Limits | None = None,
) -> IngestResult:
    """Ingest the log files at ``paths`` (files or folders) into the case ``db``.

    Each file's format is recognised (canonical, or an engine log an adapter translates);
    ``format`` names the adapter for every file instead, and ``options`` tells the adapters
    what the engine's logs do not say (node, role, tenants). ``fast``: plain JSON lines take the
    compiled fast path (True), the SQL validator as every other line does (False: the same
    records, slower on large logs), or the fast path where they add up to
    :data:`~forensics.ingestion.readers.discovery.FAST_FROM_BYTES` (None). ``limits``: the reader's bounds
    (the longest line, how far a compressed file may expand).

    A file that cannot be read (damaged compression, a bomb, changed while read, no permission to
    open it, in a folder that cannot be listed) is refused: it is rolled back, listed with why in
    the result and in the case's ``refused_files``, and the other files are ingested.
    """
    if format is not None:
        adapters.get(format)
    logs, skipped = discover([Path(p) for p in paths], format, fast=fast, limits=limits)
    with _ordinary_pages():
        return _ingest(db, logs, skipped, progress, options or Options(),
                       searched=[Path(p) for p in paths if Path(p).is_dir()])


def ingest_alone(log: LogFile, db: Path | str, options: Options | None = None) -> IngestResult:
    """The one file ``log`` (as :func:`~forensics.ingestion.readers.discover` found it) into the new
    case ``db``, by the same reading and validation as :func:`ingest`, its lines placed in their
    kind's table or quarantine but not settled against other files (no repeat, conflict or pool
    check: :func:`~forensics.ingestion.settle.settle_across` does that where the files meet; the
    Spark path, ``forensics.spark``)."""
    with _ordinary_pages():
        return _ingest(db, [log], [], None, options or Options(), settler=_placed)


#: What settles a file once its lines are in (:func:`settle`, or only :func:`_placed`).
Settler = Callable[[duckdb.DuckDBPyConnection, int, dict[str, tuple[str, ...]]], None]


def _placed(con: duckdb.DuckDBPyConnection, file_id: int, columns: dict[str, tuple[str, ...]]) -> None:
    """The file's lines placed in their kind's table or quarantine, not settled (:func:`ingest_alone`)."""
    place(con, columns)


def _ingest(db: Path | str | HeldCase, logs: list[LogFile], skipped: list[PassedOver], progress: Progress | None,
            options: Options, settler: Settler = settle, searched: Sequence[Path] = ()) -> IngestResult:
    """:func:`ingest` of the files found (in the folders ``searched``); small files go in groups
    where ``settler`` settles (:func:`settle`)."""
    con = connect(db)
    try:
        # the files are read, split and hashed while the case gets ready (the stage's statement
        # takes 0.1 s to plan), for the split is what the loader waits for first; the next file
        # is hashed while this one loads
        with ThreadPoolExecutor(max_workers=1) as pool, ReadAhead(logs, together=settler is settle) as ahead:
            hashes = digests(pool, logs, ahead.reads_whole)
            try:
                prepare(con)
                # each file leaves each kind's table a part of a row group; DuckDB would merge those
                # with the groups around them at every commit's checkpoint, rewriting them (0.35 s a file)
                con.execute("SET max_vacuum_tasks = 0")
                scan(con, _tagged(LINES_SCHEMA.empty_table(), 0), "chunk",
                     f"CREATE OR REPLACE TEMP TABLE stage_columns AS {LINES_STAGE}")
                columns = record_columns(con)
                loading = _Loading(con, progress, options, ahead, columns, settler)
                results = loading.all(logs, hashes, together=settler is settle)
            finally:
                for digest in hashes:
                    if digest is not None:
                        digest.cancel()
        final = _with_counts(con, results) + [_unopened(con, p) for p in skipped if p.refused]
        _forget_listed(con, searched, {r.path for r in final if r.status == "refused"})
        # a file named twice, or two paths with the same bytes, is one piece of evidence
        distinct = {r.sha256: r.counts for r in final if r.status != "refused"}
        total = sum(distinct.values(), Counts())
        return IngestResult(
            db=str(db),
            files=tuple(final),
            skipped=tuple(p for p in skipped if not p.refused),
            records=total,
            case=case_counts(con),
        )
    finally:
        con.close()


@contextmanager
def _ordinary_pages() -> Iterator[None]:
    """numpy's arrays on ordinary pages while the files go in.

    numpy asks the kernel for huge pages for each array of 4 MB or more. Where the kernel has
    none free (memory filled with page cache, as on a machine that just read the logs), the
    thread that first touches the array waits while the kernel compacts memory to make one.
    An ingest takes most of its memory fresh, and the reader's buffers, the scan's work arrays
    and the columns are such arrays: the 2.08 M-record set took 4.85 to 5.96 s (median 5.43)
    with huge pages and 4.80 to 5.44 s (median 4.97) without, 8 runs each in fresh processes,
    interleaved (bench/README.md). numpy's setting is the process's: it is put back after.
    """
    toggle = huge_page_switch()
    if toggle is None:
        yield
        return
    before = toggle(False)
    try:
        yield
    finally:
        toggle(before)


def huge_page_switch() -> Callable[[bool], bool] | None:
    """numpy's switch for huge pages (it sets the setting and gives the one before), if it has one."""
    for name in ("numpy._core.multiarray", "numpy.core.multiarray"):  # numpy 2; numpy 1.26
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        toggle: Callable[[bool], bool] | None = getattr(module, "_set_madvise_hugepage", None)
        if toggle is not None:
            return toggle
    return None


def case_counts(con: duckdb.DuckDBPyConnection) -> Counts:
    """The case's totals over every file it holds."""
    row = one(con, "SELECT coalesce(sum(read), 0), coalesce(sum(ingested), 0), coalesce(sum(duplicates), 0), "
        "coalesce(sum(quarantined), 0) FROM file_counts")
    assert row is not None
    return Counts(*(int(v) for v in row))


def _with_counts(con: duckdb.DuckDBPyConnection, results: list[FileResult]) -> list[FileResult]:
    """The files' counts as they stand now (a later file can turn a record into a conflict)."""
    rows = con.execute(
        "SELECT sha256, read, ingested, duplicates, quarantined FROM file_counts "
        "WHERE sha256 IN (SELECT unnest(?::VARCHAR[]))",  # (a join: list_contains, 0.25 s for 20,000 files)
        [[r.sha256 for r in results]],
    ).fetchall()
    counts = {sha: Counts(int(read), int(ingested), int(duplicates), int(quarantined))
              for sha, read, ingested, duplicates, quarantined in rows}
    return [r if r.status == "refused" else FileResult(**{**r.__dict__, "counts": counts[r.sha256]})
            for r in results]


def sha256_of(path: Path) -> Hashed:
    """The SHA-256 and size of a file's bytes as stored (compressed files are hashed as they are)."""
    try:
        with open_regular(path) as fh:
            # one buffer, read into again and again: a fresh 8 MB a read cost more than the copying
            digest = hashlib.file_digest(fh, "sha256")
            size = fh.tell()
            mtime_ns = os.fstat(fh.fileno()).st_mtime_ns
    except OSError as exc:
        raise UnreadableFile(f"{shown(path)}: cannot be read ({exc.strerror})") from exc
    return Hashed(digest.hexdigest(), size, mtime_ns)


#: Small files are hashed in batches of up to this many (a task a file cost 30 us of the loader's time).
HASH_BATCH = 256


class Digest:
    """A file's hash on its way: one of a batch of files hashed together by the hashing thread."""

    __slots__ = ("at", "batch")

    def __init__(self, batch: Future[list[Hashed | UnreadableFile]], at: int) -> None:
        self.batch, self.at = batch, at

    def result(self) -> Hashed:
        """The file's hash, once it is there; :class:`UnreadableFile` where it could not be read."""
        done = self.batch.result()[self.at]
        if isinstance(done, UnreadableFile):
            raise done
        return done

    def cancel(self) -> None:
        """Hash it only if it is not under way already (nor the rest of its batch)."""
        self.batch.cancel()


def digests(pool: ThreadPoolExecutor, logs: Sequence[LogFile],
            hashed_as_read: Callable[[LogFile], bool]) -> list[Digest | None]:
    """The files' hashes, made in order by ``pool``: small files in batches, each other file alone;
    None for a file hashed as it is read (``hashed_as_read``: :meth:`ReadAhead.reads_whole`)."""
    out: list[Digest | None] = [None] * len(logs)
    batch: list[tuple[int, Path]] = []  # (each file's index in ``logs``)

    def submit() -> None:
        done = pool.submit(_sha256_of_each, [path for _, path in batch])
        for at, (index, _) in enumerate(batch):
            out[index] = Digest(done, at)
        batch.clear()

    for index, log in enumerate(logs):
        if hashed_as_read(log):
            continue
        if not log.small and batch:
            submit()
        batch.append((index, log.path))
        if not log.small or len(batch) >= HASH_BATCH:
            submit()
    if batch:
        submit()
    return out


def _sha256_of_each(paths: Sequence[Path]) -> list[Hashed | UnreadableFile]:
    """:func:`sha256_of` of each file, or why it could not be read."""
    out: list[Hashed | UnreadableFile] = []
    for path in paths:
        try:
            out.append(sha256_of(path))
        except UnreadableFile as exc:
            out.append(exc)
    return out


def _ingest_or_refuse(
    con: duckdb.DuckDBPyConnection, log: LogFile, hashing: Digest, progress: Progress | None,
    options: Options, ahead: ReadAhead, columns: dict[str, tuple[str, ...]], settler: Settler,
) -> FileResult:
    """:func:`_ingest_file`, or, for a file that cannot be read, its refusal: recorded in
    ``refused_files`` (the case holds nothing else of it) and the ingest goes on."""
    try:
        return _ingest_file(con, log, hashing, progress, options, ahead, columns, settler)
    except UnreadableFile as exc:
        return _refused(con, log, hashing, ahead, exc)


def _refused(con: duckdb.DuckDBPyConnection, log: LogFile, hashing: Digest | None, ahead: ReadAhead,
             exc: UnreadableFile) -> FileResult:
    """The file's refusal (``exc`` says why), in ``refused_files`` and as its result; the reader
    passes over what is left of it. ``hashing`` None: the file was to be hashed as it was read; it
    is hashed now, for the record."""
    if fast_path(log):
        ahead.abandon(log)
    why = str(exc).removeprefix(f"{shown(log.path)}: ")
    try:
        hashed = hashing.result() if hashing is not None else sha256_of(log.path)
    except UnreadableFile:
        hashed = Hashed("", _size_or_zero(log.path), 0)
    _refuse(con, path_text(log.path), hashed.size, hashed.sha256 or None, why)
    return FileResult(status="refused", why=why, **_identity(log, hashed))


#: Small files (:data:`~forensics.ingestion.readers.logfile.SMALL_FILE`) are read whole, then put in a
#: group at a time, in one transaction (each file's own statements and settling cost about 80 ms,
#: which for 50 records is everything). A group ends at this many files, or once this much is read.
GROUP_FILES = 5000
GROUP_BYTES = 128 << 20
#: The first group ends at this many files, the next at twice as many, and so on (:func:`_group_files`).
FIRST_GROUP_FILES = 500


@dataclass(frozen=True)
class WholeFile:
    """A small file read whole, before it goes in: its blocks and what reading them said."""

    log: LogFile
    hashed: Hashed
    blocks: tuple[Block | FilePart, ...]  # (a file split with others: its share of their split)
    text: tuple[source.Piece, ...]  # its lines for ``source_lines`` where its blocks do not bring them
    notes: Notes
    ignored: int  # lines that are no event (an adapted file)
    path: str  # its path as the case stores it (:func:`~forensics.text.path_text`)

    @property
    def nbytes(self) -> int:
        """How much was read of it (decompressed)."""
        return sum(b.nbytes for b in self.blocks)


class _Loading:
    """One ingest's files going into the case, in the order found: each large file alone
    (:func:`_ingest_or_refuse`), the small ones read whole, then put in a group at a time."""

    def __init__(self, con: duckdb.DuckDBPyConnection, progress: Progress | None, options: Options,
                 ahead: ReadAhead, columns: dict[str, tuple[str, ...]], settler: Settler) -> None:
        self.con, self.progress, self.options, self.ahead = con, progress, options, ahead
        self.columns, self.settler = columns, settler
        self.files = progress.files if isinstance(progress, FilesProgress) else None
        # the case's files by their bytes, with the lines each ignored: a small file among them is there already
        self.known = {sha: int(n) for sha, n in con.execute("SELECT sha256, lines_ignored FROM files").fetchall()}

    def all(self, logs: Sequence[LogFile], hashes: Sequence[Digest | None], *, together: bool) -> list[FileResult]:
        """Every file's result, in order. ``together``: small files go in groups."""
        results: list[FileResult | None] = [None] * len(logs)
        group: list[tuple[int, WholeFile]] = []
        group_bytes = 0
        groups = 0
        small = [_small_size(log) is not None and together for log in logs]
        small_from = list(itertools.accumulate(reversed(small), initial=0))[::-1]  # (small files from each on)
        group_files = 0

        def put_group_in() -> None:
            nonlocal group_bytes, groups
            if not group:
                return
            for (at, _), result in zip(group, self.put_in([whole for _, whole in group]), strict=True):
                results[at] = result
            group.clear()
            group_bytes = 0
            groups += 1

        if self.files is not None:
            self.files(0, len(logs))
        for at, (log, hashing) in enumerate(zip(logs, hashes, strict=True)):
            size = _small_size(log) if together else None
            if size is None:
                assert hashing is not None, "a file hashed apart"
                put_group_in()
                results[at] = _ingest_or_refuse(self.con, log, hashing, self.progress, self.options, self.ahead,
                                                self.columns, self.settler)
            else:
                read = self.read_small(log, size, hashing)
                if isinstance(read, FileResult):
                    results[at] = read
                else:
                    if not group:
                        group_files = _group_files(groups, small_from[at])
                    group.append((at, read))
                    group_bytes += read.nbytes
                    if len(group) >= group_files or group_bytes >= GROUP_BYTES:
                        put_group_in()
            if self.files is not None:
                self.files(at + 1, len(logs))
        put_group_in()
        assert all(r is not None for r in results)
        return [r for r in results if r is not None]

    def read_small(self, log: LogFile, size: int, hashing: Digest | None) -> WholeFile | FileResult:
        """The small file ``log`` of ``size`` bytes read whole (:func:`_read_whole`; ``hashing`` None:
        by the reader, which hashed it as it read it), or its result where it is in the case already
        or is refused."""
        if hashing is None:
            return self.taken_whole(log, size)
        try:
            hashed = hashing.result()
            if hashed.sha256 in self.known:
                if fast_path(log):
                    self.ahead.skip(log)
                return FileResult(status="already_in_case", ignored=self.known[hashed.sha256],
                                  **_identity(log, hashed))
            whole = _read_whole(log, size, hashed, self.progress, self.options, self.ahead)
        except UnreadableFile as exc:
            return _refused(self.con, log, hashing, self.ahead, exc)
        self.known[hashed.sha256] = whole.ignored  # (a copy of it later on is there already)
        return whole

    def taken_whole(self, log: LogFile, size: int) -> WholeFile | FileResult:
        """:meth:`read_small` of a file the reader read whole and hashed, in one read."""
        try:
            hashed, parts = self.ahead.whole(log)
        except UnreadableFile as exc:
            return _refused(self.con, log, None, self.ahead, exc)
        if hashed.sha256 in self.known:
            return FileResult(status="already_in_case", ignored=self.known[hashed.sha256], **_identity(log, hashed))
        self.known[hashed.sha256] = 0
        if self.progress is not None:
            self.progress(log.path, min(sum(part.nbytes for part in parts), size), size)
        return WholeFile(log, hashed, tuple(parts), (), Notes(), 0, path_text(log.path))

    def put_in(self, wholes: Sequence[WholeFile]) -> list[FileResult]:
        """Small files read whole into the case: in one transaction, where settling them together
        ends as one by one would (:func:`~forensics.ingestion.settle.settle_together`), else a
        transaction each."""
        if len(wholes) > 1:
            results = self.transaction(wholes, together=True)
            if results is not None:
                return results
        return [result for whole in wholes for result in self.transaction([whole], together=False) or ()]

    def transaction(self, wholes: Sequence[WholeFile], *, together: bool) -> list[FileResult] | None:
        """The files in one transaction, settled together (``together``) or the one file by the
        settler; None, and nothing of them in the case, where together would not end as one by one."""
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            first = _next_file_id(con)
            notes = _stage_whole(con, first, wholes, self.columns)
            if together:
                place(con, self.columns)
                if not settle_together(con, first, first + len(wholes) - 1):
                    _roll_back(con)
                    return None
            else:
                self.settler(con, first, self.columns)
            con.execute("DELETE FROM refused_files WHERE path IN (SELECT unnest(?::VARCHAR[]))",
                        [[w.path for w in wholes]])
            con.execute("COMMIT")
        except BaseException:
            _roll_back(con)
            raise
        con.execute("DROP TABLE IF EXISTS stage")
        return [FileResult(status="ingested", ignored=w.ignored, notes=tuple(n.lines()),
                           **_identity(w.log, w.hashed, w.path))
                for w, n in zip(wholes, notes, strict=True)]


def _group_files(before: int, small: int) -> int:
    """How many files the group after ``before`` others holds, with ``small`` small files from its
    first on. The first groups are small, and each twice the one before up to :data:`GROUP_FILES`
    (from :data:`FIRST_GROUP_FILES`): the case's statements start once a few files are read, not
    thousands, while the reader reads on. Then the groups are as even as they can be (20,002 files:
    500, 1,000, 2,000, 4,000, then 3 of about 4,168, not 2 of 5,000 and one of 2,502): a group's
    own statements cost about as much for a few files as for thousands."""
    ramp = FIRST_GROUP_FILES << min(before, 32)
    if ramp < GROUP_FILES:
        return ramp
    return -(-small // -(-small // GROUP_FILES))


def _small_size(log: LogFile) -> int | None:
    """The file's size where it is small enough to be read whole (as found), else None."""
    return log.size if log.small and log.size is not None else None


def _read_whole(log: LogFile, size: int, hashed: Hashed, progress: Progress | None, options: Options,
                ahead: ReadAhead) -> WholeFile:
    """The small file ``log`` read whole, as :func:`_load` reads a file, and checked as it is: what
    was read must be what was hashed (:class:`~forensics.errors.FileChanged`)."""
    notes = Notes()
    ignored = [0]

    def count_ignored(n: int) -> None:
        ignored[0] = n

    blocks: list[Block | FilePart] = []
    done = 0
    read = ahead.parts(log) if fast_path(log) else read_blocks(log, ahead, options, notes, count_ignored)
    for block in read:
        blocks.append(block)
        done += block.nbytes
        if progress is not None:
            progress(log.path, min(done, size), size)
    text = () if fast_path(log) else tuple(source_pieces(log))
    # (the size found is not looked at again: a file changed since is not as hashed at the end)
    if not hashed.unchanged(log.path):
        raise changed(log.path)
    return WholeFile(log, hashed, tuple(blocks), text, notes, ignored[0], path_text(log.path))


def _stage_whole(con: duckdb.DuckDBPyConnection, first: int, wholes: Sequence[WholeFile],
                 columns: dict[str, tuple[str, ...]]) -> list[Notes]:
    """Files read whole, numbered from ``first``, in their tables as :func:`_load` and
    :func:`_ingest_file` put a file in (its rows in ``files`` and ``file_notes``, its lines in
    ``source_lines``), each kind in one statement; the lines for the SQL validator in ``stage``.
    Their notes, the leap seconds counted."""
    ids = range(first, first + len(wholes))
    con.execute("CREATE TEMP TABLE stage AS FROM stage_columns")
    lines = _Rows()
    plain: dict[str | None, _Rows] = {}
    text = source.Store(con)
    for run in _split_runs(ids, wholes):
        if isinstance(run, _SplitRun):  # (their rows stay in the split's tables: no table a file)
            split, parts = run.split, slice(run.part, run.part + len(run.ids) + 1)  # (and where the last ends)
            for file_id, texts in zip(run.ids.tolist(), split.texts[run.part : run.part + len(run.ids)], strict=True):
                text.add(file_id, texts)
            lines.add(run.ids, split.lines, split.lines_at[parts])
            for kind, rows, at in split.kinds:
                plain.setdefault(kind, _Rows()).add(run.ids, rows, at[parts])
            continue
        i, w = run
        one = np.array([i], dtype=np.int32)
        for block in w.blocks:
            if isinstance(block, FilePart):
                split, parts = block.split, slice(block.part, block.part + 2)
                text.add(i, split.texts[block.part])
                lines.add(one, split.lines, split.lines_at[parts])
                for kind, rows, at in split.kinds:
                    plain.setdefault(kind, _Rows()).add(one, rows, at[parts])
                continue
            text.add(i, block.text)
            lines.add(one, block.lines, np.array([0, block.lines.num_rows]))
            for kind, rows in block.kinds:
                plain.setdefault(kind, _Rows()).add(one, rows, np.array([0, rows.num_rows]))
        text.add(i, w.text)
    text.flush()
    if lines.runs:
        scan(con, batched(lines.table()), "chunk", f"INSERT INTO stage BY NAME {LINES_STAGE}")
    leaps: Counter[int] = Counter()
    for kind, rows in plain.items():
        if not rows.runs:
            continue
        table = rows.table()
        leaps.update(_leap_seconds_by_file(table))
        _load_plain(con, kind, table, columns[kind] if kind is not None else ())
    staged = dict(con.execute("SELECT file_id, count(*) FROM stage GROUP BY ALL").fetchall())
    leaps.update(dict(con.execute(
        "SELECT file_id, count(*) FROM stage WHERE q_reason IS NULL AND contains(coalesce(doc, raw), ':59:60') "
        "AND regexp_matches(coalesce(doc, raw), ?) GROUP BY ALL", [_LEAP_IN_LINE]).fetchall()))
    _check_strict_json(con)
    all_notes = []
    file_notes: list[list[Any]] = []
    for i, w in zip(ids, wholes, strict=True):
        notes = w.notes
        if leap := leaps[i]:
            notes = Notes(dict(w.notes.counts), dict(w.notes.texts))
            notes.add("leap", _LEAP_NOTE, leap)
        all_notes.append(notes)
        if notes.counts:
            file_notes += [[i, key, n, note] for key, n, note in notes.rows()]
    n = len(wholes)
    files = pa.table({
        "file_id": pa.array(ids, pa.int32()), "path": [w.path for w in wholes],
        "size": pa.array([w.hashed.size for w in wholes], pa.int64()), "sha256": [w.hashed.sha256 for w in wholes],
        "format": [w.log.format for w in wholes], "compression": [w.log.compression for w in wholes],
        "ingested_at": pa.array([dt.datetime.now(dt.UTC)] * n, pa.timestamp("us", "UTC")),
        "toolkit_version": [__version__] * n,
        "records_read": pa.array([sum(b.plain_rows for b in w.blocks) + staged.get(i, 0)
                                  for i, w in zip(ids, wholes, strict=True)], pa.int64()),
        "adapter": [w.log.adapter for w in wholes], "lines_ignored": pa.array([w.ignored for w in wholes], pa.int64()),
    })
    assert tuple(files.column_names) == _FILES_COLUMNS
    scan(con, files, "new_files", "INSERT INTO files SELECT * FROM new_files")
    if file_notes:
        con.executemany("INSERT INTO file_notes VALUES (?, ?, ?, ?)", file_notes)
    return all_notes


@dataclass(frozen=True)
class _SplitRun:
    """Files one after the other in a group, each read whole as one part of the same split, the
    parts one after the other too: their rows are slices of the split's tables, one a kind."""

    split: FilesSplit
    part: int  # the first file's
    ids: np.ndarray  # the files' ids, in order


def _split_runs(ids: range, wholes: Sequence[WholeFile]) -> Iterator[_SplitRun | tuple[int, WholeFile]]:
    """The files (numbered ``ids``) as runs of parts of one split, and each other file alone."""
    run: list[int] = []  # (file ids)
    split: FilesSplit | None = None
    part = 0
    for i, w in zip(ids, wholes, strict=True):
        block = w.blocks[0] if len(w.blocks) == 1 and not w.text else None
        if isinstance(block, FilePart) and block.split is split and block.part == part + len(run):
            run.append(i)
            continue
        if run:
            assert split is not None
            yield _SplitRun(split, part, np.array(run, dtype=np.int32))
        if isinstance(block, FilePart):
            run, split, part = [i], block.split, block.part
        else:
            run, split = [], None
            yield i, w
    if run:
        assert split is not None
        yield _SplitRun(split, part, np.array(run, dtype=np.int32))


#: The columns of ``files``, in order.
_FILES_COLUMNS = ("file_id", "path", "size", "sha256", "format", "compression", "ingested_at", "toolkit_version",
                  "records_read", "adapter", "lines_ignored")


def _tagged(table: pa.Table, file_id: int) -> pa.Table:
    """``table``'s rows with their file's id (a stage holds the lines of several files)."""
    return table.append_column("file_id", pa.array(np.full(table.num_rows, file_id, dtype=np.int32)))


class _Rows:
    """Rows of several files, to go in as one table, each row with its file's id: runs of files
    whose rows follow each other in a table (a file's own table, or a :class:`FilesSplit`'s)."""

    def __init__(self) -> None:
        self.runs: list[tuple[pa.Table, np.ndarray, np.ndarray]] = []  # a table, where each file's rows start
        # (and the last's end), the files' ids

    def add(self, file_ids: np.ndarray, table: pa.Table, at: np.ndarray) -> None:
        """Take ``table``'s rows of the files ``file_ids``: the ``k``-th's from ``at[k]`` to ``at[k + 1]``."""
        if at[-1] > at[0]:
            self.runs.append((table, at, file_ids))

    def table(self) -> pa.Table:
        """The rows as one table, in few pieces (DuckDB scans a table of many small pieces slowly);
        a kind's tables have the columns their rows have, the others' NULL here."""
        pieces = []
        for _, same in itertools.groupby(self.runs, key=lambda run: id(run[0])):
            runs = list(same)
            table = runs[0][0]
            starts = np.concatenate([at[:-1] for _, at, _ in runs]).astype(np.int64)
            stops = np.concatenate([at[1:] for _, at, _ in runs]).astype(np.int64)
            ids = np.concatenate([file_ids for _, _, file_ids in runs])
            rows = stops > starts
            starts, stops, ids = starts[rows], stops[rows], ids[rows]
            # a slice of each stretch of files one after the other (a file passed over breaks one;
            # Arrow takes no rows of a string view by index)
            breaks = np.flatnonzero(starts[1:] != stops[:-1]) + 1
            firsts, lasts = np.r_[0, breaks], np.r_[breaks, len(starts)] - 1
            piece = pa.concat_tables([table.slice(starts[a], stops[b] - starts[a])
                                      for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)])
            pieces.append(piece.append_column("file_id", pa.array(np.repeat(ids.astype(np.int32), stops - starts))))
        whole = pa.concat_tables(pieces, promote_options="permissive")
        return whole.combine_chunks() if whole.column(0).num_chunks > _FEW_PIECES else whole


#: A table of more pieces than this is put in one before it goes in.
_FEW_PIECES = 16


def _unopened(con: duckdb.DuckDBPyConnection, passed: PassedOver) -> FileResult:
    """A file or folder the system would not open (:func:`~forensics.ingestion.readers.discover`),
    refused as a damaged file is: in ``refused_files``, and in the result with why."""
    result = unopened(passed)
    _refuse(con, result.path, result.size, None, passed.why)
    return result


def unopened(passed: PassedOver) -> FileResult:
    """The result of a file or folder the system would not open: refused, with why (the Spark path
    lists them alike)."""
    return FileResult(path=passed.path, sha256="", size=_size_or_zero(Path(passed.path)), format="unknown",
                      compression="unknown", status="refused", counts=Counts(), why=passed.why)


def _forget_listed(con: duckdb.DuckDBPyConnection, searched: Sequence[Path], refused: set[str]) -> None:
    """Take off ``refused_files`` the folders refused before, under a folder ``searched`` now, that
    were listed this time (their files are read as any other): a file is taken off as it is read."""
    under = [Path(path_text(folder)) for folder in searched]
    for (path,) in con.execute("SELECT path FROM refused_files").fetchall():
        if path not in refused and os.path.isdir(path) and any(Path(path).is_relative_to(f) for f in under):
            con.execute("DELETE FROM refused_files WHERE path = ?", [path])


def _refuse(con: duckdb.DuckDBPyConnection, path: str, size: int, sha256: str | None, why: str) -> None:
    """``path`` in ``refused_files``, in place of an earlier refusal of it."""
    con.execute("DELETE FROM refused_files WHERE path = ?", [path])
    con.execute("INSERT INTO refused_files VALUES (?, ?, ?, ?, ?, ?)",
                [path, size, sha256, why, dt.datetime.now(dt.UTC), __version__])


def _size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _ingest_file(
    con: duckdb.DuckDBPyConnection, log: LogFile, hashing: Digest, progress: Progress | None,
    options: Options, ahead: ReadAhead, columns: dict[str, tuple[str, ...]], settler: Settler,
) -> FileResult:
    size = _size_of(log.path)
    # Only a file of a size the case holds can be in it already; any other starts loading while it
    # is hashed (the first file's hash held the whole ingest up: 0.2 to 0.4 s).
    if one(con, "SELECT count(*) FROM files WHERE size = ?", [size]) != (0,):
        hashed = hashing.result()
        known = one(con, "SELECT lines_ignored FROM files WHERE sha256 = ?", [hashed.sha256])
        if known:
            if fast_path(log):
                ahead.skip(log)
            return FileResult(status="already_in_case", ignored=int(known[0]), **_identity(log, hashed))
    notes = Notes()
    ignored = [0]
    con.execute("BEGIN TRANSACTION")
    try:
        file_id = _next_file_id(con)
        read = _load(con, file_id, log, progress, size, options, notes, ignored, ahead, columns)
        hashed = hashing.result()
        if hashed.size != size or not hashed.unchanged(log.path):
            # a live log, written or truncated (logrotate's copytruncate) while it was read: what was
            # read is not what the manifest's hash stands for
            raise changed(log.path)
        _check_strict_json(con)
        # the file's row goes in before its records settle: its lines are read back by its format
        con.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [file_id, path_text(log.path), size, hashed.sha256, log.format, log.compression,
             dt.datetime.now(dt.UTC), __version__, read, log.adapter, ignored[0]],
        )
        if notes.counts:
            con.executemany("INSERT INTO file_notes VALUES (?, ?, ?, ?)",
                            [[file_id, key, count, text] for key, count, text in notes.rows()])
        settler(con, file_id, columns)
        con.execute("DELETE FROM refused_files WHERE path = ?", [path_text(log.path)])
        con.execute("COMMIT")
    except BaseException:
        _roll_back(con)
        raise
    con.execute("DROP TABLE IF EXISTS stage")
    return FileResult(status="ingested", ignored=ignored[0], notes=tuple(notes.lines()), **_identity(log, hashed))


def _roll_back(con: duckdb.DuckDBPyConnection) -> None:
    """Roll the file's transaction back (store.roll_back: after a COMMIT the disk refused, that
    error is the one reported), and its stage with it."""
    roll_back(con)
    con.execute("DROP TABLE IF EXISTS stage")


def _identity(log: LogFile, hashed: Hashed, path: str | None = None) -> dict[str, Any]:
    """A file's result fields that say which file it is (``path``: its :func:`path_text`, if made already)."""
    return dict(path=path_text(log.path) if path is None else path, sha256=hashed.sha256, size=hashed.size,
                format=log.format, compression=log.compression, counts=Counts(), adapter=log.adapter)


def _size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise UnreadableFile(f"{shown(path)}: cannot be read ({exc.strerror})") from exc


def _next_file_id(con: duckdb.DuckDBPyConnection) -> int:
    row = one(con, "SELECT coalesce(max(file_id), 0) + 1 FROM files")
    assert row is not None
    return int(row[0])


#: At most this many row groups of a kind wait for the next block before they go in.
STATEMENT_GROUPS = 6

LINES_STAGE = stage_sql("chunk", by_file=True)
#: The statements that stage plain lines that keep the rules and those that do not, for chunks
#: without and with their file's id (``by_file``).
PLAIN_STAGES = {
    by_file: (plain_stage_sql("(FROM chunk WHERE rules_ok)", rules_kept=True, by_file=by_file),
              plain_stage_sql("(FROM chunk WHERE NOT rules_ok)", by_file=by_file))
    for by_file in (False, True)
}


def _load(
    con: duckdb.DuckDBPyConnection, file_id: int, log: LogFile, progress: Progress | None, size: int,
    options: Options, notes: Notes, ignored: list[int], ahead: ReadAhead, columns: dict[str, tuple[str, ...]],
) -> int:
    """Read the file: plain lines straight into their kind's table (or quarantine), the others
    validated into the temp table ``stage``. The number of records read. ``columns``: each
    kind's table's columns (:func:`record_columns`).

    A kind's plain rows go in whole DuckDB row groups, which DuckDB writes straight to the case
    file: each kind's rows wait until they fill two groups, and where the next block is split
    already, for it too (up to :data:`STATEMENT_GROUPS`; larger statements run on more cores).
    The last groups of each kind wait on until the file's end and go in with the rest of its
    rows, in one statement: rows left short of a group by a statement of their own would go
    through the write-ahead log at commit.
    """
    con.execute("CREATE TEMP TABLE stage AS FROM stage_columns")
    done = 0
    plain = 0

    def count_ignored(n: int) -> None:
        ignored[0] = n

    waiting: dict[str, list[pa.Table]] = {kind: [] for kind in KINDS}  # not yet in a statement
    held: dict[str, pa.Table] = {}  # whole groups, held back in case the file ends after them
    text = source.Store(con)  # the text of the lines read (the fast path's blocks carry it)
    leap = 0
    for block in read_blocks(log, ahead, options, notes, count_ignored):
        text.add(file_id, block.text)
        for kind, rows in block.kinds:
            plain += rows.num_rows
            leap += _leap_seconds(rows)
            if kind is None:  # no known kind: every line breaks a rule, so none waits for a row group
                _load_plain(con, None, _tagged(rows, file_id), ())
            else:
                waiting[kind].append(rows)
        # where the next block is split already, its rows join the statement: DuckDB inserts
        # larger statements on more cores (bench/README.md)
        more = fast_path(log) and ahead.next_ready()
        for kind, queue in waiting.items():
            rows_waiting = sum(t.num_rows for t in queue)
            if rows_waiting >= 2 * ROW_GROUP and (not more or rows_waiting >= STATEMENT_GROUPS * ROW_GROUP):
                whole = pa.concat_tables(queue)
                n = whole.num_rows // ROW_GROUP * ROW_GROUP
                if kind in held:
                    _load_plain(con, kind, _tagged(held[kind], file_id), columns[kind])
                held[kind] = whole.slice(0, n)
                waiting[kind] = [whole.slice(n)] if n < whole.num_rows else []
        if block.lines.num_rows:
            scan(con, _tagged(block.lines, file_id), "chunk", f"INSERT INTO stage BY NAME {LINES_STAGE}")
        done += block.nbytes
        if progress is not None:
            progress(log.path, min(done, size), size)
    for kind, queue in waiting.items():
        last = ([held[kind]] if kind in held else []) + queue
        if last:
            _load_plain(con, kind, _tagged(pa.concat_tables(last), file_id), columns[kind])
    if not fast_path(log):
        text.add(file_id, source_pieces(log))
    text.flush()
    row = one(con, "SELECT count(*) FROM stage WHERE q_reason IS NULL AND contains(coalesce(doc, raw), ':59:60') "
                   "AND regexp_matches(coalesce(doc, raw), ?)", [_LEAP_IN_LINE])  # (the regex only where it may match)
    leap += int(row[0]) if row else 0
    if leap:
        notes.add("leap", _LEAP_NOTE, leap)
    return plain + count(con, "stage")


def _leap_seconds_by_file(rows: pa.Table) -> Counter[int]:
    """:func:`_leap_seconds` of plain ``rows`` of several files, by their file's id."""
    if "ts_text" not in rows.column_names or not rows["ts_us"].null_count:
        return Counter()
    unread = pc.is_null(rows["ts_us"])
    times = pc.filter(rows["ts_text"].cast(pa.large_string()), unread)
    leap = pc.fill_null(pc.match_substring_regex(times, _LEAP_SECOND), False)
    return Counter(pc.filter(pc.filter(rows["file_id"], unread), leap).to_pylist())


def _leap_seconds(rows: pa.Table) -> int:
    """How many of the fast path's plain ``rows`` give a time at a leap second (left to DuckDB)."""
    if "ts_text" not in rows.column_names or not rows["ts_us"].null_count:  # (a leap second is never read there)
        return 0
    times = pc.filter(rows["ts_text"].cast(pa.large_string()), pc.is_null(rows["ts_us"]))
    return int(pc.sum(pc.match_substring_regex(times, _LEAP_SECOND)).as_py() or 0)


_LEAP_NOTE = "{n} times at a leap second (hh:59:60) read as the next second"
#: A time at a leap second, in a time's text and in a record's line.
_LEAP_SECOND = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}.[0-9]{2}:59:60"
_LEAP_IN_LINE = r'"ts"\s*:\s*"[0-9]{4}-[0-9]{2}-[0-9]{2}.[0-9]{2}:59:60' 


def _load_plain(con: duckdb.DuckDBPyConnection, kind: str | None, chunk: pa.Table, columns: Sequence[str]) -> None:
    """Plain lines of one kind (each with its file's id) into its table (``columns``); the few a
    check refuses, into quarantine.

    ``kind`` None: lines whose kind the schema does not know, all of them for quarantine.
    Lines that keep the schema's rules (nearly all) are checked for their time only; the others
    take the whole chain of checks, a statement DuckDB takes about 50 ms to plan.
    Columns no record of the chunk has are left to their default (NULL): writing them costs
    as much as writing data.
    """
    chunk = batched(chunk, ROW_GROUP)
    cols = ", ".join(c for c in columns if _has_values(chunk, c))
    for stage, lines in plain_stages(chunk):
        kept = 0
        if kind is not None:
            kept = int(scan(
                con, chunk, "chunk",
                f"INSERT INTO {RECORD_TABLES[kind]} (file_id, line_no, part, {cols}) "
                f"SELECT file_id, line_no, part, {cols} FROM ({stage}) WHERE q_reason IS NULL",
            )[0][0])
        if kept < lines:  # the checks run again only where some line failed them
            quarantined = int(scan(
                con, chunk, "chunk",
                "INSERT INTO quarantine SELECT file_id, line_no, q_reason, q_detail, raw, NULL "
                f"FROM ({stage}) WHERE q_reason IS NOT NULL",
            )[0][0])
            assert kept + quarantined == lines, "a plain line neither kept nor quarantined"


def plain_stages(chunk: pa.Table) -> list[tuple[str, int]]:
    """The statements that stage the plain lines of ``chunk`` (registered as ``chunk``): for the
    lines that keep the schema's rules, and for the others where there are any; with how many
    lines each stages (with their file's id where ``chunk`` has it)."""
    kept = int(pc.sum(chunk.column("rules_ok")).as_py() or 0)
    kept_stage, broken_stage = PLAIN_STAGES["file_id" in chunk.column_names]
    stages = [(kept_stage, kept), (broken_stage, chunk.num_rows - kept)]
    return [(stage, lines) for stage, lines in stages if lines]


def _has_values(chunk: pa.Table, column: str) -> bool:
    """Whether any plain record of ``chunk`` has a value for the record column ``column``."""
    if column == "doc":
        return False  # a plain line is its own document
    source = PLAIN_SOURCE.get(column, column)
    if column == "boot" or source not in chunk.column_names:  # boot defaults to 0; ts, rec_hash
        return True
    return chunk.column(source).null_count < chunk.num_rows


#: A JSON string (DuckDB has checked the line is JSON: its strings are well formed).
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_LENIENT = re.compile(LENIENT_SUSPECT)


def _strict_json_ok(text: str) -> bool:
    """Whether a line DuckDB's parser took is strict JSON too: no trailing comma and no nan or
    inf outside its strings. A scan, not a parse: a line nested however deep is read in one pass
    (Python's parser gives up past about a thousand levels)."""
    return _LENIENT.search(_JSON_STRING.sub('""', text)) is None


def _check_strict_json(con: duckdb.DuckDBPyConnection) -> None:
    """Lines DuckDB's lenient parser took (trailing commas, nan, inf) but JSON does not: not_json."""
    rows = con.execute(
        "SELECT file_id, line_no, coalesce(doc, raw) FROM stage WHERE suspect"
    ).fetchall()
    bad = [(file_id, line) for file_id, line, text in rows if not _strict_json_ok(text)]
    if bad:
        con.execute(
            "UPDATE stage SET q_reason = ?, q_detail = 'not strict JSON (a trailing comma, or nan or inf)', "
            "rec_hash = NULL FROM (SELECT unnest(?::INTEGER[]) AS f, unnest(?::BIGINT[]) AS l) bad "
            "WHERE stage.file_id = bad.f AND stage.line_no = bad.l",
            [Reason.NOT_JSON.value, [f for f, _ in bad], [line for _, line in bad]],
        )
