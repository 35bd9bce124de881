"""A case file opened for investigation: the notebook API the CLI wraps."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import duckdb
import polars as pl
import pyarrow as pa

from forensics.errors import CaseError, QueryError
from forensics.exposure.analysis import analyse
from forensics.exposure.figures import summary
from forensics.exposure.tiers import (
    LostRecords,
    certainty,
    lost_record_list,
    lost_records,
    missing_page_records,
    page_rows,
    replay_rows,
    tier_figures,
    unseen_late_writes,
)
from forensics.findings import Findings, findings
from forensics.ids import NodeId, PageId, RequestId, TenantId
from forensics.ingestion import source
from forensics.store import case_path, connect, has_table, is_parquet_case, one, sql_text


class Summary(dict[str, int]):
    """The summary figures (of page records): a plain dict that shows itself as a compact table
    in a notebook. ``tiers`` has the figures by the evidence they rest on (page records, each
    replay-backed tier, the total), ``without_page_records`` the engine nodes that logged none,
    ``unseen_late_writes`` the transfers sent to one of those nodes and given up there (a late
    write of one is in no log, and no figure counts what it overwrote), ``lost_records`` what records
    lost leave unknown."""

    tiers: dict[str, dict[str, int | None]]
    without_page_records: tuple[str, ...]
    unseen_late_writes: int = 0
    #: victim requests and affected tenants, certain (named by page records, or by the replay under
    #: every schedule the evidence allows) and possible (forensics.exposure.tiers.certainty)
    certainty: dict[str, dict[str, int]]
    #: what records lost (a seq gap, a log cut short) leave unknown (forensics.exposure.tiers.LostRecords)
    lost_records: LostRecords = LostRecords()

    def _repr_html_(self) -> str:
        every = getattr(self, "tiers", {})
        replayed = any(any(v for v in t.values()) for k, t in every.items() if k not in ("page records", "total"))
        tiers = every if replayed or bool(getattr(self, "without_page_records", None)) else {}
        head = "".join(f"<th>{html.escape(t)}</th>" for t in tiers) or "<th>value</th>"

        def cells(name: str) -> str:
            if not tiers:
                return f"<td style='text-align:right'>{self[name]:,}</td>"
            return "".join(f"<td style='text-align:right'>{'-' if t[name] is None else f'{t[name]:,}'}</td>"
                           for t in tiers.values())

        rows = "".join(f"<tr><td>{html.escape(name)}</td>{cells(name)}</tr>" for name in self)
        table = f"<table><thead><tr><th>figure</th>{head}</tr></thead><tbody>{rows}</tbody></table>"
        missing = getattr(self, "without_page_records", ())
        if missing:
            table += f"<p>Without page records: {html.escape(', '.join(missing))}.</p>"
        certain = getattr(self, "certainty", None)
        if tiers or (certain and certain["victim_requests"]["possible"]):
            v, t = self.certainty["victim_requests"], self.certainty["affected_tenants"]
            pairs = self.certainty.get("exposure_pairs")
            table += (f"<p>Victims: {v['certain']:,} certain, {v['possible']:,} possible (named by the replay "
                      f"under some of the schedules the logs allow, where records are missing, or not ruled out "
                      f"where it could not follow the logs); tenants: {t['certain']:,} certain, "
                      f"{t['possible']:,} possible"
                      + (f"; (reader, victim) pairs: {pairs['certain']:,} certain, {pairs['possible']:,} possible"
                         if pairs else "") + ".</p>")
        lost = getattr(self, "lost_records", LostRecords())
        if lost.in_flight_readers:
            table += (f"<p>Delivery not known: {lost.in_flight_readers:,} request(s) that read other requests' pages "
                      "have no finish in the logs (in flight when they end): counted as contained, not delivered, "
                      "they may have been delivered after.</p>")
        if lost.unstarted:
            table += (f"<p>Not started where the logs end: {lost.unstarted:,} request(s) placed on a decode node "
                      "with no decode start there and no finish in any log.</p>")
        if lost.lost:
            table += (f"<p>Records are missing: {lost.requests:,} request(s) decoded with no record of it left "
                      f"({html.escape(', '.join(lost.nodes))}), {lost.blind_readers:,} read pages never written in the "
                      f"records that remain after a seq gap, {lost.unfinished_readers:,} read there with no finish on "
                      "any node: what they read, or whether they were delivered, is not known.</p>")
        unseen = getattr(self, "unseen_late_writes", 0)
        if unseen:
            table += (f"<p>{unseen:,} transfer(s) sent by prefill and given up by a node without page records: "
                      "a late write there is in no log, and no figure counts what it overwrote "
                      "(finding handoff.sent_but_not_received).</p>")
        return table


@dataclass(frozen=True)
class RequestReport:
    """Everything the case knows of one request."""

    request_id: RequestId
    lifecycle: pl.DataFrame  # its request and transfer records, in node order
    pages: pl.DataFrame  # its page records on each node
    saw: pl.DataFrame  # exposures where it read another request's content
    seen_by: pl.DataFrame  # exposures where another request read its content
    uninitialized: pl.DataFrame  # its reads of pages never written in the boot


class Case:
    """An investigation over one case database.

    Opening a case whose records changed since the last analysis re-runs the analysis
    (unless opened read-only, when a stale case is an error). ``Case(path)`` opens the case and
    closes it with itself; :meth:`Case.on` takes a case already open.
    """

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        path = Path(path)
        read_only = read_only or is_parquet_case(path)  # (a Parquet case is analysed where written)
        self._start(path, connect(path, read_only=read_only, create=False), read_only, owned=True)

    @classmethod
    def on(cls, con: duckdb.DuckDBPyConnection, *, read_only: bool = False) -> Case:
        """The case open on ``con``, which its holder closes (closing this leaves it open).
        ``read_only``: a stale case is an error, not analysed again."""
        case = cls.__new__(cls)
        case._start(case_path(con), con, read_only, owned=False)
        return case

    def _start(self, path: Path, con: duckdb.DuckDBPyConnection, read_only: bool, *, owned: bool) -> None:
        self.path = path
        self.read_only = read_only
        self._con = con
        self._owned = owned
        if self._stale():
            if self.read_only:
                self.close()
                raise CaseError(f"{self.path}: not analysed yet (run 'kvforensics investigate')")
            analyse(self._con)

    def _stale(self) -> bool:
        row = one(
            self._con,
            "SELECT (SELECT value FROM case_meta WHERE key = 'analysed_records'), "
            "(SELECT count(*)::VARCHAR FROM records)",
        )
        assert row is not None
        return row[0] != row[1]

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The case's DuckDB connection, for queries the API does not cover."""
        return self._con

    def close(self) -> None:
        """Close the case's connection, where the case opened it."""
        if self._owned:
            self._con.close()

    def __enter__(self) -> Case:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _frame(self, query: str, params: list[object] | None = None) -> pl.DataFrame:
        return self._con.sql(query, params=params or None).pl()

    def summary(self) -> Summary:
        """The eight exposure figures of log-schema.md section 5 (a dict; a table in a notebook),
        with ``.tiers``: the figures by the evidence they rest on, where replay fills in."""
        out = Summary(summary(self._con))
        out.tiers = tier_figures(self._con)
        out.without_page_records = tuple(missing_page_records(self._con))
        out.unseen_late_writes = unseen_late_writes(self._con)
        out.certainty = certainty(self._con)
        out.lost_records = lost_records(self._con)
        return out

    def not_known(self) -> pl.DataFrame:
        """The requests the records leave unknown where records are missing or the logs end (what
        ``summary().lost_records`` counts): a row for each, with its tenant, node, whether it was
        delivered ("not known" where no node logged its finish) and what is not known of it
        (``forensics.exposure.tiers.lost_record_list``); none on complete logs. The report lists
        them as ``not_known``."""
        columns = {"request_id": pl.Utf8, "tenant_id": pl.Utf8, "node": pl.Utf8, "delivered": pl.Utf8,
                   "what": pl.Utf8}
        return pl.DataFrame(lost_record_list(self._con), schema=columns, orient="row")

    def exposures(
        self,
        *,
        tenant: TenantId | str | None = None,
        request: RequestId | str | None = None,
        victim: RequestId | str | None = None,
        delivered_only: bool = False,
        page_records_only: bool = False,
    ) -> pl.DataFrame:
        """Exposure rows, filtered by tenant (reader's or victim's), reader or victim request.

        Where the whole job filled in from the replay (``replay_exposures``: nodes or windows
        without page records), those rows come too, their ``evidence`` saying so, unless
        ``page_records_only``. A tenant or request the case has no record of is a
        :class:`QueryError` (an empty list would read as "not exposed").
        """
        if tenant is not None:
            self._known("tenant", "tenant_id", tenant)
        for rid in (request, victim):
            if rid is not None:
                self._known("request", "request_id", rid)
        replayed = (replay_rows(self._con) if has_table(self._con, "replay_exposures")
                    else "SELECT * FROM exposures WHERE FALSE")
        query = sql_text("exposures_query.sql").replace("{replay_rows}", replayed)
        return self._con.sql(query.replace("{page_rows}", page_rows(self._con)), params={
            "tenant": tenant, "request": request, "victim": victim, "delivered_only": delivered_only,
            "page_records_only": page_records_only}).pl()

    def _known(self, what: str, column: str, value: str) -> None:
        """Refuse a ``what`` (its ``column`` equal to ``value``) that no record of the case names."""
        exists = one(self._con, f"SELECT EXISTS (SELECT 1 FROM records WHERE {column} = ?)", [value])
        if not exists or not exists[0]:
            raise QueryError(f"no {what} {value!r} in the case")

    def request(self, request_id: RequestId | str) -> RequestReport:
        """A request's lifecycle, pages, whose content it saw and who saw its content."""
        self._known("request", "request_id", request_id)
        lifecycle = self._frame(
            "SELECT node, boot, seq, ts, kind, event, status, reason, tenant_id, prompt_tokens, "
            "transfer_id, src_node, dst_node, tokens FROM records "
            "WHERE request_id = ? AND kind IN ('request', 'transfer') "
            "ORDER BY ts, node, boot, seq NULLS FIRST",
            [request_id],
        )
        pages = self._frame(
            "SELECT node, boot, seq, ts, op, pages, source FROM records "
            "WHERE request_id = ? AND kind = 'kv' ORDER BY node, boot, seq",
            [request_id],
        )
        saw = self.exposures(request=request_id)
        seen_by = self.exposures(victim=request_id)
        uninitialized = self._frame(
            "SELECT node, boot, lo, hi, seq, inferred FROM uninitialized_reads "
            "WHERE request_id = ? ORDER BY node, boot, lo",
            [request_id],
        )
        return RequestReport(RequestId(request_id), lifecycle, pages, saw, seen_by, uninitialized)

    def verbatim(self, rows: pl.DataFrame | Sequence[tuple[int, int]]) -> pl.DataFrame:
        """The text of the lines at ``rows`` as read: the evidence behind records, duplicates and
        quarantined lines.

        ``rows``: ``(file_id, line_no)`` pairs, or a frame with those columns (any query of
        ``records``). Returns ``file_id, line_no, path, text`` in file and line order. A CSV row
        that goes on over more lines comes whole; a Parquet row, as the JSON made of it. The text
        may hold user content: nothing is printed.
        """
        if isinstance(rows, pl.DataFrame):
            keys = rows.select(pl.col("file_id").cast(pl.Int32), pl.col("line_no").cast(pl.Int64)).to_arrow()
        else:
            keys = pa.table({"file_id": pa.array([r[0] for r in rows], pa.int32()),
                             "line_no": pa.array([r[1] for r in rows], pa.int64())})
        self._con.register("wanted_lines", keys)
        try:
            self._con.register("wanted_texts", source.texts(self._con, "wanted_lines"))
            return self._frame(sql_text("verbatim.sql"))
        finally:
            self._con.unregister("wanted_lines")
            self._con.unregister("wanted_texts")

    def request_lines(self, request_id: RequestId | str) -> pl.DataFrame:
        """The log lines of a request's records, as read (:meth:`verbatim`), in file and line order."""
        return self.verbatim(self._frame("SELECT file_id, line_no FROM records WHERE request_id = ?", [request_id]))

    def page_timeline(self, node: NodeId | str, page: PageId | int, *, boot: int | None = None) -> pl.DataFrame:
        """Every page operation on ``page`` of ``node`` in (boot, seq) order, with inferred reads (a
        node the case has no record of is a :class:`QueryError`)."""
        self._known("node", "node", node)
        return self._frame(sql_text("page_timeline.sql"), [node, boot, boot, page])

    def findings(self) -> Findings:
        """Root-cause signatures and evidence gaps found in the case (forensics/sql/findings.sql)."""
        return Findings(findings(self._con))

    def sql(self, query: str) -> pl.DataFrame:
        """A read-only query over the case's tables (on a writable case, one SELECT only)."""
        try:
            if not self.read_only:
                statements = self._con.extract_statements(query)
                if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                    raise QueryError(
                        "Case.sql runs one read-only SELECT query; open the case read-only for anything else"
                    )
            return self._con.sql(query).pl()
        except duckdb.Error as exc:
            raise QueryError(str(exc).splitlines()[0]) from exc


