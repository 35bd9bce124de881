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
import pyarrow.compute as pc

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
#: Where a node's pages are not the replay's (after decode retractions, on a node whose replay did
#: not follow its logs), at most this many (reader, request) pairs not ruled out by the evidence are
#: listed in a case (:func:`_not_ruled_out`: they grow as readers times requests); past it none is,
#: and the job and the report say so with their count.
NOT_RULED_OUT_PAIRS = 5_000_000
#: The ``case_meta`` keys of the last fill's pairs not ruled out, whether they are listed, and the
#: delivered responses possibly exposed that the replay names no victim of (:attr:`Filled.possible_readers`).
NOT_RULED_OUT_META = ("not_ruled_out_pairs", "not_ruled_out_listed", "possible_readers")


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
    #: delivered responses that read pages they did not write where a node's pages are not the
    #: replay's, and that the replay names no victim of: it could not give them their pages (its pool
    #: could not supply them, or past its bounds) although their transfer carried fewer pages than
    #: their prompt, or their pages held nothing in it. Each is possibly exposed (its victims, the
    #: requests not ruled out, are listed as possible within the budget)
    possible_readers: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The fill as JSON-ready data."""
        return {"nodes": list(self.nodes), "gap_windows": self.gap_windows,
                "exposed_responses": self.exposed_responses, "rows": self.rows,
                "not_ruled_out": self.not_ruled_out, "not_ruled_out_listed": self.not_ruled_out_listed,
                "possible_readers": self.possible_readers}


def fill_from_replay(db: Path | str | HeldCase, replayed: Path, alternatives: Sequence[tuple[str, Path]] = (),
                     disagreeing_nodes: Sequence[str] = (), varied_nodes: Sequence[str] = (),
                     retracted: Sequence[tuple[str, str]] = (), unsupplied: Sequence[tuple[str, str]] = ()
                     ) -> Filled:
    """:func:`fill_from_replay_on` the case ``db``: its path, or the case a long job holds open."""
    con = connect(db)
    try:
        return fill_from_replay_on(con, replayed, alternatives, disagreeing_nodes, varied_nodes, retracted,
                                   unsupplied)
    finally:
        con.close()


def fill_from_replay_on(con: duckdb.DuckDBPyConnection, replayed: Path,
                        alternatives: Sequence[tuple[str, Path]] = (), disagreeing_nodes: Sequence[str] = (),
                        varied_nodes: Sequence[str] = (), retracted: Sequence[tuple[str, str]] = (),
                        unsupplied: Sequence[tuple[str, str]] = ()) -> Filled:
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
    ones there.

    On each of the ``disagreeing_nodes`` the replay cannot say from where its pages are no longer
    the node's: every reader there has the requests not ruled out since its boot's start named
    beside its own victims. The requests not ruled out are sought, and counted, only on the nodes
    the fill takes rows from (without page records, or with seq gaps): elsewhere page records say
    whose data a page held. ``unsupplied``: ``(node, request)`` of the requests the replay could not
    give their pages although the logs show them served and their transfer carried fewer pages than
    their prompt (``ReplayResult.unsupplied``): each read pages it did not write, and is a possible
    exposed response with those requests as its possible victims."""
    missing = missing_page_records(con)
    # (the requests not ruled out are sought only on the nodes the fill takes rows from: elsewhere the
    # page records name the victims, and a count of pairs there would say of them what is not so)
    filled = set(filled_nodes(con))
    # (and on a node with page records, only for the readers whose pages were taken inside a seq-gap
    # window: outside them its page records name the victims, as the rows the fill takes)
    windows = con.sql(f"SELECT node, window_start, window_end FROM {_GAP_WINDOWS} ORDER BY ALL").to_arrow_table()
    source = connect(replayed, read_only=True, create=False)
    try:
        base = _exposures_on(source)
        bounds, candidates, pairs = _not_ruled_out(source, [x for x in retracted if x[0] in filled],
                                                   [n for n in disagreeing_nodes if n in filled],
                                                   [x for x in unsupplied if x[0] in filled], (missing, windows))
    finally:
        source.close()
    tables = []
    for name, path in alternatives:
        t = _exposures_of(path)
        tables.append(t.append_column("schedule", pa.array([name] * t.num_rows, pa.string())))
    alternative = (pa.concat_tables(tables) if tables
                   else base.slice(0, 0).append_column("schedule", pa.array([], pa.string())))
    con.register("replayed_exposures", base)
    con.register("alternative_exposures", alternative)
    con.register("retraction_bounds", bounds)
    con.register("not_ruled_out", candidates)
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM replay_exposures")
        # (a possible reader the replay names no victim of; the bounds are the fill's alone: on a node
        # without page records, or inside a seq gap)
        possible_readers = int(con.execute("""
            SELECT count(DISTINCT b.reader_request) FROM retraction_bounds b
            WHERE NOT b.named AND b.reader_delivered AND b.pairs > 0""").fetchall()[0][0])
        con.executemany("INSERT INTO case_meta VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                        [[NOT_RULED_OUT_META[0], str(pairs)],
                         [NOT_RULED_OUT_META[1], str(candidates.num_rows == pairs).lower()],
                         [NOT_RULED_OUT_META[2], str(possible_readers)]])
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
    return Filled(missing, int(row[2]), int(row[0]), int(row[1]), pairs, candidates.num_rows == pairs,
                  possible_readers)


