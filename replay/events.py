"""What a replay reads of each node of the case: its request and transfer records in its order,
each with its request's plan, in one query for every node, handed out a node at a time."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol

import duckdb
import pyarrow as pa

from replay.logset import ts_text, ts_texts
from replay.planning import PLAN_SQL
from replay.scratch import BATCH, reader
from replay.statements import SqlList, statement

#: A record's fields as a node's replay reads them.
EVENT_FIELDS = (
    "kind", "ts", "node", "boot", "seq", "request_id", "event", "tenant_id", "prompt_tokens",
    "max_new_tokens", "prefill_node", "decode_node", "reason", "limit_tokens", "status",
    "finish_reason", "output_tokens", "transfer_id", "src_node", "dst_node", "src_pages",
    "dst_pages", "tokens", "bytes", "cached_tokens", "running", "steps", "cache", "retractions",
)
_N_EVENT = len(EVENT_FIELDS)

#: A request's events on a node that come before its transfer ends there, and after.
BEFORE_TRANSFER_END = {("request", "received"), ("request", "admitted"), ("request", "prefill_started"),
                       ("request", "prefill_done"), ("transfer", "started")}
AFTER_TRANSFER_END = {("request", "decode_started"), ("request", "finished")}
#: The sort key of a record without seq (the node's order is then its time's).
NO_SEQ = 1 << 62


def _kinds(events: set[tuple[str, str]], prefix: str) -> str:
    """SQL: a record is one of ``events`` (kind, event)."""
    return "(" + " OR ".join(f"({prefix}kind = '{k}' AND {prefix}event = '{e}')" for k, e in sorted(events)) + ")"


#: The replay's own marks on a record it reads (this module, replay.carried): where it comes in the
#: node's order, its time in ns, the node that logged a carried transfer end.
MARKS = ("_ns", "_i", "_finish_i", "_carried", "_seq_key")


def named(event: dict[str, Any]) -> str:
    """How a step record is named where it is listed: its seq, else its time."""
    return f"seq {event['seq']}" if event["seq"] is not None else f"at {event['ts']}"


def ok_status(status: Any) -> bool:
    """Whether a finish's status is a delivery's (2xx)."""
    return isinstance(status, int) and 200 <= status <= 299


#: Where a record is in its file (the last of a node's order's keys).
_PLACE = ("file_id", "line_no", "part")
#: A decode start's fields as the transfer end it implies.
_IMPLIED = {"kind": "'transfer' AS kind", "event": "'completed' AS event", "dst_node": "node AS dst_node"}

#: The lists of sql/replay.sql the records' statements name.
_LISTS = {
    "event_fields": SqlList.columns(EVENT_FIELDS),
    # its time in microseconds since the epoch
    "event_values": SqlList(lambda t: ", ".join(f"epoch_us({t}ts) AS ts" if f == "ts" else t + f
                                                for f in EVENT_FIELDS)),
    "before_transfer_end": SqlList(lambda t: _kinds(BEFORE_TRANSFER_END, t)),
    # a decode start as the transfer end it implies: the event's fields and its place, nothing
    # else of the record (its text among them: a window over every decode start holds each row)
    "implied_end": SqlList(lambda t: ", ".join(_IMPLIED.get(f, t + f) for f in (*EVENT_FIELDS, *_PLACE))),
    "plan_columns": PLAN_SQL,
}


def node_statement(name: str) -> str:
    """The statement ``name`` of sql/replay.sql, with the lists of a node's records filled in."""
    return statement(name, **_LISTS)


class Row(NamedTuple):
    """A record of a node's replay stream: the record, whether it is the last of its request in
    the node's logged order, its request's ``replay_plans`` row (None: a request the router never
    logged), and whether the logs show the request served."""

    record: dict[str, Any]
    last: bool
    plan: tuple[Any, ...] | None
    served: bool


class ByNode:
    """The rows of a query ordered by node first, handed out a node at a time: one query for
    every node, not one a node (a replay of ten thousand nodes ran 40 ms of queries a node). The
    nodes are asked for in the order the query gives them (Python's and DuckDB's string orders
    agree: code points); a node asked for takes its rows, a node passed over is skipped.

    Read from the query's Arrow batches (its first column the node): a node's rows as tuples
    (:meth:`of`), or as the batches' slices (:meth:`batches_of`: a compiled replay reads them as
    columns)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._batch: pa.RecordBatch | None = None
        self._nodes: list[str] = []  # the batch's nodes, in order
        self._at = 0  # the batch's first row not handed out

    def _current(self) -> bool:
        """Whether rows are left (the next batch taken where this one is done)."""
        while self._at >= len(self._nodes):
            batch = next(self._batches, None)
            if batch is None:
                self._batch, self._nodes, self._at = None, [], 0
                return False
            self._batch, self._nodes, self._at = batch, batch.column(0).to_pylist(), 0
        return True

    def has(self, node: str) -> bool:
        """Whether ``node`` has rows (the rows of nodes before it skipped)."""
        while self._current():
            if self._nodes[-1] >= node:
                self._at = bisect.bisect_left(self._nodes, node, self._at)
                return self._nodes[self._at] == node
            self._at = len(self._nodes)
        return False

    def batches_of(self, node: str) -> Iterator[pa.RecordBatch]:
        """``node``'s rows as slices of the query's batches, without the node."""
        while self.has(node):
            assert self._batch is not None
            end = bisect.bisect_right(self._nodes, node, self._at)
            start, self._at = self._at, end
            yield self._batch.slice(start, end - start).drop_columns([self._batch.schema.names[0]])

    def of(self, node: str) -> Iterator[tuple[Any, ...]]:
        """``node``'s rows, without the node (the rows of nodes before it skipped)."""
        for batch in self.batches_of(node):
            yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


