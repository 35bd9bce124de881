"""The main job: ingest a log set, analyse it, and give the figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from forensics.adapters import Options
from forensics.exposure.analysis import analyse
from forensics.ingestion import IngestResult, Progress, ingest
from forensics.ingestion.readers import Limits
from forensics.store import connect


@dataclass(frozen=True)
class Investigation:
    """What ``investigate`` found: how the records ended, and the exposure figures."""

    ingest: IngestResult
    exposure: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        """The investigation as JSON-ready data (what ``investigate --json`` prints)."""
        data = self.ingest.as_dict()
        return {
            "db": data["db"],
            "records": data["records"],
            "exposure": self.exposure,
            "files": data["files"],
            "skipped": data["skipped"],
            "refused": data["refused"],
            "case": data["case"],
        }


def investigate(
    paths: Sequence[Path | str],
    db: Path | str,
    *,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    fast: bool | None = None,
    limits: Limits | None = None,
) -> Investigation:
    """Ingest ``paths`` into the case ``db`` (``format`` and ``options`` as for :func:`ingest`),
    rebuild its timelines and exposures. ``fast``: the compiled accelerators (True), none (False),
    or each where the input is large enough to gain from it (None). ``limits``: the reader's bounds."""
    result = ingest(paths, db, progress=progress, format=format, options=options, fast=fast, limits=limits)
    con = connect(db)
    try:
        figures = analyse(con, fast=fast)
    finally:
        con.close()
    return Investigation(result, figures)
