"""Ingest: log files in, every record ingested, a duplicate or quarantined, in one case.

- ``readers``: finding files and reading them as numbered lines or typed blocks, whatever their
  format and compression (engine logs through :mod:`forensics.adapters`);
- ``validate``: the schema's rules as SQL, generated from :mod:`forensics.schema`: the reference
  every line is held to;
- ``fast``: the compiled fast path for plain JSON lines (and the record hash), held to
  ``validate`` by tests, used unless ``ingest(..., fast=False)``;
- ``pipeline``: the whole ingest, one transaction a file, and settling (duplicates, conflicts,
  pages beyond the pool);
- ``source``: the verbatim lines every record points back to.

(The package is ``ingestion``, not ``ingest``: ``forensics.ingest`` is the function.)
"""

from forensics.ingestion.pipeline import Counts, FileResult, IngestResult, Progress, ingest

__all__ = ["Counts", "FileResult", "IngestResult", "Progress", "ingest"]