class NodeReader(Protocol):
    """What a node's replay reads: each node's rows of the four queries (handed out a node at a
    time, in node order) and its times' resolution."""

    events: ByNode
    carried: ByNode
    horizons: ByNode
    spans: ByNode
    resolution: dict[str, int]


class NodeQueries:
    """What the replay reads of each node, for every node in a query each (:class:`ByNode`):
    its events in its order, the transfer ends other nodes logged for it, and on decode nodes
    the spans and horizons its step clock is fitted to. ``roles``: the engine nodes' roles;
    ``resolution``: each node's times' resolution (:func:`resolutions`)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, roles: dict[str, str], resolution: dict[str, int]) -> None:
        prepare(con, roles)
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self.events = self._query(con, node_statement("node_events"))
        self.carried = self._query(con, node_statement("carried_ends"))
        self.horizons = self._query(con, statement("decode_horizons"))
        self.spans = self._query(con, statement("decode_spans"))
        self.resolution = resolution  # (resolutions(con), read once by the replay)

    def _query(self, con: duckdb.DuckDBPyConnection, sql: str) -> ByNode:
        cur = reader(con)
        self._cursors.append(cur)
        return ByNode(iter(cur.sql(sql).to_arrow_reader(BATCH)))

    def close(self) -> None:
        for cur in self._cursors:
            cur.close()


def prepare(con: duckdb.DuckDBPyConnection, roles: dict[str, str]) -> None:
    """The scratch tables the node queries read: the engine nodes' roles, and the transfer ends
    each is carried (``carried_rows``)."""
    con.execute(statement("create_roles"))
    con.executemany(statement("insert_role"), sorted((n, r) for n, r in roles.items() if r in ("prefill", "decode")))
    rows = node_statement("carried_rows")
    if not con.execute(statement("carried_any")).fetchall()[0][0]:  # (none may be: the table made empty)
        rows = rows.rstrip().rstrip(";") + " LIMIT 0"
    con.execute(rows)


def resolutions(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Each node's request times' resolution in ns: whole milliseconds where every one is."""
    return {node: 1_000_000 if whole_ms else 1_000
            for node, whole_ms in con.execute(statement("whole_milliseconds")).fetchall()}


def node_rows(con: Any) -> dict[str, int]:
    """The nodes that logged request or transfer records, with how many records each has of the
    kinds a replay reads (request, transfer, step)."""
    return dict(con.execute(statement("node_rows")).fetchall())


def node_events(batches: Iterator[pa.RecordBatch]) -> Iterator[Row]:
    """One node's request and transfer records, in its order (its batches of ``node_events``,
    ``ByNode.batches_of``): each row as :func:`row_of` reads it, its times written a batch at a time."""
    assert EVENT_FIELDS[1] == "ts"
    for batch in batches:
        micros = batch.column("ts")
        if micros.null_count:  # (a record without its time: row_of's error, as it always was)
            for row in zip(*(column.to_pylist() for column in batch.columns), strict=True):
                out = row_of(row[:-2])
                out.record["_finish_i"], out.record["_i"] = row[-2], row[-1]
                yield out
            continue
        columns = [[None] * len(c) if c.null_count == len(c) else c.to_pylist() for c in batch.columns]
        columns[1] = ts_texts(micros).to_pylist()
        nanos = (micros.to_numpy() * 1000).tolist()
        for row, ns in zip(zip(*columns, strict=True), nanos, strict=True):
            record = dict(zip(EVENT_FIELDS, row[:_N_EVENT], strict=False))
            record["_ns"] = ns
            # where it and its request's delivered finish come in the node's order
            record["_finish_i"], record["_i"] = row[-2], row[-1]
            plan_row = row[_N_EVENT + 2:-2]
            yield Row(record, bool(row[_N_EVENT + 1]), None if plan_row[-1] is None else plan_row, bool(row[_N_EVENT]))


def row_of(row: tuple[Any, ...]) -> Row:
    """A row of ``node_events`` or ``carried_ends``: the record's fields, whether the request is
    served, one more (its last, or its place), then its plan."""
    record = dict(zip(EVENT_FIELDS, row[:_N_EVENT], strict=True))
    record["_ns"] = record["ts"] * 1000
    record["ts"] = ts_text(record["_ns"])
    plan_row = row[_N_EVENT + 2:]
    return Row(record, bool(row[_N_EVENT + 1]), None if plan_row[-1] is None else plan_row, bool(row[_N_EVENT]))
