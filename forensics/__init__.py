"""kvforensics: find every response that attended to another request's KV-cache pages."""

from __future__ import annotations

__version__ = "0.1.0"

from forensics.case import Case, RequestReport, Summary, quarantined  # noqa: E402
from forensics.errors import KvfError  # noqa: E402
from forensics.findings import Finding, Findings  # noqa: E402
from forensics.ingest import Counts, FileResult, IngestResult, ingest  # noqa: E402
from forensics.investigation import Investigation, investigate  # noqa: E402

__all__ = [
    "Case", "Counts", "FileResult", "Finding", "Findings", "IngestResult", "Investigation", "KvfError",
    "RequestReport", "Summary", "__version__", "ingest", "investigate", "quarantined",
]