def filled_nodes(con: duckdb.DuckDBPyConnection) -> tuple[str, ...]:
    """The nodes of the case open on ``con`` the fill may take rows from: the engine nodes without
    page records, and those with seq gaps in theirs (the rest have their victims named by page
    records alone), in order."""
    gaps = con.execute("SELECT DISTINCT node FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops)").fetchall()
    return tuple(sorted(set(missing_page_records(con)) | {node for node, in gaps}))


#: SQL: a row of table ``t`` (its ``node``, its time ``ts``) is one the fill takes from the replay: on
#: a node without page records ($missing_nodes), or inside a seq-gap window of a node with them
#: (``windows``: a table of them, ``node, window_start, window_end``: :data:`_GAP_WINDOWS` in the case).
_FILLED_WHERE = ("list_contains($missing_nodes, {t}.node) OR EXISTS (SELECT 1 FROM {windows} w WHERE w.node = {t}.node "
                 "AND {t}.{ts} BETWEEN w.window_start AND w.window_end)")
#: The case's seq-gap windows on nodes with page records (those without have every row filled).
_GAP_WINDOWS = "(SELECT * FROM seq_gaps WHERE node IN (SELECT node FROM kv_ops))"


def not_ruled_out_figures(con: duckdb.DuckDBPyConnection) -> tuple[int, bool]:
    """The last fill's (reader, request) pairs not ruled out, and whether they are listed
    (``replay_exposures``): (0, True) where none, or the case was never filled."""
    found = _meta(con)
    return int(found.get(NOT_RULED_OUT_META[0], 0)), found.get(NOT_RULED_OUT_META[1], "true") == "true"


def possible_readers_figure(con: duckdb.DuckDBPyConnection) -> int:
    """The last fill's delivered responses possibly exposed that the replay names no victim of
    (:attr:`Filled.possible_readers`); 0 where none, or the case was never filled."""
    return int(_meta(con).get(NOT_RULED_OUT_META[2], 0))


