"""The whole job behind ``kvforensics investigate ... --out report.html``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import forensics
from forensics.store import connect, one
from replay.replay import ReplayResult, WhatIf, default_out, replay
from reports.render import ReportResult, report

#: Replays run by the whole job: the engine the incident ran (confirmation) and the fix (what-if).
JOB_REPLAYS = ("sglang-placeholder", "sglang-hardened")


@dataclass
class JobResult:
    investigation: forensics.Investigation
    replays: list[ReplayResult] = field(default_factory=list)
    report: ReportResult | None = None
    replay_skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = self.investigation.as_dict()
        out["replays"] = [r.as_dict() for r in self.replays]
        if self.replay_skipped:
            out["replay_skipped"] = self.replay_skipped
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
    paths: list[Path],
    db: Path,
    out: Path | None,
    *,
    audience: str = "internal",
    pseudonymize_key: str | None = None,
    generated_at: str | None = None,
    with_replay: bool = True,
    progress: Any = None,
) -> JobResult:
    """Ingest and analyse; replay to confirm and ask what-if where the evidence allows; report."""
    result = JobResult(forensics.investigate(paths, db, progress=progress))
    if out is None:
        return result
    if with_replay:
        why_not = replayable(db)
        if why_not is None:
            for engine in JOB_REPLAYS:
                result.replays.append(replay(db, engine, default_out(db, engine, WhatIf())))
        else:
            result.replay_skipped = why_not
    else:
        result.replay_skipped = "not asked (--no-replay)"
    result.report = report(db, out, audience=audience, pseudonymize_key=pseudonymize_key,
                           generated_at=generated_at)
    return result
