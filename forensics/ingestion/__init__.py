"""Ingest: log files in, every record ingested, a duplicate or quarantined, in one case.

- ``readers``: finding files and reading them as numbered lines or typed blocks, whatever their
  format and compression (engine logs through :mod:`forensics.adapters`);
- ``validate``: the schema's rules as SQL, generated from :mod:`forensics.schema`: the reference
  every line is held to;
- ``recordhash``: a record's identity, MurmurHash3 of its canonical JSON (the ``mmh3`` library);
- ``fast``: the compiled fast path for plain JSON lines (with the same hash compiled), held to
  ``validate`` by tests; ``ingest(..., fast=None)`` takes it for large logs;
- ``pipeline``: the whole ingest, one transaction a file;
- ``settle``: each file's records to their end: duplicates, conflicts, pages beyond the pool
  (statements in ``sql/settle.sql``);
- ``source``: the verbatim lines every record points back to.

(The package is ``ingestion``, not ``ingest``: ``forensics.ingest`` is the function.)
"""

from forensics.ingestion.pipeline import Counts, FileResult, IngestResult, Progress, ingest
from forensics.ingestion.readers import Limits, PassedOver

__all__ = ["Counts", "FileResult", "IngestResult", "Limits", "PassedOver", "Progress", "ingest"]
