"""Opening a file to read: regular files only, read no further than their size when opened,
decompressed within bounds; and what a file was when hashed, to tell whether it changed."""

from __future__ import annotations

import gzip
import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import zstandard

from forensics.errors import FileChanged, UnreadableFile
from forensics.ingestion.readers.logfile import EXPANSION_FLOOR, LogFile
from forensics.text import shown


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


@contextmanager
def _decoding(log: LogFile) -> Iterator[None]:
    """A file that fails to decode (bad compression, not its format) raises UnreadableFile."""
    try:
        yield
    except (OSError, EOFError, ValueError, pa.ArrowException, zstandard.ZstdError) as exc:
        if isinstance(exc, UnreadableFile):
            raise
        raise UnreadableFile(f"{log.path}: cannot be decoded as {log.format} ({exc})") from exc
