"""The fast-path files of an ingest read and split in worker threads ahead of their loading, small
files each in one read that hashes it too; and a file's blocks, whichever path it takes."""

from __future__ import annotations

import hashlib
import itertools
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics import adapters
from forensics.errors import UnreadableFile
from forensics.ingestion.readers.blocks import Block, FilePart, WholeBlock, _split, _split_files
from forensics.ingestion.readers.lines import LineBlock, _line_blocks, _long_details
from forensics.ingestion.readers.logfile import LogFile, fast_path
from forensics.ingestion.readers.opening import Hashed, _decoding, _open_regular_fd, changed
from forensics.ingestion.readers.tables import read_chunks

#: DuckDB's row group. Rows inserted in whole groups are written straight to the case file; an
#: insert of part of a group waits in the transaction and goes through the write-ahead log at
#: commit, which costs about as much again.
ROW_GROUP = 122_880
#: JSON Lines for the fast path come in blocks of whole row groups (the next block splits while
#: this one loads), read this much at a time; lines too long for that are cut at this size.
PLAIN_BLOCK_LINES = 2 * ROW_GROUP
PLAIN_READ_BYTES = 64 << 20
#: Small files are split together, up to this many files or bytes at once (a split's fixed cost,
#: 0.75 ms, is everything for a file of 50 lines).
SPLIT_FILES = 512
SPLIT_BYTES = 16 << 20
#: A small file is read this much at a time: a buffer of PLAIN_READ_BYTES cost 0.5 ms a file. A
#: file found small and this large when read whole (:func:`read_small`) has changed since found.
SMALL_READ_BYTES = 2 << 20


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