def _meta(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The last fill's :data:`NOT_RULED_OUT_META` kept in ``case_meta``."""
    return dict(con.execute("SELECT key, value FROM case_meta WHERE list_contains($keys, key)",
                            {"keys": list(NOT_RULED_OUT_META)}).fetchall())


def _not_ruled_out(source: duckdb.DuckDBPyConnection, retracted: Sequence[tuple[str, str]],
                   whole_nodes: Sequence[str] = (), unsupplied: Sequence[tuple[str, str]] = (),
                   filled: tuple[Sequence[str], pa.Table] | None = None) -> tuple[pa.Table, pa.Table, int]:
    """Where a node's pages are not the replay's, from the replay case open on ``source``
    (``sql/not_ruled_out.sql``): after the retractions of ``retracted`` (``(node, request)``), on the
    ``whole_nodes`` from each boot's start, and for the readers of ``unsupplied`` (``(node,
    request)``: the replay gave them no pages). Each reader there, with whether its pages were taken
    where the node's layout is no longer the replay's (node, boot, reader_request, taken_seq, after,
    unsupplied, whole, named, reader_tenant, reader_delivered, first_ts, and its pairs); for each
    such reader, the requests whose data may have been in the node's pool when it took them (node,
    boot, reader_request, victim_request, victim_tenant); and how many such pairs there are. They
    are counted first, cheaply; past :data:`NOT_RULED_OUT_PAIRS` none is listed (each reader's are
    all the requests that let their pages go on its node's boot before it took its own, since the
    split: they grow as readers times requests). With ``filled`` (the nodes without page records, and
    the seq-gap windows ``(node, window_start, window_end)`` of those with them), only the readers the
    fill takes rows of are: on such a node, or whose pages were taken inside a window."""
    blocks = {b.name: b.sql for b in sql_blocks("not_ruled_out.sql")}
    pairs_of = {"retracted": retracted, "unsupplied": unsupplied}
    for name, pairs in pairs_of.items():
        source.register(name, pa.table({"node": pa.array([n for n, _ in pairs], pa.string()),
                                        "request_id": pa.array([r for _, r in pairs], pa.string())}))
    source.register("whole_nodes", pa.table({"node": pa.array(list(whole_nodes), pa.string())}))
    if filled is not None:
        source.register("fill_windows", filled[1])
    try:
        source.execute(blocks["prepare"])
        if filled is not None:  # (the readers the fill takes no row of are not counted: page records name theirs)
            where = _FILLED_WHERE.format(t="b", ts="first_ts", windows="fill_windows")
            source.execute(f"DELETE FROM retraction_bounds b WHERE NOT coalesce({where}, FALSE)",
                           {"missing_nodes": list(filled[0])})
        bounds = source.sql(f"""
            SELECT b.*, coalesce(p.pairs, 0) AS pairs FROM retraction_bounds b
            LEFT JOIN ({blocks["not_ruled_out_pairs"]}) p USING (node, boot, reader_request)
            ORDER BY ALL""").to_arrow_table()
        count = int(pc.sum(bounds.column("pairs")).as_py() or 0)
        listed = source.sql(blocks["not_ruled_out"]).to_arrow_table() if 0 < count <= NOT_RULED_OUT_PAIRS \
            else source.sql(f"{blocks['not_ruled_out']} LIMIT 0").to_arrow_table()
        return bounds, listed, count
    finally:
        for name in (*pairs_of, "whole_nodes", *(("fill_windows",) if filled is not None else ())):
            source.unregister(name)


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
    ``certainty`` (and its ``certainty_note``): the page records' (:func:`page_rows`) and, where the
    whole job filled in, the replay's (``replay_exposures``, each row certain or possible)."""
    pages = page_rows(con)
    if not has_table(con, "replay_exposures"):
        return pages
    return f"{pages} UNION ALL BY NAME {replay_rows(con)}"


def page_rows(con: duckdb.DuckDBPyConnection) -> str:
    """``exposures`` (the page records' rows) as a SELECT with certainty columns: certain, but where
    records are missing (a seq gap) between the victim's write of the pages and the reader's first
    sight of them (``sql/page_doubts.sql``): there another request may have written them, and the
    victim is possible."""
    if not (one(con, "SELECT EXISTS (SELECT 1 FROM seq_gaps JOIN (SELECT DISTINCT node, boot FROM exposures) "
                     "USING (node, boot))") or (False,))[0]:
        return "SELECT *, 'certain' AS certainty, NULL::VARCHAR AS certainty_note FROM exposures"
    return f"""
        SELECT e.*, CASE WHEN d.reader_request IS NULL THEN 'certain' ELSE 'possible' END AS certainty,
               CASE WHEN d.reader_request IS NOT NULL THEN
                 'records missing (seq gap ' || d.missing_from || '-' || d.missing_to || ' of boot ' || e.boot
                 || ') between the victim''s write of these pages and this read: another request may have '
                 || 'written them there' END AS certainty_note
        FROM exposures e LEFT JOIN ({sql_text("page_doubts.sql")}) d
          USING (reader_request, victim_request, node, boot)"""


def replay_rows(con: duckdb.DuckDBPyConnection) -> str:
    """``replay_exposures`` as a SELECT with its certainty columns, 'possible' where a case made
    before they were kept has none."""
    columns = {c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'replay_exposures'").fetchall()}
    if "certainty" in columns:
        return ("SELECT * REPLACE (coalesce(certainty, 'possible') AS certainty) FROM replay_exposures")
    return "SELECT *, 'possible' AS certainty, NULL::VARCHAR AS certainty_note FROM replay_exposures"


def certainty(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, int]]:
    """Victim requests, affected tenants and (reader, victim) pairs of delivered responses, certain
    (named by page records, or by the replay under every schedule the evidence allows) and possible
    (the rest: named by the replay under some of them, where its evidence is incomplete, or not ruled
    out where it could not follow the logs); one certain anywhere is certain."""
    row = one(con, f"""
        SELECT count(DISTINCT victim_request) FILTER (WHERE certainty = 'certain'),
               count(DISTINCT victim_request),
               count(DISTINCT victim_tenant) FILTER (WHERE certainty = 'certain'),
               count(DISTINCT victim_tenant),
               count(DISTINCT (reader_request, victim_request)) FILTER (WHERE certainty = 'certain'),
               count(DISTINCT (reader_request, victim_request))
        FROM ({every_exposure(con)}) WHERE reader_delivered""")
    v_certain, v_all, t_certain, t_all, p_certain, p_all = (int(x or 0) for x in (row or (0,) * 6))
    return {"victim_requests": {"certain": v_certain, "possible": v_all - v_certain},
            "affected_tenants": {"certain": t_certain, "possible": t_all - t_certain},
            "exposure_pairs": {"certain": p_certain, "possible": p_all - p_certain}}


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


@dataclass(frozen=True)
class LostRecords:
    """What records lost (a seq gap, a node's log cut short at either end) leave unknown, and whether
    the readers still in flight where the logs end were delivered. On complete logs, nothing (the
    generators', the shipped samples, the SGLang-printed fixtures: ``tests/forensics/test_seq_gaps.py``)."""

    #: requests whose decode records are missing: other nodes' records place them on a node (a
    #: transfer that landed there, or the router's decode node where it delivered them or no node
    #: logged their finish), and that node has no ``decode_started`` of theirs, or no record at all in
    #: the case (its log not given, or lost whole) where other nodes' decode records are; and a
    #: finish of theirs is logged, or that node's log has a seq gap, is not given, or stops before
    #: the rest (else they are :attr:`unstarted`). What they read there is in no record; where no
    #: node logged their finish, neither is whether they were delivered.
    requests: int = 0
    delivered: int = 0  # of them, delivered by another node's finish (the router's)
    no_finish: int = 0  # of them, with no finish logged on any node
    nodes: tuple[str, ...] = ()  # the nodes they are missing on, in order
    #: requests that read pages never written in the records that remain, after a seq gap on the
    #: node's boot (its start cut off among them): those pages may hold what a lost record wrote
    blind_readers: int = 0
    #: requests that read on a node with records lost (above), other requests' pages or pages never
    #: written, and have no finish on any node: counted as not delivered, their finish possibly lost
    unfinished_readers: int = 0
    #: requests that read other requests' pages (an exposure row, of any tier) on a node with no
    #: record lost, and have no finish on any node: in flight when the logs end, or their finish not
    #: logged. log-schema.md counts them as contained (not delivered); they may have been delivered
    #: after the logs end.
    in_flight_readers: int = 0
    #: requests placed so on a node whose log runs whole to the logs' end (no seq gap, and silent at
    #: the end no longer than it ever was between two records), with no ``decode_started`` there and
    #: no finish on any node: not started where the logs end (or their records lost at the log's very
    #: end); what they went on to read is after the logs. Said, not counted as lost.
    unstarted: int = 0

    @property
    def lost(self) -> bool:
        """Whether records are missing (a seq gap, a log cut short or not given)."""
        return bool(self.requests or self.blind_readers or self.unfinished_readers)

    @property
    def any(self) -> bool:
        """Whether anything is left unknown: records lost, or readers' delivery."""
        return self.lost or bool(self.in_flight_readers)

    def as_dict(self) -> dict[str, Any]:
        return {"missing_decodes": self.requests, "delivered": self.delivered, "no_finish": self.no_finish,
                "nodes": list(self.nodes), "blind_readers": self.blind_readers,
                "unfinished_readers": self.unfinished_readers, "in_flight_readers": self.in_flight_readers,
                "unstarted": self.unstarted}


_MISSING_DECODES = """
WITH placed AS (  -- (by the router alone: where it says delivered, or no node logged a finish; 'unknown': a
                  -- side an SGLang line could not name, sql/schema.sql's transfers)
  SELECT request_id, dst_node AS node FROM records
  WHERE kind = 'transfer' AND event = 'completed' AND dst_node <> 'unknown'
  UNION
  SELECT r.request_id, r.decode_node FROM records r JOIN requests q USING (request_id)
  WHERE r.kind = 'request' AND r.decode_node <> 'unknown' AND (q.delivered OR q.status IS NULL)
), present AS (SELECT DISTINCT node FROM records
), lost AS (  -- (a node with no record at all counts where the case holds any node's decode records: a
              -- case of no decode log, request-level evidence alone, lost none)
  SELECT p.request_id, p.node FROM placed p
  WHERE NOT EXISTS (SELECT 1 FROM records s WHERE s.kind = 'request' AND s.event = 'decode_started'
                      AND s.node = p.node AND s.request_id = p.request_id)
    AND (p.node IN (SELECT node FROM present)
         OR EXISTS (SELECT 1 FROM records d WHERE d.kind = 'request' AND d.event = 'decode_started'))
)
SELECT request_id, min(node) AS node, coalesce(any_value(q.delivered), FALSE) AS delivered,
       any_value(q.status) IS NULL AS no_finish, list(DISTINCT node ORDER BY node) AS nodes
FROM lost LEFT JOIN requests q USING (request_id) GROUP BY request_id ORDER BY request_id"""

#: The nodes whose log runs to the logs' end: in the case, and silent at the end (from its last record
#: to the case's last) no longer than it ever was between two records. A node silent longer at the end
#: stopped logging before the rest: its log is cut short there. (Whole to the end, with no seq gap.)
_TO_THE_END = """
WITH spans AS (
  SELECT node, ts, ts - lag(ts) OVER (PARTITION BY node ORDER BY ts) AS silence FROM records WHERE ts IS NOT NULL
), nodes AS (SELECT node, max(ts) AS last_ts, max(silence) AS widest FROM spans GROUP BY node)
SELECT node FROM nodes
WHERE (SELECT max(ts) FROM records) - last_ts <= coalesce(widest, INTERVAL 0 SECOND)
ORDER BY node"""

# (each reader once, with the first node, in order, where it read so)
_BLIND_READERS = """
SELECT u.request_id, min(u.node) AS node FROM uninitialized_reads u
JOIN seq_gaps g ON g.node = u.node AND g.boot = u.boot AND g.missing_to < u.seq
GROUP BY u.request_id ORDER BY u.request_id"""

_UNFINISHED_READERS = """
WITH readers AS (SELECT reader_request AS request_id, node FROM exposures
                 UNION SELECT request_id, node FROM uninitialized_reads)
SELECT r.request_id, min(r.node) AS node FROM readers r JOIN requests q USING (request_id)
WHERE q.status IS NULL AND list_contains($nodes, r.node)
GROUP BY r.request_id ORDER BY r.request_id"""

_IN_FLIGHT_READERS = """
WITH readers AS (SELECT reader_request AS request_id, node FROM exposures{replayed})
SELECT r.request_id, min(r.node) AS node FROM readers r LEFT JOIN requests q USING (request_id)
WHERE q.status IS NULL AND NOT list_contains($nodes::VARCHAR[], r.node)
GROUP BY r.request_id ORDER BY r.request_id"""

#: What each row of :func:`lost_record_list` says of its request, by the part of
#: :func:`lost_record_rows` it comes from (a missing decode that had not started: ``unstarted``), in
#: the list's order.
LOST_KINDS = {
    "missing_decodes": "its decode records are lost: what it read is not known, and it may be a victim the "
                       "records no longer show",
    "blind_readers": "read pages never written in the records left after a seq gap: they may hold what a lost "
                     "record wrote",
    "unfinished_readers": "read where records are lost, and no node logged its finish: counted not delivered, "
                          "the finish possibly lost",
    "in_flight_readers": "read other requests' pages, and no finish is in the logs: counted contained, it may "
                         "have been delivered after they end",
    "unstarted": "placed on a decode node that had not started it where the logs end: what it read is after them",
}


def lost_records(con: duckdb.DuckDBPyConnection, found: dict[str, list[dict[str, Any]]] | None = None
                 ) -> LostRecords:
    """What records lost leave unknown (:class:`LostRecords`), counted (``found``: the
    :func:`lost_record_rows` of the case, where already read)."""
    found = lost_record_rows(con) if found is None else found
    decodes = [r for r in found["missing_decodes"] if not r["in_flight"]]
    return LostRecords(len(decodes), sum(1 for r in decodes if r["delivered"]),
                       sum(1 for r in decodes if r["no_finish"]), tuple(sorted({str(r["node"]) for r in decodes})),
                       len(found["blind_readers"]), len(found["unfinished_readers"]), len(found["in_flight_readers"]),
                       len(found["missing_decodes"]) - len(decodes))


def lost_record_rows(con: duckdb.DuckDBPyConnection) -> dict[str, list[dict[str, Any]]]:
    """What records lost leave unknown (:class:`LostRecords`), by request id: ``missing_decodes``
    (each with its node, the first where several, whether another node's finish says it was
    delivered, whether no node logged its finish, and whether it is ``in_flight``: one of
    :attr:`LostRecords.unstarted`), ``blind_readers``, ``unfinished_readers`` and
    ``in_flight_readers``."""
    decodes = rows(con, _MISSING_DECODES)
    gaps = [node for node, in con.execute("SELECT DISTINCT node FROM seq_gaps").fetchall()]
    # (no finish anywhere, placed only on nodes whose log runs whole to the logs' end: not started there)
    whole = {node for node, in con.execute(_TO_THE_END).fetchall()} - set(gaps) \
        if any(r["no_finish"] for r in decodes) else set()
    for r in decodes:
        r["in_flight"] = bool(r["no_finish"]) and set(r.pop("nodes")) <= whole
    lossy = sorted(set(gaps) | {str(r["node"]) for r in decodes if not r["in_flight"]})
    replayed = " UNION SELECT reader_request, node FROM replay_exposures" if has_table(con, "replay_exposures") else ""
    return {"missing_decodes": decodes,
            "blind_readers": rows(con, _BLIND_READERS) if gaps else [],
            "unfinished_readers": rows(con, _UNFINISHED_READERS, {"nodes": lossy}) if lossy else [],
            "in_flight_readers": rows(con, _IN_FLIGHT_READERS.format(replayed=replayed), {"nodes": lossy})}


def lost_record_list(con: duckdb.DuckDBPyConnection, found: dict[str, list[dict[str, Any]]] | None = None
                     ) -> list[dict[str, Any]]:
    """Every request :class:`LostRecords` counts, a row each for each part it is in (``what``, of
    :data:`LOST_KINDS`, in that order; by request id within it): its ``request_id``, ``tenant_id``,
    the ``node`` the records place it on or where it read (the first, where several), and whether it
    was ``delivered`` ("yes", "no", or "not known" where no node logged its finish). What the report
    lists beside it (``not_known``), so that the requests the figures only count are named.
    (``found``: the :func:`lost_record_rows` of the case, where already read.)"""
    found = lost_record_rows(con) if found is None else found
    parts: list[tuple[str, dict[str, Any]]] = []
    for r in found["missing_decodes"]:
        parts.append(("unstarted" if r["in_flight"] else "missing_decodes", r))
    for part in ("blind_readers", "unfinished_readers", "in_flight_readers"):
        parts += [(part, r) for r in found[part]]
    if not parts:
        return []
    ids = sorted({str(r["request_id"]) for _, r in parts})
    known = {rid: (tenant, delivered, status) for rid, tenant, delivered, status in con.execute(
        "SELECT request_id, tenant_id, delivered, status FROM requests JOIN (SELECT unnest($ids) AS request_id) "
        "USING (request_id)",  # (a join: list_contains over every request would scan the list for each)
        {"ids": ids}).fetchall()}
    order = list(LOST_KINDS)
    out = []
    for part, r in sorted(parts, key=lambda x: (order.index(x[0]), str(x[1]["request_id"]))):
        tenant, delivered, status = known.get(str(r["request_id"]), (None, None, None))
        out.append({"request_id": r["request_id"], "tenant_id": tenant, "node": r["node"],
                    "delivered": "not known" if status is None else "yes" if delivered else "no",
                    "what": LOST_KINDS[part]})
    return out


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