#: Rows ``kvforensics sql`` prints unless told otherwise (``--limit``, ``--no-limit``).
SQL_ROW_LIMIT = 1000


@dataclass(frozen=True)
class QueryResult:
    """A query's rows, and whether more were left out by its row limit."""

    frame: pl.DataFrame
    truncated: bool


def run_read_only(path: Path, query: str, *, limit: int | None = SQL_ROW_LIMIT) -> QueryResult:
    """Run one read-only query on the case in DuckDB's sandbox: the connection is read-only, with
    external access off and its configuration locked, so the query reads the case's tables and
    nothing else (no file, no network, no extension, no setting). At most ``limit`` rows (None:
    every row)."""
    if not query.strip():
        raise QueryError("no SQL query given")
    con = connect(path, read_only=True, create=False)
    try:
        if is_parquet_case(Path(path)):  # its tables are views of its files: those, and nothing else
            folder = str(Path(path).resolve()).replace("'", "''")
            con.execute(f"SET allowed_directories = ['{folder}/']")
        con.execute("SET enable_external_access = false")
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET lock_configuration = true")
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as exc:
            raise QueryError(str(exc).splitlines()[0]) from exc
        if len(statements) != 1:
            raise QueryError(f"one query at a time: this is {len(statements)} statements")
        if statements[0].type not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
            kind = statements[0].type.name.lower()
            raise QueryError(f"only a read-only query (SELECT) runs here, not a {kind} statement")
        try:
            result = con.sql(query)
            if result is None:
                raise QueryError("the SQL gives no rows to show (a statement, not a query)")
            frame = (result if limit is None else result.limit(limit + 1)).pl()
        except duckdb.Error as exc:
            raise QueryError(str(exc).splitlines()[0]) from exc
        if limit is not None and frame.height > limit:
            return QueryResult(frame.head(limit), True)
        return QueryResult(frame, False)
    finally:
        con.close()


def quarantined(
    path: Path | str, *, reason: str | None = None, with_raw: bool = False
) -> pl.DataFrame:
    """Quarantined records with file, line and reason; their text only when asked."""
    raw = ", q.raw" if with_raw else ""
    con = connect(path, read_only=True, create=False)
    try:
        return con.sql(
            f"SELECT f.path AS file, q.line_no AS line, q.reason, q.detail{raw} "
            "FROM quarantine q JOIN files f USING (file_id) "
            "WHERE $reason::VARCHAR IS NULL OR q.reason = $reason::VARCHAR "
            "ORDER BY f.path, q.line_no",
            params={"reason": reason},
        ).pl()
    finally:
        con.close()
