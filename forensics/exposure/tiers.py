"""Evidence tiers: on what each exposure rests, and the replay-backed tiers that fill in where a
case's page records are missing.

Page records prove an exposure directly (``exposures``, analysed by section 5). Where an engine
node logged requests but no page records, or inside the time window of a node's seq gap, the
whole job takes the exposures of the replay that follows the logs into ``replay_exposures``,
each labelled with the evidence it rests on. The tier names below are the values of the
``evidence`` column; ``sql/analysis.sql`` writes the first two.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from forensics.exposure.figures import DEFINITIONS
from forensics.ids import NodeId
from forensics.store import connect, has_table, one, rows, sql_text

PAGE_RECORDS = "page records"
PAGE_RECORDS_INFERRED = "page records, read inferred"  # the read was inferred at decode_started
TRANSFER_REPLAY = "transfer records + replay"  # the reader's transfer carried fewer KV tokens than its prompt
REQUEST_REPLAY = "request records + replay"
#: Every tier, strongest evidence first.
TIERS = (PAGE_RECORDS, PAGE_RECORDS_INFERRED, TRANSFER_REPLAY, REQUEST_REPLAY)


@dataclass(frozen=True)
class Filled:
    """What the replay filled in: the nodes without page records, the seq-gap windows, and the
    exposures taken from the replay there."""

    nodes: tuple[NodeId, ...]
    gap_windows: int
    exposed_responses: int
    rows: int

    def as_dict(self) -> dict[str, Any]:
        """The fill as JSON-ready data."""
        return {"nodes": list(self.nodes), "gap_windows": self.gap_windows,
                "exposed_responses": self.exposed_responses, "rows": self.rows}


def fill_from_replay(db: Path | str, replayed: Path) -> Filled:
    """Replace the case's ``replay_exposures`` by the exposures of the replay case ``replayed``
    (the replay under the engine that made the logs) where page records are missing."""
    source = connect(replayed, read_only=True, create=False)
    try:
        replayed_exposures = source.sql("SELECT * FROM exposures").to_arrow_table()
    finally:
        source.close()
    con = connect(db)
    try:
        missing = missing_page_records(con)
        con.register("replayed_exposures", replayed_exposures)
        con.execute("BEGIN TRANSACTION")
        con.execute("DELETE FROM replay_exposures")
        con.execute(sql_text("fill_from_replay.sql"), {
            "missing_nodes": list(missing), "transfer_tier": TRANSFER_REPLAY, "request_tier": REQUEST_REPLAY})
        con.execute("COMMIT")
        row = one(con, "SELECT count(DISTINCT reader_request) FILTER (WHERE reader_delivered), count(*), "
                       "(SELECT count(*) FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops)) "
                       "FROM replay_exposures")
    finally:
        con.close()
    assert row is not None
    return Filled(missing, int(row[2]), int(row[0]), int(row[1]))


def by_tier(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Delivered responses exposed and exposure rows per tier, over both tables."""
    return rows(con, """
        SELECT evidence, count(DISTINCT reader_request) AS responses, count(*) AS rows FROM (
          SELECT evidence, reader_request FROM exposures WHERE reader_delivered
          UNION ALL SELECT evidence, reader_request FROM replay_exposures WHERE reader_delivered)
        GROUP BY evidence ORDER BY evidence""")


def filled_figures(con: duckdb.DuckDBPyConnection) -> dict[str, int] | None:
    """The replay-backed tiers' figures (delivered readers only), None where they fill in nothing."""
    row = rows(con, """
        SELECT count(DISTINCT reader_request) AS exposed_responses,
               count(DISTINCT victim_request) AS victim_requests,
               count(DISTINCT (reader_request, victim_request)) AS exposure_pairs,
               count(DISTINCT (reader_request, victim_request)) FILTER (WHERE reader_tenant <> victim_tenant)
                 AS cross_tenant_pairs,
               count(DISTINCT victim_tenant) AS affected_tenants
        FROM replay_exposures WHERE reader_delivered""")[0]
    return {k: int(v) for k, v in row.items()} if row["exposed_responses"] else None


#: The evidence of the summary's columns: page records (both page tiers), each replay-backed tier,
#: and all of them as one.
PAGE_EVIDENCE = "page records"
TOTAL = "total"
SUMMARY_TIERS = (PAGE_EVIDENCE, TRANSFER_REPLAY, REQUEST_REPLAY, TOTAL)
_EXPOSURES = re.compile(r"\bexposures\b")


def missing_page_records(con: duckdb.DuckDBPyConnection) -> tuple[NodeId, ...]:
    """Engine nodes that logged requests but no page records: their exposures rest on replay."""
    return tuple(NodeId(n) for (n,) in con.execute(
        "SELECT DISTINCT node FROM configs WHERE role IN ('prefill', 'decode') "
        "AND node IN (SELECT node FROM request_events) AND node NOT IN (SELECT node FROM kv_ops) "
        "ORDER BY node").fetchall())


def tier_figures(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int | None]]:
    """The eight figures by the evidence they rest on (:data:`SUMMARY_TIERS`), each computed by
    its definition's query (figures.DEFINITIONS) over that tier's exposures. A replay-backed tier
    has no uninitialized reads of its own (None: not measured there), nor then has the total."""
    replayed = has_table(con, "replay_exposures")
    sources = {
        PAGE_EVIDENCE: "SELECT * FROM exposures",
        TRANSFER_REPLAY: f"SELECT * FROM replay_exposures WHERE evidence = '{TRANSFER_REPLAY}'" if replayed else None,
        REQUEST_REPLAY: f"SELECT * FROM replay_exposures WHERE evidence = '{REQUEST_REPLAY}'" if replayed else None,
        TOTAL: ("SELECT * FROM exposures UNION ALL BY NAME SELECT * FROM replay_exposures" if replayed
                else "SELECT * FROM exposures"),
    }
    out: dict[str, dict[str, int | None]] = {}
    for tier, source in sources.items():
        figures: dict[str, int | None] = {}
        for figure in DEFINITIONS:
            if figure.name == "uninitialized_reads":  # of page records only: the total too, where it is theirs
                replay_rows = replayed and (one(con, "SELECT count(*) FROM replay_exposures") or (0,))[0] > 0
                row = one(con, figure.sql) if tier == PAGE_EVIDENCE or (tier == TOTAL and not replay_rows) else None
                figures[figure.name] = int(row[0] or 0) if row else None
                continue
            if source is None:
                figures[figure.name] = 0
                continue
            row = one(con, f"WITH tier_rows AS ({source}) " + _EXPOSURES.sub("tier_rows", figure.sql))
            figures[figure.name] = int(row[0] or 0) if row else 0
        out[tier] = figures
    return out
