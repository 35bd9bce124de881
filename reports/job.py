"""The whole job behind ``kvforensics investigate ... --out report.html``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import forensics
from forensics.adapters import Options
from forensics.findings import specs
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
    filled: dict[str, Any] | None = None  # nodes without page records, filled by replay

    def as_dict(self) -> dict[str, Any]:
        out = self.investigation.as_dict()
        out["replays"] = [r.as_dict() for r in self.replays]
        if self.replay_skipped:
            out["replay_skipped"] = self.replay_skipped
        if self.filled is not None:
            out["filled_by_replay"] = self.filled
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


def fill_from_replay(db: Path | str, confirmation: ReplayResult) -> dict[str, Any]:
    """Exposures where page records are missing, taken from the replay that follows the logs
    (``sglang-placeholder``) into the case's ``replay_exposures``: on engine nodes that logged
    requests but no page records, and inside the windows of a node's seq gaps (by time)."""
    gap_sql = next(spec.sql for spec in specs() if spec.id == "evidence.seq_gap")
    con = connect(db)
    try:
        missing = [n for (n,) in con.execute(
            "SELECT DISTINCT node FROM configs WHERE role IN ('prefill', 'decode') "
            "AND node IN (SELECT node FROM request_events) AND node NOT IN (SELECT node FROM kv_ops) "
            "ORDER BY node").fetchall()]
        con.execute(f"CREATE OR REPLACE TEMP TABLE gap_windows AS SELECT node, window_start, window_end "
                    f"FROM ({gap_sql}) WHERE node IN (SELECT node FROM kv_ops)")
        replayed = str(confirmation.out / "replay.duckdb").replace("'", "''")
        con.execute(f"ATTACH '{replayed}' AS replayed (READ_ONLY)")
        try:
            con.execute("""
                CREATE OR REPLACE TABLE replay_exposures AS
                SELECT e.* EXCLUDE (evidence),
                       CASE WHEN EXISTS (
                         SELECT 1 FROM transfers t JOIN requests q USING (request_id)
                         WHERE t.request_id = e.reader_request AND t.dst_node = e.node AND t.event = 'completed'
                           AND t.tokens_sent < q.prompt_tokens)
                       THEN 'transfer records + replay' ELSE 'request records + replay' END AS evidence
                FROM replayed.exposures e
                WHERE list_contains(?, e.node)
                   OR (EXISTS (SELECT 1 FROM gap_windows w WHERE w.node = e.node
                                 AND e.first_ts BETWEEN w.window_start AND w.window_end)
                       AND NOT EXISTS (SELECT 1 FROM exposures x WHERE x.node = e.node
                                         AND x.reader_request = e.reader_request
                                         AND x.victim_request = e.victim_request))
                ORDER BY e.first_ts, e.node, e.reader_request, e.victim_request""", [missing])
        finally:
            con.execute("DETACH replayed")
        row = one(con, "SELECT count(DISTINCT reader_request) FILTER (WHERE reader_delivered), count(*), "
                       "(SELECT count(*) FROM gap_windows) FROM replay_exposures")
    finally:
        con.close()
    assert row is not None
    return {"nodes": missing, "gap_windows": row[2], "exposed_responses": row[0], "rows": row[1]}


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
    format: str | None = None,
    options: Options | None = None,
) -> JobResult:
    """Ingest and analyse; replay to confirm and ask what-if where the evidence allows; report."""
    result = JobResult(forensics.investigate(paths, db, progress=progress, format=format, options=options))
    if out is None:
        return result
    if with_replay:
        why_not = replayable(db)
        if why_not is None:
            for engine in JOB_REPLAYS:
                result.replays.append(replay(db, engine, default_out(db, engine, WhatIf())))
            result.filled = fill_from_replay(db, result.replays[0])
        else:
            result.replay_skipped = why_not
    else:
        result.replay_skipped = "not asked (--no-replay)"
    result.report = report(db, out, audience=audience, pseudonymize_key=pseudonymize_key,
                           generated_at=generated_at)
    return result
