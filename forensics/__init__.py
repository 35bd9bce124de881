"""kvforensics: find every response that attended to another request's KV-cache pages.

The names below load on first use, so that ``forensics.emit`` (standard library only) can be
imported into an engine without DuckDB, Polars or Arrow. No submodule is named like one of
them (ingest lives in ``ingestion``): importing a submodule sets the package attribute of its
name, which would hide the function.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forensics.version import __version__

_WHERE = {
    "Case": "forensics.case", "RequestReport": "forensics.case", "Summary": "forensics.case",
    "quarantined": "forensics.case", "KvfError": "forensics.errors", "Finding": "forensics.findings",
    "Findings": "forensics.findings", "Counts": "forensics.ingestion", "FileResult": "forensics.ingestion",
    "IngestResult": "forensics.ingestion", "ingest": "forensics.ingestion", "Investigation": "forensics.investigation",
    "investigate": "forensics.investigation", "Limits": "forensics.ingestion",
}

if TYPE_CHECKING:
    from forensics.case import Case, RequestReport, Summary, quarantined
    from forensics.errors import KvfError
    from forensics.findings import Finding, Findings
    from forensics.ingestion import Counts, FileResult, IngestResult, Limits, ingest
    from forensics.investigation import Investigation, investigate


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'forensics' has no attribute {name!r}")


__all__ = [
    "Case", "Counts", "FileResult", "Finding", "IngestResult", "Investigation", "Findings", "KvfError",
    "Limits", "RequestReport", "Summary", "__version__", "ingest", "investigate", "quarantined",
]
