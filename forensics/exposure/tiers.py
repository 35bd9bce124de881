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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from forensics.exposure.figures import DEFINITIONS, summary
from forensics.ids import NodeId
from forensics.store import HeldCase, connect, has_table, one, roll_back, rows, sql_text

PAGE_RECORDS = "page records"
PAGE_RECORDS_INFERRED = "page records, read inferred"  # the read was inferred at decode_started
TRANSFER_REPLAY = "transfer records + replay"  # the reader's transfer carried fewer KV tokens than its prompt
REQUEST_REPLAY = "request records + replay"
#: Every tier, strongest evidence first.
TIERS = (PAGE_RECORDS, PAGE_RECORDS_INFERRED, TRANSFER_REPLAY, REQUEST_REPLAY)
#: The tiers on which a victim is certain: page records show what each page held. A victim the
#: replay names is possible: it rests on the reference engine's reconstruction of the pages.
CERTAIN = (PAGE_RECORDS, PAGE_RECORDS_INFERRED)


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


def fill_from_replay(db: Path | str | HeldCase, replayed: Path, alternatives: Sequence[tuple[str, Path]] = (),
                     disagreeing_nodes: Sequence[str] = (), varied_nodes: Sequence[str] = (),
                     retracted_from: Sequence[tuple[str, int, int]] = ()) -> Filled:
    """:func:`fill_from_replay_on` the case ``db``: its path, or the case a long job holds open."""
    con = connect(db)
    try:
        return fill_from_replay_on(con, replayed, alternatives, disagreeing_nodes, varied_nodes, retracted_from)
    finally:
        con.close()


def fill_from_replay_on(con: duckdb.DuckDBPyConnection, replayed: Path,
                        alternatives: Sequence[tuple[str, Path]] = (), disagreeing_nodes: Sequence[str] = (),
                        varied_nodes: Sequence[str] = (), retracted_from: Sequence[tuple[str, int, int]] = ()
                        ) -> Filled:
    """Replace the ``replay_exposures`` of the case open on ``con`` by the exposures of the replay
    case ``replayed`` (the replay under the engine that made the logs, on the logged schedule) where
    page records are missing, each victim certain or possible: certain where every one of the
    ``alternatives`` (``(schedule, replay case)``: the other schedules the evidence allows, replayed
    on the ``varied_nodes`` only, where they differ) names it too, on a node whose replay followed
    its logs (none of ``disagreeing_nodes``) and misses no records. ``retracted_from``: ``(node,
    boot, seq)`` of the replayed set, where a request that node's decode retracted (which the replay
    does not model) joined its batch: a pair first read there or after is possible, one read before
    keeps its certainty (what the node had done until then is the replay's)."""
    base = _exposures_of(replayed)
    tables = []
    for name, path in alternatives:
        t = _exposures_of(path)
        tables.append(t.append_column("schedule", pa.array([name] * t.num_rows, pa.string())))
    alternative = (pa.concat_tables(tables) if tables
                   else base.slice(0, 0).append_column("schedule", pa.array([], pa.string())))
    missing = missing_page_records(con)
    con.register("replayed_exposures", base)
    con.register("alternative_exposures", alternative)
    con.register("retracted_from", pa.table({"node": pa.array([n for n, _, _ in retracted_from], pa.string()),
                                             "boot": pa.array([b for _, b, _ in retracted_from], pa.int64()),
                                             "seq": pa.array([q for _, _, q in retracted_from], pa.int64())}))
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM replay_exposures")
        con.execute(sql_text("fill_from_replay.sql"), {
            "missing_nodes": list(missing), "transfer_tier": TRANSFER_REPLAY, "request_tier": REQUEST_REPLAY,
            "schedules": len(alternatives), "disagreeing_nodes": list(disagreeing_nodes),
            "varied_nodes": list(varied_nodes)})
        con.execute("COMMIT")
    except BaseException:
        roll_back(con)  # (the case stays open after: the fill is undone whole, as a closed connection would)
        raise
    finally:
        con.unregister("replayed_exposures")
        con.unregister("alternative_exposures")
        con.unregister("retracted_from")
    row = one(con, "SELECT count(DISTINCT reader_request) FILTER (WHERE reader_delivered), count(*), "
                   "(SELECT count(*) FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops)) "
                   "FROM replay_exposures")
    assert row is not None
    return Filled(missing, int(row[2]), int(row[0]), int(row[1]))


def _exposures_of(case: Path) -> pa.Table:
    """The exposures table of the case ``case`` (a replay's)."""
    source = connect(case, read_only=True, create=False)
    try:
        return source.sql("SELECT * FROM exposures").to_arrow_table()
    finally:
        source.close()


