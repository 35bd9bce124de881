"""A log file to read: where it is, how to decode it, and the reader's bounds on it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from forensics.errors import BadOption

#: A file up to this size (as stored) is small: ingest reads it whole and puts it in with the
#: small files around it (forensics.ingestion.pipeline), and the fast path splits it with them.
SMALL_FILE = 1 << 20


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


def fast_path(log: LogFile) -> bool:
    """Whether the file's plain lines take the compiled fast path (canonical JSON Lines)."""
    return log.fast and log.adapter == "canonical" and log.format == "jsonl"
