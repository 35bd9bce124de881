"""Finding the log files under the paths given, and what each is: its format, its compression and
the adapter that reads it; the files passed over, with why; and the files an adapter reads along
with one of them, where its ``companions`` say (a request-log file's server log, a server log's
request-log folder)."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import zstandard

from forensics import adapters, compiled
from forensics.adapters.base import Place
from forensics.errors import InputNotFound, UnreadableFile, UnrecognisedFile
from forensics.ingestion.readers.lines import text_lines
from forensics.ingestion.readers.logfile import Limits, LogFile, fast_path
from forensics.ingestion.readers.opening import _open_regular_fd, open_binary
from forensics.text import path_text, shown

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_PARQUET_MAGIC = b"PAR1"
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


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


def identify(path: Path, *, explicit: bool, adapter: str | None = None, size: int | None = None,
             limits: Limits = Limits()) -> LogFile | None:  # noqa: B008 (Limits is frozen)
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


def companions(log: LogFile, options: adapters.Options) -> adapters.Companions:
    """The files the adapter of ``log`` reads along with it, where its ``companions`` say."""
    return find_beside(log.path, adapters.get(log.adapter).companions, options)


def translated(adapter: adapters.Adapter, lines: adapters.Lines, path: Path, options: adapters.Options,
               notes: adapters.Notes) -> Iterator[adapters.Outcome]:
    """``adapter``'s outcomes of the file at ``path`` (its ``lines``), read with the companions found
    beside it, as the ingest reads it (a notebook's or a test's way to call an adapter)."""
    assert adapter.translate is not None, "the canonical format is read, not translated"
    return adapter.translate(lines, path, options, notes, find_beside(path, adapter.companions, options))


def find_beside(path: Path, wanted: Mapping[str, adapters.Beside], options: adapters.Options) -> adapters.Companions:
    """The companions of ``path``, found when its adapter asks for them by a name ``wanted`` declares
    (:class:`~forensics.adapters.Beside`): each file in the places named that the sniffs read with
    one of the adapters named, with its lines, by name."""

    def find(name: str) -> list[tuple[Path, adapters.Lines]]:
        beside = wanted.get(name)
        if beside is None:
            return []
        found = []
        for place in beside.places:
            folder, named = _place(path, place, options)
            files = _read_with(folder, beside.adapters, path, named)
            if beside.one and len(files) == 1:
                return files
            if not beside.one:
                found += files
        return found

    return find


def _place(path: Path, place: Place, options: adapters.Options) -> tuple[Path, str | None]:
    """A :class:`~forensics.adapters.Beside` place of ``path``: its folder, and the node its files
    must be of (None: any)."""
    if place == "node":  # the folder named after the file's node beside it
        return path.parent / options.node_for(path), None
    if place == "up":  # the folder above the file's, its files of the node the file's folder is named after
        return path.parent.parent, path.parent.name
    return path.parent, None  # here: the file's own folder


def _read_with(folder: Path, names: tuple[str, ...], besides: Path,
               named: str | None) -> list[tuple[Path, adapters.Lines]]:
    """The files in ``folder`` (other than ``besides``; of node ``named`` if given) that the sniffs
    read with one of the adapters ``names``, with their lines, by name."""
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    found = []
    for p in entries:
        if p == besides or not p.is_file() or (named is not None and adapters.node_of(p) != named):
            continue
        try:
            log = identify(p, explicit=False)
        except (UnreadableFile, OSError):  # (an unreadable neighbour is not one of them)
            continue
        if log is not None and log.adapter in names:
            found.append((p, text_lines(log)))
    return found

