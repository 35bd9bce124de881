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
from forensics.store import HeldCase, connect, has_table, one, roll_back, rows, sql_blocks, sql_text

PAGE_RECORDS = "page records"
PAGE_RECORDS_INFERRED = "page records, read inferred"  # the read was inferred at decode_started
TRANSFER_REPLAY = "transfer records + replay"  # the reader's transfer carried fewer KV tokens than its prompt
REQUEST_REPLAY = "request records + replay"
#: Every tier, strongest evidence first.
TIERS = (PAGE_RECORDS, PAGE_RECORDS_INFERRED, TRANSFER_REPLAY, REQUEST_REPLAY)
#: The tiers on which a victim is certain: page records show what each page held. A victim the
#: replay names is possible: it rests on the reference engine's reconstruction of the pages.
CERTAIN = (PAGE_RECORDS, PAGE_RECORDS_INFERRED)
#: After decode retractions, at most this many (reader, request) pairs not ruled out by the evidence
#: are listed in a case (:func:`_not_ruled_out`: they grow as readers times requests); past it none
#: is, and the job and the report say so with their count.
NOT_RULED_OUT_PAIRS = 5_000_000
#: The ``case_meta`` keys of the last fill's pairs not ruled out, and whether they are listed.
NOT_RULED_OUT_META = ("not_ruled_out_pairs", "not_ruled_out_listed")


@dataclass(frozen=True)
class Filled:
    """What the replay filled in: the nodes without page records, the seq-gap windows, and the
    exposures taken from the replay there."""

    nodes: tuple[NodeId, ...]
    gap_windows: int
    exposed_responses: int
    rows: int
    #: after retractions: (reader, request) pairs that the evidence does not rule out, each a row
    #: (possible) where no schedule names it already; or, past :data:`NOT_RULED_OUT_PAIRS`, not
    #: listed (``not_ruled_out_listed`` False: those victims are possible and others may be missed)
    not_ruled_out: int = 0
    not_ruled_out_listed: bool = True

    def as_dict(self) -> dict[str, Any]:
        """The fill as JSON-ready data."""
        return {"nodes": list(self.nodes), "gap_windows": self.gap_windows,
                "exposed_responses": self.exposed_responses, "rows": self.rows,
                "not_ruled_out": self.not_ruled_out, "not_ruled_out_listed": self.not_ruled_out_listed}


def fill_from_replay(db: Path | str | HeldCase, replayed: Path, alternatives: Sequence[tuple[str, Path]] = (),
                     disagreeing_nodes: Sequence[str] = (), varied_nodes: Sequence[str] = (),
                     retracted: Sequence[tuple[str, str]] = ()) -> Filled:
    """:func:`fill_from_replay_on` the case ``db``: its path, or the case a long job holds open."""
    con = connect(db)
    try:
        return fill_from_replay_on(con, replayed, alternatives, disagreeing_nodes, varied_nodes, retracted)
    finally:
        con.close()


