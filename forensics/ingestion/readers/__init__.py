"""Finding log files and reading them as numbered lines, whatever their format and compression.

- ``logfile``: a file to read (:class:`LogFile`), the reader's bounds (:class:`Limits`), whether it
  is small and whether it takes the fast path;
- ``discovery``: finding the files under the paths given and what each is (format, compression,
  adapter), the files passed over with why, and the companions an adapter reads a file with;
- ``opening``: opening a regular file, as big as when opened, decompressed within bounds; a file
  as hashed, to tell whether it changed while read;
- ``lines``: reading bounded lines, as text and as blocks of whole lines;
- ``tables``: a file's records as tables of lines (JSON Lines, CSV, Parquet, engine logs) and its
  text for ``source_lines``, off the fast path;
- ``blocks``: the fast path's split of plain lines into typed blocks, of a file or many small ones;
- ``readahead``: the fast-path files read and split in threads ahead of their loading, small files
  in one read each; a file's blocks, whichever path it takes.
"""

from forensics.adapters.base import LINES_SCHEMA
from forensics.ingestion.readers.blocks import Block, FilePart, FilesSplit
from forensics.ingestion.readers.discovery import PassedOver, discover, identify, translated
from forensics.ingestion.readers.lines import _line_bounds as _line_bounds  # (bench/decoders.py)
from forensics.ingestion.readers.lines import text_lines
from forensics.ingestion.readers.logfile import KEPT_OF_LONG_LINE, Limits, LogFile, fast_path
from forensics.ingestion.readers.opening import Hashed, changed, open_regular
from forensics.ingestion.readers.readahead import ROW_GROUP, ReadAhead, read_blocks
from forensics.ingestion.readers.tables import batched, source_pieces

__all__ = [
    "KEPT_OF_LONG_LINE", "LINES_SCHEMA", "ROW_GROUP", "Block", "FilePart", "FilesSplit", "Hashed", "Limits",
    "LogFile", "PassedOver", "ReadAhead", "batched", "changed", "discover", "fast_path", "identify",
    "open_regular", "read_blocks", "source_pieces", "text_lines", "translated",
]