def by_tier(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Delivered responses exposed and exposure rows per tier, over both tables."""
    return rows(con, """
        SELECT evidence, count(DISTINCT reader_request) AS responses, count(*) AS rows FROM (
          SELECT evidence, reader_request FROM exposures WHERE reader_delivered
          UNION ALL SELECT evidence, reader_request FROM replay_exposures WHERE reader_delivered)
        GROUP BY evidence ORDER BY evidence""")


def filled_figures(con: duckdb.DuckDBPyConnection) -> dict[str, int] | None:
    """The replay-backed tiers' figures together (uninitialized reads are not measured there),
    None where they name no delivered response."""
    if not _replay_rows(con):
        return None
    found = _figures_of(con, "SELECT * FROM replay_exposures")
    return {k: v for k, v in found.items() if v is not None} if found["exposed_responses"] else None


#: The evidence of the summary's columns: page records (both page tiers), each replay-backed tier,
#: and all of them as one.
PAGE_EVIDENCE = "page records"
TOTAL = "total"
SUMMARY_TIERS = (PAGE_EVIDENCE, TRANSFER_REPLAY, REQUEST_REPLAY, TOTAL)
_EXPOSURES = re.compile(r"\bexposures\b")


def every_exposure(con: duckdb.DuckDBPyConnection) -> str:
    """The exposure rows of every tier, as a SELECT with the columns of ``exposures`` and a
    ``certainty`` (and its ``certainty_note``): the page records' (certain) and, where the whole
    job filled in, the replay's (``replay_exposures``, each row certain or possible)."""
    pages = "SELECT *, 'certain' AS certainty, NULL::VARCHAR AS certainty_note FROM exposures"
    if not has_table(con, "replay_exposures"):
        return pages
    return f"{pages} UNION ALL BY NAME {replay_rows(con)}"


def replay_rows(con: duckdb.DuckDBPyConnection) -> str:
    """``replay_exposures`` as a SELECT with its certainty columns, 'possible' where a case made
    before they were kept has none."""
    columns = {c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'replay_exposures'").fetchall()}
    if "certainty" in columns:
        return ("SELECT * REPLACE (coalesce(certainty, 'possible') AS certainty) FROM replay_exposures")
    return "SELECT *, 'possible' AS certainty, NULL::VARCHAR AS certainty_note FROM replay_exposures"


def certainty(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int]]:
    """Victim requests and affected tenants of delivered responses, certain (named by page
    records, or by the replay under every schedule the evidence allows) and possible (the rest:
    named by the replay under some of them, or where its evidence is incomplete); a victim or
    tenant certain anywhere is certain."""
    row = one(con, f"""
        SELECT count(DISTINCT victim_request) FILTER (WHERE certainty = 'certain'),
               count(DISTINCT victim_request),
               count(DISTINCT victim_tenant) FILTER (WHERE certainty = 'certain'),
               count(DISTINCT victim_tenant)
        FROM ({every_exposure(con)}) WHERE reader_delivered""")
    v_certain, v_all, t_certain, t_all = (int(x or 0) for x in (row or (0, 0, 0, 0)))
    return {"victim_requests": {"certain": v_certain, "possible": v_all - v_certain},
            "affected_tenants": {"certain": t_certain, "possible": t_all - t_certain}}


def missing_page_records(con: duckdb.DuckDBPyConnection) -> tuple[NodeId, ...]:
    """Engine nodes that logged requests but no page records: their exposures rest on replay."""
    return tuple(NodeId(n) for (n,) in con.execute(
        "SELECT DISTINCT node FROM configs WHERE role IN ('prefill', 'decode') "
        "AND node IN (SELECT node FROM request_events) AND node NOT IN (SELECT node FROM kv_ops) "
        "ORDER BY node").fetchall())


def unseen_late_writes(con: duckdb.DuckDBPyConnection) -> int:
    """How many transfers were sent by a prefill node and given up by a decode node without page
    records (finding handoff.sent_but_not_received): where one of them landed late, it overwrote
    pages that no log shows, and no replay-backed figure counts what it overwrote."""
    missing = missing_page_records(con)
    if not missing:
        return 0
    from forensics.findings import specs  # (the findings' queries; findings imports nothing of this)

    (spec,) = [s for s in specs() if s.id == "handoff.sent_but_not_received"]
    query = spec.sql.strip().rstrip(";")
    row = one(con, f"SELECT count(*) FROM ({query}) WHERE dst_node IN (SELECT unnest($1::VARCHAR[]))",
              [list(missing)])
    return int(row[0]) if row else 0


def _replay_rows(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the replay filled in any exposure (a case of before the table has none)."""
    return has_table(con, "replay_exposures") and (one(con, "SELECT count(*) FROM replay_exposures") or (0,))[0] > 0


def _figures_of(con: duckdb.DuckDBPyConnection, source: str) -> dict[str, int | None]:
    """The figures of exposure rows ``source`` (a SELECT with the columns of ``exposures``), each by
    its definition's query (figures.DEFINITIONS); uninitialized reads, which are not exposure
    rows, None."""
    out: dict[str, int | None] = {}
    for figure in DEFINITIONS:
        if figure.name == "uninitialized_reads":
            out[figure.name] = None
            continue
        row = one(con, f"WITH tier_rows AS ({source}) " + _EXPOSURES.sub("tier_rows", figure.sql))
        out[figure.name] = int(row[0] or 0) if row else 0
    return out


def tier_figures(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int | None]]:
    """The eight figures by the evidence they rest on (:data:`SUMMARY_TIERS`).

    The page records' are the analysed summary (checked against its definitions when reported);
    each replay-backed tier's, and the total's, are the definitions' queries over those rows. A
    replay-backed tier has no uninitialized reads of its own (None: not measured there), nor
    then has the total. Where the replay filled in nothing, the total is the page records'.
    """
    pages: dict[str, int | None] = dict(summary(con))
    if not _replay_rows(con):
        zero: dict[str, int | None] = {k: (None if k == "uninitialized_reads" else 0) for k in pages}
        return {PAGE_EVIDENCE: pages, TRANSFER_REPLAY: zero, REQUEST_REPLAY: dict(zero), TOTAL: dict(pages)}
    return {
        PAGE_EVIDENCE: pages,
        TRANSFER_REPLAY: _figures_of(con, f"SELECT * FROM replay_exposures WHERE evidence = '{TRANSFER_REPLAY}'"),
        REQUEST_REPLAY: _figures_of(con, f"SELECT * FROM replay_exposures WHERE evidence = '{REQUEST_REPLAY}'"),
        TOTAL: _figures_of(con, every_exposure(con)),
    }
