"""The whole job behind ``kvforensics investigate ... --out report.html``: ingest and analyse,
replay to confirm and ask what-if where the evidence allows, fill in the replay-backed tiers
where page records are missing, and write the report. The one module that drives
``forensics``, ``replay`` and ``reports`` together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forensics.adapters import Options
from forensics.exposure.tiers import Filled, fill_from_replay
from forensics.ingestion import Progress
from forensics.ingestion.readers import Limits
from forensics.investigation import Investigation, investigate
from forensics.outputs import check_target
from forensics.store import connect, one
from replay.replay import ReplayResult, WhatIf, default_out, replay
from reports.render import ReportResult, report

#: Replays run by the whole job: the engine the incident ran (confirmation) and the fix (what-if).
JOB_REPLAYS = ("sglang-placeholder", "sglang-hardened")


@dataclass(frozen=True)
class JobResult:
    """What the whole job did: the investigation, its replays, what they filled in, the report."""

    investigation: Investigation
    replays: tuple[ReplayResult, ...] = ()
    report: ReportResult | None = None
    replay_skipped: str | None = None
    filled: Filled | None = None  # nodes and windows without page records, filled by replay

    def as_dict(self) -> dict[str, Any]:
        """The whole job as JSON-ready data (what ``investigate --out --json`` prints)."""
        out = self.investigation.as_dict()
        out["replays"] = [r.as_dict() for r in self.replays]
        if self.replay_skipped:
            out["replay_skipped"] = self.replay_skipped
        if self.filled is not None:
            out["filled_by_replay"] = self.filled.as_dict()
        if self.report is not None:
            out["report"] = self.report.as_dict()
        return out


def replayable(db: Path | str) -> str | None:
    """Why the case cannot be replayed, or None when it can (engine configs and requests)."""
    con = connect(db, read_only=True, create=False)
    try:
        row = one(con, "SELECT (SELECT count(*) FROM configs WHERE role IN ('prefill', 'decode')), "
                       "(SELECT count(*) FROM request_events WHERE event = 'received')")
    finally:
        con.close()
    assert row is not None
    if not row[0]:
        return "no prefill or decode config records"
    if not row[1]:
        return "no received request records"
    return None


def run(
    paths: Sequence[Path | str],
    db: Path | str,
    out: Path | str | None,
    *,
    audience: str = "internal",
    pseudonymize_key: str | None = None,
    generated_at: str | None = None,
    with_replay: bool = True,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    limits: Limits | None = None,
) -> JobResult:
    """Ingest and analyse ``paths`` into ``db``; with ``out``, also replay, fill in and report."""
    if out is not None:
        check_target(Path(out))  # refused before hours of work, not after
    found = investigate(paths, db, progress=progress, format=format, options=options, limits=limits)
    if out is None:
        return JobResult(found)
    replays: tuple[ReplayResult, ...] = ()
    filled = None
    skipped = None if with_replay else "not asked (--no-replay)"
    if with_replay:
        skipped = replayable(db)
        if skipped is None:
            replays = tuple(replay(db, engine, default_out(db, engine, WhatIf())) for engine in JOB_REPLAYS)
            filled = fill_from_replay(db, replays[0].out / "replay.duckdb")
    written = report(db, out, audience=audience, pseudonymize_key=pseudonymize_key, generated_at=generated_at)
    return JobResult(found, replays, written, skipped, filled)
