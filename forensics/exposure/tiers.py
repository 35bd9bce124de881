"""Evidence tiers: on what each exposure rests, and the replay-backed tiers that fill in where a
case's page records are missing.

Page records prove an exposure directly (``exposures``, analysed by section 5). Where an engine
node logged requests but no page records, or inside the time window of a node's seq gap, the
whole job takes the exposures of the replay that follows the logs into ``replay_exposures``,
each labelled with the evidence it rests on. The tier names below are the values of the
``evidence`` column; ``sql/analysis.sql`` writes the first two.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from forensics.ids import NodeId
from forensics.store import connect, one, rows, sql_text

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
        missing = tuple(NodeId(n) for (n,) in con.execute(
            "SELECT DISTINCT node FROM configs WHERE role IN ('prefill', 'decode') "
            "AND node IN (SELECT node FROM request_events) AND node NOT IN (SELECT node FROM kv_ops) "
            "ORDER BY node").fetchall())
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