def fill_from_replay_on(con: duckdb.DuckDBPyConnection, replayed: Path,
                        alternatives: Sequence[tuple[str, Path]] = (), disagreeing_nodes: Sequence[str] = (),
                        varied_nodes: Sequence[str] = (), retracted: Sequence[tuple[str, str]] = ()
                        ) -> Filled:
    """Replace the ``replay_exposures`` of the case open on ``con`` by the exposures of the replay
    case ``replayed`` (the replay under the engine that made the logs, on the logged schedule) where
    page records are missing, each victim certain or possible: certain where every one of the
    ``alternatives`` (``(schedule, replay case)``: the other schedules the evidence allows, replayed
    on the ``varied_nodes`` only, where they differ) names it too, on a node whose replay followed
    its logs (none of ``disagreeing_nodes``) and misses no records.

    ``retracted``: ``(node, request)`` of the requests a node's decode retracted under memory
    pressure (which the replay does not model), each node's every disagreement one of them. Until
    the first of them joined the node's batch (its ``decode_started`` in the replayed set, on its
    boot) the node did what the replay did; after it, its pages are one layout of several. So a
    reader whose pages were taken before that keeps its certainty; one whose pages were taken
    there or after (or that was retracted itself) has its victims possible, and every request
    whose data may have been in the node's pool when the reader took its pages is named beside
    them as a possible victim (:func:`_not_ruled_out`): the replay's own names may miss the true
    ones there."""
    source = connect(replayed, read_only=True, create=False)
    try:
        base = _exposures_on(source)
        bounds, candidates, pairs = _not_ruled_out(source, retracted)
    finally:
        source.close()
    tables = []
    for name, path in alternatives:
        t = _exposures_of(path)
        tables.append(t.append_column("schedule", pa.array([name] * t.num_rows, pa.string())))
    alternative = (pa.concat_tables(tables) if tables
                   else base.slice(0, 0).append_column("schedule", pa.array([], pa.string())))
    missing = missing_page_records(con)
    con.register("replayed_exposures", base)
    con.register("alternative_exposures", alternative)
    con.register("retraction_bounds", bounds)
    con.register("not_ruled_out", candidates)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM replay_exposures")
        con.executemany("INSERT INTO case_meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        [[NOT_RULED_OUT_META[0], str(pairs)],
                         [NOT_RULED_OUT_META[1], str(candidates.num_rows == pairs).lower()]])
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
        con.unregister("retraction_bounds")
        con.unregister("not_ruled_out")
    row = one(con, "SELECT count(DISTINCT reader_request) FILTER (WHERE reader_delivered), count(*), "
                   "(SELECT count(*) FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops)) "
                   "FROM replay_exposures")
    assert row is not None
    return Filled(missing, int(row[2]), int(row[0]), int(row[1]), pairs, candidates.num_rows == pairs)


def not_ruled_out_figures(con: duckdb.DuckDBPyConnection) -> tuple[int, bool]:
    """The last fill's (reader, request) pairs not ruled out after retractions, and whether they are
    listed (``replay_exposures``): (0, True) where none, or the case was never filled."""
    found = dict(con.execute("SELECT key, value FROM case_meta WHERE key IN (?, ?)", list(NOT_RULED_OUT_META))
                 .fetchall())
    return int(found.get(NOT_RULED_OUT_META[0], 0)), found.get(NOT_RULED_OUT_META[1], "true") == "true"


def _not_ruled_out(source: duckdb.DuckDBPyConnection, retracted: Sequence[tuple[str, str]]
                   ) -> tuple[pa.Table, pa.Table, int]:
    """Where a node's decode retracted requests (``retracted``: ``(node, request)``), from the
    replay case open on ``source`` (``sql/not_ruled_out.sql``): each reader there, with whether its
    pages were taken where the node's layout is no longer the replay's (node, boot, reader_request,
    taken_seq, after); for each such reader, the requests whose data may have been in the node's
    pool when it took them (node, boot, reader_request, victim_request, victim_tenant); and how
    many such pairs there are. Past :data:`NOT_RULED_OUT_PAIRS` none is listed, and they are only
    counted (each reader's are all the requests that let their pages go on its node's boot before it
    took its own, since the first retraction: they grow as readers times requests)."""
    blocks = {b.name: b.sql for b in sql_blocks("not_ruled_out.sql")}
    budget = NOT_RULED_OUT_PAIRS
    source.register("retracted", pa.table({"node": pa.array([n for n, _ in retracted], pa.string()),
                                           "request_id": pa.array([r for _, r in retracted], pa.string())}))
    try:
        source.execute(blocks["prepare"])
        bounds = source.sql("SELECT * FROM retraction_bounds ORDER BY ALL").to_arrow_table()
        listed = source.sql(f"{blocks['not_ruled_out']} LIMIT {budget + 1}").to_arrow_table()
        if listed.num_rows <= budget:
            return bounds, listed, listed.num_rows
        return bounds, listed.slice(0, 0), int((one(source, blocks["not_ruled_out_pairs"]) or (0,))[0])
    finally:
        source.unregister("retracted")


def _exposures_of(case: Path) -> pa.Table:
    """The exposures table of the case ``case`` (a replay's)."""
    source = connect(case, read_only=True, create=False)
    try:
        return _exposures_on(source)
    finally:
        source.close()


def _exposures_on(source: duckdb.DuckDBPyConnection) -> pa.Table:
    """The exposures table of the case open on ``source``."""
    return source.sql("SELECT * FROM exposures").to_arrow_table()


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
