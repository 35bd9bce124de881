"""Replaying a case through the reference engine: confirmation and what-if.

The replay reads a case's configs, request events and transfer records (never its page
records), feeds each node's events to the engine in the node's logged ``(boot, seq)`` order,
writes the replayed log set (the events that still happen under the engine, with the page
records they cause, numbered afresh per node), ingests and analyses it as a case of its own.

With the engine and configuration the logs were made with, this reconstructs the pages: where
the case has page records too, the agreement is measured (allocations reproduced page for
page; exposed responses confirmed, replay-only, log-only). With another engine, pool or
context window it answers what-if. A request with no engine events in the log (rejected by
the router as logged) cannot be replayed in logged order; such requests are counted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import json
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import pyarrow as pa

import forensics
from forensics.adapters.sglang.eras import releases_of
from forensics.errors import CaseError, OutputExists
from forensics.ingestion import source
from forensics.schema import V1_1_CONFIG
from forensics.store import connect, one, scan, session
from replay.engine import BEHAVIOURS, Disagreement, NodeConfig, NodeEngine, Plan, Request, decode_steps, plan
from replay.logset import LogSet, ts_ns, ts_text
from replay.schedule import LOGGED, Cadence, Horizon, Schedule, StepClock
from replay.simulate import (
    DECODE_PER_TOKEN,
    PREFILL_FIXED,
    PREFILL_PER_TOKEN,
    TRANSFER_FIXED,
    TRANSFER_PER_TOKEN,
    pool_pages,
)

_EVENT_FIELDS = (
    "kind", "ts", "node", "boot", "seq", "request_id", "event", "tenant_id", "prompt_tokens",
    "max_new_tokens", "prefill_node", "decode_node", "reason", "limit_tokens", "status",
    "finish_reason", "output_tokens", "transfer_id", "src_node", "dst_node", "src_pages",
    "dst_pages", "tokens", "bytes",
)
_CONFIG_FIELDS = ("node", "boot", "seq", "ts", "role", "engine", "engine_version", "model",
                  "context_length", "page_size", "pool_pages")


#: What a replay folder holds; only such a folder is replaced by the next replay.
_REPLAY_FILES = {"logs", "replay.duckdb", "replay.duckdb.wal"}


@dataclass(frozen=True)
class WhatIf:
    """The counterfactual of a replay; all ``None`` replays the case as configured."""

    prefill_pool_tokens: int | None = None
    context_length: int | None = None

    def apply(self, config: NodeConfig) -> NodeConfig:
        """``config`` with the what-if's changes."""
        changes: dict[str, Any] = {}
        if self.context_length is not None:
            changes["context_length"] = self.context_length
        if self.prefill_pool_tokens is not None and config.role == "prefill":
            changes["pool_pages"] = pool_pages(self.prefill_pool_tokens, config.page_size)
        return dataclasses.replace(config, **changes)


@dataclass(frozen=True)
class Overlap:
    """What two sets have in common: in both (confirmed), in the replay only, in the logs only."""

    confirmed: int
    replay_only: int
    log_only: int

    @classmethod
    def of(cls, logged: set[Any], replayed: set[Any]) -> Overlap:
        """The overlap of the logged and the replayed set."""
        return cls(len(logged & replayed), len(replayed - logged), len(logged - replayed))


@dataclass(frozen=True)
class Agreement:
    """How a replay compares with the case's page records."""

    logged_allocations: int
    reproduced_allocations: int  # page for page
    exposed_responses: Overlap
    exposure_pairs: Overlap

    def as_dict(self) -> dict[str, Any]:
        """As JSON-ready data (the case's ``replays.agreement``)."""
        logged, same = self.logged_allocations, self.reproduced_allocations
        return {
            "allocations": {"logged": logged, "reproduced": same,
                            "share": round(same / logged, 6) if logged else None},
            "exposed_responses": dataclasses.asdict(self.exposed_responses),
            "exposure_pairs": dataclasses.asdict(self.exposure_pairs),
        }


@dataclass(frozen=True)
class ReplayResult:
    """Figures of the replayed log set, and how it compares with the case's own page records."""

    engine: str
    what_if: WhatIf
    out: Path
    records: int
    exposure: dict[str, int]
    not_replayed: int  # requests that could not be placed on any node
    agreement: Agreement | None  # None where the case has no page records
    #: "confirm" (the engine the logs were made with, as configured: the logs are followed where
    #: the model disagrees) or "what-if" (another engine or configuration: the model decides)
    mode: str = "confirm"
    disagreements: tuple[Disagreement, ...] = ()  # confirm: where the model could not follow the logs
    outcomes_changed: int = 0  # requests delivered in the logs and not in the replay, or the reverse
    #: which of the step counts the evidence admits the replay took (replay.schedule.Schedule)
    schedule: Schedule = LOGGED
    #: decode-node events whose step count the evidence does not decide (times too close to a
    #: step's launch for the node's pace): where there are any, other schedules may name other victims
    ambiguous_steps: int = 0
    ambiguous_nodes: tuple[str, ...] = ()  # the decode nodes where they are
    #: what the replay took for granted that the logs do not say (:func:`assumptions`)
    assumed: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The replay as JSON-ready data."""
        kinds: dict[str, int] = {}
        for d in self.disagreements:
            kinds[d.kind] = kinds.get(d.kind, 0) + 1
        return {
            "engine": self.engine,
            "mode": self.mode,
            "what_if": {k: v for k, v in dataclasses.asdict(self.what_if).items() if v is not None},
            "out": str(self.out),
            "records": self.records,
            "exposure": self.exposure,
            "not_replayed": self.not_replayed,
            "agreement": None if self.agreement is None else self.agreement.as_dict(),
            "outcomes_changed": self.outcomes_changed,
            "schedule": self.schedule.name,
            "ambiguous_steps": self.ambiguous_steps,
            "ambiguous_nodes": list(self.ambiguous_nodes),
            "assumed": list(self.assumed),
            "disagreements": {"count": len(self.disagreements), "by_kind": dict(sorted(kinds.items())),
                              "list": [d.as_dict() for d in self.disagreements]},
        }


def replay(db: Path | str, engine: str, out: Path | str, *, what_if: WhatIf = WhatIf(),
           schedule: Schedule = LOGGED, only: frozenset[str] | None = None) -> ReplayResult:
    """Replay the case ``db`` under ``engine`` into the folder ``out`` (replaced), taking
    ``schedule``'s step count wherever a decode node's evidence admits more than one.

    With ``only``, just those engine nodes are replayed (and the nodes without an engine config,
    which pass their events through): a replay of part of the case, to compare the exposures
    there under another schedule; it is not measured against the logs nor kept in the case's
    ``replays``, as a whole replay is.

    Memory stays flat in the number of requests: the requests' plans and the ones the logs show
    served are tables of a scratch DuckDB (spilled to disk under its memory limit), each node's
    records are read in batches in the node's order, the engine holds a request only while it is
    in flight on the node, and the replayed records go to their files as they are made."""
    if engine not in BEHAVIOURS:
        raise CaseError(f"unknown engine {engine!r}; one of: {', '.join(BEHAVIOURS)}")
    out = Path(out)
    connect(db, read_only=True, create=False).close()  # (a case of this schema, or a clear error)
    with tempfile.TemporaryDirectory(prefix="kvforensics-replay-") as spill:
        con = _scratch(Path(db), Path(spill))
        try:
            configs = _configs(con)
            assumed = assumptions(configs)
            has_pages = (one(con, "SELECT count(*) FROM records WHERE kind = 'kv'") or (0,))[0] > 0
            if not any(c.role in ("prefill", "decode") for per_node in configs.values() for _, _, _, c in per_node):
                raise CaseError(f"{db}: no prefill or decode config records, nothing to replay")
            roles = {node: per[-1][3].role for node, per in configs.items() if per}
            confirming = what_if == WhatIf() and engine == (logged_engine(configs) or "sglang-placeholder")
            mode = "confirm" if confirming else "what-if"
            disagreements: list[Disagreement] = []
            clocks: list[StepClock] = []
            unlogged = _plan_requests(con, configs, roles, engine, what_if, mode == "confirm", disagreements)
            con.execute(f"CREATE TABLE memory.main.replay_served AS {_DELIVERED}" if mode == "confirm"
                        else "CREATE TABLE memory.main.replay_served (request_id VARCHAR)")
            extra, not_replayed = _arrival_events(unlogged, configs)
            _make_room(out)
            logs = out / "logs"
            log = LogSet(into=logs, packed=True)
            queries = _NodeQueries(con, roles)
            for node in sorted(set(configs) | _nodes_with_events(con)):
                if only is not None and node not in only and roles.get(node) in ("prefill", "decode"):
                    continue
                _replay_node(queries, node, configs.get(node, []), roles.get(node), engine, what_if, log,
                             unlogged, extra.get(node, []), mode == "confirm", disagreements, schedule, clocks)
                log.flush(node, logs)
            queries.close()
            log.close()
            logs.mkdir(parents=True, exist_ok=True)
        finally:
            con.close()
    case = out / "replay.duckdb"
    result = forensics.investigate([logs], case)
    if only is not None:
        return ReplayResult(engine, what_if, out, log.records, result.exposure, not_replayed, None, mode,
                            tuple(disagreements), 0, schedule, sum(c.ambiguous for c in clocks),
                            _ambiguous_nodes(clocks), assumed)
    agreement = _agreement(Path(db), case) if has_pages else None
    changed = _outcomes_changed(Path(db), case)
    if mode == "confirm":  # following the logs, the replay should answer as they do: say where not
        disagreements += [Disagreement(rid, "replay", "model_outcome_differs",
                                       "delivered in the logs, not in the replay" if delivered
                                       else "delivered in the replay, not in the logs")
                          for rid, delivered in changed]
    done = ReplayResult(engine, what_if, out, log.records, result.exposure, not_replayed, agreement, mode,
                        tuple(disagreements), len(changed), schedule, sum(c.ambiguous for c in clocks),
                        _ambiguous_nodes(clocks), assumed)
    _remember(Path(db), done)
    return done


def _ambiguous_nodes(clocks: list[StepClock]) -> tuple[str, ...]:
    return tuple(sorted({c.node for c in clocks if c.ambiguous}))


#: Rows read from the case at a time (the requests' facts, a node's records).
_BATCH = 8192
#: The scratch DuckDB's memory limit: past it, it spills to disk.
SCRATCH_MEMORY = "512MiB"


def _scratch(db: Path, spill: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the case ``db`` attached read-only as its default catalog; the
    replay's own tables go in ``memory`` (spilled to ``spill`` past :data:`SCRATCH_MEMORY`)."""
    con = duckdb.connect()
    session(con)
    con.execute(f"SET memory_limit = '{SCRATCH_MEMORY}'")
    con.execute(f"SET temp_directory = '{_sql_path(spill)}'")
    con.execute(f"ATTACH '{_sql_path(db)}' AS case_db (READ_ONLY)")
    con.execute("USE case_db")
    return con


def _reader(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A second connection to the scratch DuckDB, for a query read in batches while ``con``
    writes (registered tables are per connection; ``memory`` is shared)."""
    cur = con.cursor()
    cur.execute("USE case_db")
    return cur


def _batches(cur: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None
             ) -> Iterator[tuple[Any, ...]]:
    """The rows of ``sql``, read :data:`_BATCH` at a time."""
    for batch in cur.sql(sql, params=params or {}).to_arrow_reader(_BATCH):
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def _make_room(out: Path) -> None:
    """Clear ``out`` for the replay: an earlier replay's folder is replaced, anything else refused."""
    if out.exists():
        if not out.is_dir() or not {p.name for p in out.iterdir()} <= _REPLAY_FILES:
            raise OutputExists(f"{out}: exists and is not an earlier replay's folder; choose another --out")
        shutil.rmtree(out)


def logged_engine_of(db: Path | str) -> str | None:
    """:func:`logged_engine` of the case ``db``."""
    con = connect(db, read_only=True, create=False)
    try:
        return logged_engine(_configs(con))
    finally:
        con.close()


def logged_engine(configs: dict[str, list[tuple[int, int, str, NodeConfig]]]) -> str | None:
    """The engine behaviour the logs were made with, where the prefill configs say: SGLang before
    0.5.22 hands a length-rejected prompt off as a placeholder; from 0.5.22 it retires it at
    prefill (reference-engine.md; the 0.5.21 wheel already retires, docs/adapters.md). An
    ``engine_version`` may be a range of releases (what an adapter read from the formats,
    ``0.5.12-0.5.15``): it decides where all its releases are on one side. None where no config
    says (another engine, no version, a range across the change)."""
    versions = {(c.engine, c.engine_version) for per in configs.values() for _, _, _, c in per if c.role == "prefill"}
    if len(versions) != 1:
        return None
    (name, version), = versions
    if name != "sglang":
        return None
    releases = releases_of(version)
    if releases is not None:
        sides = {_numbers(r) >= HARDENED_FROM for r in releases}
        return None if len(sides) != 1 else ("sglang-hardened" if sides.pop() else "sglang-placeholder")
    parts = version.split(".")
    if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
        return None
    return "sglang-hardened" if _numbers(version) >= HARDENED_FROM else "sglang-placeholder"


#: The release from which reference-engine.md has SGLang retire a length-rejected prompt.
HARDENED_FROM = (0, 5, 22)


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:3])


def _outcomes_changed(logged: Path, replayed: Path) -> list[tuple[str, bool]]:
    """Requests delivered in the logs and not in the replay, or the reverse: (request id,
    delivered in the logs), by request id."""
    ok = ("SELECT request_id, coalesce(bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400), FALSE) "
          "AS ok FROM {}request_events WHERE event = 'finished' GROUP BY request_id")
    with _beside(logged, replayed) as con:
        rows = con.execute(f"""
            WITH l AS ({ok.format("logged.")}), r AS ({ok.format("")})
            SELECT request_id, coalesce(l.ok, FALSE) FROM l FULL JOIN r USING (request_id)
            WHERE coalesce(l.ok, FALSE) <> coalesce(r.ok, FALSE) ORDER BY request_id""").fetchall()
    return [(str(rid), bool(delivered)) for rid, delivered in rows]


def default_out(db: Path | str, engine: str, what_if: WhatIf) -> Path:
    """``CASE.replay-ENGINE[-pool-N][-context-N]`` beside the case."""
    db = Path(db)
    name = f"{db.stem}.replay-{engine}"
    if what_if.prefill_pool_tokens is not None:
        name += f"-pool-{what_if.prefill_pool_tokens}"
    if what_if.context_length is not None:
        name += f"-context-{what_if.context_length}"
    return db.with_name(name)


def _remember(db: Path, result: ReplayResult) -> None:
    """Keep the replay's figures in the case's ``replays`` table (for the report)."""
    d = result.as_dict()
    what_if = json.dumps(d["what_if"], sort_keys=True)
    con = connect(db)
    try:
        con.execute("BEGIN")
        con.execute(
            "INSERT OR REPLACE INTO replays (engine, what_if, out, records, not_replayed, exposure, agreement, mode, "
            "outcomes_changed, disagreements, ambiguous_steps, assumed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [result.engine, what_if, str(result.out), result.records,
             result.not_replayed, json.dumps(result.exposure),
             None if result.agreement is None else json.dumps(result.agreement.as_dict()), result.mode,
             result.outcomes_changed, len(result.disagreements), result.ambiguous_steps, json.dumps(d["assumed"])],
        )
        con.execute("DELETE FROM replay_disagreements WHERE engine = ? AND what_if = ?", [result.engine, what_if])
        if result.disagreements:
            con.executemany("INSERT INTO replay_disagreements VALUES (?, ?, ?, ?, ?, ?)",
                            [[result.engine, what_if, x.request_id, x.node, x.kind, x.detail]
                             for x in result.disagreements])
        con.execute("COMMIT")
    finally:
        con.close()


# -- reading the case -------------------------------------------------------------------------


def _configs(con: Any) -> dict[str, list[tuple[int, int, str, NodeConfig]]]:
    rows = con.execute(
        f"SELECT {', '.join(_CONFIG_FIELDS)}, file_id, line_no, doc FROM records WHERE kind = 'config' "
        "ORDER BY node, boot, seq NULLS FIRST, ts, file_id, line_no"
    ).fetchall()
    stated = _stated(con, [(r[-3], r[-2]) for r in rows if r[-1] is None])
    out: dict[str, list[tuple[int, int, str, NodeConfig]]] = defaultdict(list)
    for node, boot, seq, ts, role, eng, version, model, ctx, page_size, pool, file_id, line_no, doc in rows:
        said = _scheduling(doc if doc is not None else stated.get((file_id, line_no)))
        out[node].append((boot, -1 if seq is None else seq, _ts(ts),
                          NodeConfig(node, role, ctx, page_size, pool, eng, version, model, **said,
                                     said=tuple(sorted(said)))))
    return out




def assumptions(configs: dict[str, list[tuple[int, int, str, NodeConfig]]]) -> tuple[str, ...]:
    """What the replay assumed that the logs do not say: the decode nodes whose config does not
    state whether the overlap scheduler ran (v1.1's ``overlap_schedule``), taken to be on."""
    unsaid = sorted(node for node, per in configs.items()
                    if any(c.role == "decode" and "overlap_schedule" not in c.said for _, _, _, c in per))
    if not unsaid:
        return ()
    shown = ", ".join(unsaid[:5]) + (f" and {len(unsaid) - 5:,} more" if len(unsaid) > 5 else "")
    return (f"overlap scheduler on (SGLang's default) on {len(unsaid):,} decode node(s) whose config "
            f"does not say: {shown}",)


def _stated(con: Any, keys: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """The text of the canonical config lines at ``keys`` (file_id, line_no): where v1.1's
    scheduling fields are, for the ingest keeps a record's known fields only (an adapted record's
    ``doc`` has them all)."""
    if not keys:
        return {}
    con.register("config_lines", pa.table({"file_id": pa.array([k[0] for k in keys], pa.int32()),
                                           "line_no": pa.array([k[1] for k in keys], pa.int64())}))
    try:
        texts = source.texts(con, "config_lines")
    finally:
        con.unregister("config_lines")
    return {(f, n): t for f, n, t in zip(*(texts[c].to_pylist() for c in ("file_id", "line_no", "text")),
                                          strict=True)}


def _scheduling(text: str | None) -> dict[str, bool]:
    """v1.1's scheduling fields a config record's JSON ``text`` states (booleans only; a CSV row or
    anything else says nothing, and the engine's defaults apply)."""
    if text is None or not text.lstrip().startswith("{"):
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    return {k: doc[k] for k in V1_1_CONFIG if isinstance(doc, dict) and isinstance(doc.get(k), bool)}


def _order(table: str = "") -> str:
    """SQL: a node's order of records (of ``table``, an alias with its dot, where given)."""
    t = table
    return f"{t}boot, {t}seq NULLS LAST, {t}ts, {t}file_id, {t}line_no, {t}part"


_ORDER = _order()


def _nodes_with_events(con: Any) -> set[str]:
    return {n for (n,) in con.execute(
        "SELECT DISTINCT node FROM records WHERE kind IN ('request', 'transfer')").fetchall()}


#: The received requests' facts, by request id (``node_roles`` registered): what planning needs
#: of each, its first ``received`` (in node order), its largest output logged with a 2xx answer
#: (a failure's says nothing of the steps it ran), whether a prefill or
#: decode node logged it (the first such prefill node), and whether the engine worked on it there
#: (a prefill, a transfer, a decode start or a 2xx answer, not only lines saying it arrived and
#: was refused).
_FACTS = f"""
        WITH ev AS (
          SELECT r.* EXCLUDE (role), coalesce(n.role, 'router') AS node_role
          FROM records r LEFT JOIN node_roles n USING (node)
          WHERE r.kind IN ('request', 'transfer') AND r.request_id IS NOT NULL
        ), received AS (
          SELECT request_id, ts, tenant_id, prompt_tokens, max_new_tokens, prefill_node, decode_node,
                 row_number() OVER (PARTITION BY request_id ORDER BY node, {_ORDER}) AS k
          FROM ev WHERE kind = 'request' AND event = 'received'
        ), facts AS (
          SELECT request_id,
                 max(output_tokens) FILTER (WHERE kind = 'request' AND event = 'finished'
                                            AND status BETWEEN 200 AND 299) AS output,
                 bool_or(node_role = 'prefill') AS on_prefill, bool_or(node_role = 'decode') AS on_decode,
                 min(node) FILTER (WHERE node_role = 'prefill') AS prefill_of,
                 bool_or(node_role IN ('prefill', 'decode') AND (kind = 'transfer'
                         OR event IN ('prefill_started', 'prefill_done', 'decode_started')
                         OR (event = 'finished' AND status BETWEEN 200 AND 299))) AS engine_work,
                 bool_or(node_role = 'decode' AND ((kind = 'transfer' AND event = 'completed')
                         OR event = 'decode_started' OR (event = 'finished' AND status BETWEEN 200 AND 299)))
                   AS decode_work
          FROM ev GROUP BY request_id
        )
        SELECT r.request_id, r.ts, r.tenant_id, r.prompt_tokens, r.max_new_tokens, r.prefill_node, r.decode_node,
               f.output, coalesce(f.on_prefill, FALSE) AS on_prefill, coalesce(f.on_decode, FALSE) AS on_decode,
               f.prefill_of, coalesce(f.engine_work, FALSE) AS engine_work,
               coalesce(f.decode_work, FALSE) AS decode_work
        FROM received r LEFT JOIN facts f USING (request_id) WHERE r.k = 1 ORDER BY r.request_id"""


_FACT_NAMES = ("request_id", "ts", "tenant_id", "prompt_tokens", "max_new_tokens", "prefill_node", "decode_node",
               "output", "on_prefill", "on_decode", "prefill_of", "engine_work", "decode_work")
#: A record's fields as a node's replay reads them (its time in microseconds since the epoch).
def _event_sql(table: str = "") -> str:
    """SQL: a record's event fields (of ``table``, an alias with its dot, where given), its time
    in microseconds."""
    return ", ".join(f"epoch_us({table}ts) AS ts" if f == "ts" else f"{table}{f}" for f in _EVENT_FIELDS)


_EVENT_SQL = _event_sql()
_N_EVENT = len(_EVENT_FIELDS)


#: A request's events on a node that come before its transfer ends there, and after.
_BEFORE_TRANSFER_END = {("request", "received"), ("request", "admitted"), ("request", "prefill_started"),
                        ("request", "prefill_done"), ("transfer", "started")}
_AFTER_TRANSFER_END = {("request", "decode_started"), ("request", "finished")}
#: The sort key of a record without seq (the node's order is then its time's).
_NO_SEQ = 1 << 62


class _Row(NamedTuple):
    """A record of a node's replay stream: the record, whether it is the last of its request in
    the node's logged order, its request's ``replay_plans`` row (None: a request the router never
    logged), and whether the logs show the request served."""

    record: dict[str, Any]
    last: bool
    plan: tuple[Any, ...] | None
    served: bool


def _events_sql(fields: str) -> str:
    """SQL: every node's request and transfer records, ``_i`` numbering each node's in its order."""
    return (f"SELECT {fields}, row_number() OVER (PARTITION BY node ORDER BY {_ORDER}) AS _i FROM records "
            "WHERE kind IN ('request', 'transfer')")


class _ByNode:
    """The rows of a query ordered by node first, handed out a node at a time: one query for
    every node, not one a node (a replay of ten thousand nodes ran 40 ms of queries a node). The
    nodes are asked for in the order the query gives them (Python's and DuckDB's string orders
    agree: code points); a node asked for takes its rows, a node passed over is skipped."""

    def __init__(self, rows: Iterator[tuple[Any, ...]]) -> None:
        self._rows = rows
        self._next = next(rows, None)

    def of(self, node: str) -> Iterator[tuple[Any, ...]]:
        """``node``'s rows, without the node (the rows of nodes before it skipped)."""
        while self._next is not None and self._next[0] < node:
            self._next = next(self._rows, None)
        while self._next is not None and self._next[0] == node:
            row, self._next = self._next, next(self._rows, None)
            yield row[1:]


class _NodeQueries:
    """What the replay reads of each node, for every node in a query each (:class:`_ByNode`):
    its events in its order, the transfer ends other nodes logged for it, and on decode nodes
    the spans and horizons its step clock is fitted to. ``roles``: the engine nodes' roles."""

    def __init__(self, con: duckdb.DuckDBPyConnection, roles: dict[str, str]) -> None:
        con.execute("CREATE OR REPLACE TABLE memory.main.replay_roles (node VARCHAR, role VARCHAR)")
        con.executemany("INSERT INTO memory.main.replay_roles VALUES (?, ?)",
                        sorted((n, r) for n, r in roles.items() if r in ("prefill", "decode")))
        self._cursors: list[duckdb.DuckDBPyConnection] = []
        self.events = self._query(con, _events_query())
        self.carried = self._query(con, _carried_sql())
        self.horizons = self._query(con, _HORIZONS_SQL)
        self.spans = self._query(con, _SPANS_SQL)
        self.resolution = {node: 1_000_000 if whole_ms else 1_000 for node, whole_ms in con.execute(
            "SELECT node, bool_and(epoch_us(ts) % 1000 = 0) FROM records WHERE kind = 'request' "
            "GROUP BY node").fetchall()}

    def _query(self, con: duckdb.DuckDBPyConnection, sql: str) -> _ByNode:
        cur = _reader(con)
        self._cursors.append(cur)
        return _ByNode(_batches(cur, sql))

    def close(self) -> None:
        for cur in self._cursors:
            cur.close()


def _events_query() -> str:
    """SQL: every node's request and transfer records in its order, each with its request's plan,
    whether the logs show it served, whether it is the request's last on the node, and where it
    and its request's delivered finish come in the node's order."""
    return f"""
    WITH ev AS ({_events_sql(_EVENT_SQL)})
    SELECT ev.node AS _node, {', '.join(f'ev.{f}' for f in _EVENT_FIELDS)}, s.request_id IS NOT NULL AS _served,
           ev._i = max(ev._i) OVER (PARTITION BY ev.node, ev.request_id) AS _last, {_PLAN_SQL},
           max(CASE WHEN ev.kind = 'request' AND ev.event = 'finished' AND ev.status BETWEEN 200 AND 299
                    THEN ev._i END) OVER (PARTITION BY ev.node, ev.request_id, ev.boot) AS _finish_i, ev._i
    FROM ev LEFT JOIN memory.main.replay_plans p USING (request_id)
    LEFT JOIN memory.main.replay_served s USING (request_id)
    ORDER BY ev.node, ev._i"""


def _node_events(rows: Iterator[tuple[Any, ...]]) -> Iterator[_Row]:
    """One node's request and transfer records, in its order (its rows of :func:`_events_query`)."""
    for row in rows:
        out = _row(row[:-2])
        # where it and its request's delivered finish come in the node's order
        out.record["_finish_i"], out.record["_i"] = row[-2], row[-1]
        yield out


def _row(row: tuple[Any, ...]) -> _Row:
    """A row of :func:`_node_events` or :func:`_carried_to`: the record's fields, whether the
    request is served, one more (its last, or its place), then its plan."""
    record = dict(zip(_EVENT_FIELDS, row[:_N_EVENT], strict=True))
    record["_ns"] = record["ts"] * 1000
    record["ts"] = ts_text(record["_ns"])
    plan_row = row[_N_EVENT + 2:]
    return _Row(record, bool(row[_N_EVENT + 1]), None if plan_row[-1] is None else plan_row, bool(row[_N_EVENT]))


def _kinds(events: set[tuple[str, str]], prefix: str = "") -> str:
    """SQL: a record is one of ``events`` (kind, event)."""
    return "(" + " OR ".join(f"({prefix}kind = '{k}' AND {prefix}event = '{e}')" for k, e in sorted(events)) + ")"


def _carried_sql() -> str:
    """SQL: for every engine node, the transfer ends it did not log itself but another node did,
    for its side (:func:`_carried_to`), ordered by node and then by the place each may go from."""
    return f"""
        WITH node_ev AS ({_events_sql('request_id, kind, event, node')}),
        mine AS (
          SELECT ev.node, ev.request_id,
                 coalesce(max(ev._i) FILTER (WHERE {_kinds(_BEFORE_TRANSFER_END, 'ev.')}), 0) AS _lo, n.role
          FROM node_ev ev JOIN memory.main.replay_roles n USING (node)
          WHERE ev.request_id IS NOT NULL GROUP BY ev.node, ev.request_id, n.role
        ), logged_ends AS (
          SELECT n.node AS _node, {_event_sql('r.')},
                 r.file_id, r.line_no, r.part, FALSE AS _implied,
                 row_number() OVER (PARTITION BY n.node, r.request_id, r.transfer_id, r.event
                                    ORDER BY r.node, {_order('r.')}) AS k
          FROM records r JOIN memory.main.replay_roles n
            ON (n.role = 'prefill' AND r.src_node = n.node) OR (n.role = 'decode' AND r.dst_node = n.node)
          WHERE r.kind = 'transfer' AND r.event IN ('completed', 'failed')
        ), implied AS (
          SELECT *, row_number() OVER (PARTITION BY request_id ORDER BY node, {_ORDER}) AS k_any,
                 row_number() OVER (PARTITION BY request_id, node ORDER BY {_ORDER}) AS k_here
          FROM (SELECT * REPLACE ('transfer' AS kind, 'completed' AS event, node AS dst_node)
                FROM records r WHERE kind = 'request' AND event = 'decode_started' AND request_id IS NOT NULL
                  AND NOT EXISTS (
                    SELECT 1 FROM records x WHERE x.kind = 'transfer' AND x.event IN ('completed', 'failed')
                      AND x.request_id = r.request_id))
        ), ends AS (
          SELECT * FROM logged_ends
          UNION ALL BY NAME
          SELECT m.node AS _node, {_event_sql('i.')},
                 i.file_id, i.line_no, i.part, TRUE AS _implied,
                 CASE WHEN m.role = 'prefill' THEN i.k_any ELSE i.k_here END AS k
          FROM implied i JOIN mine m ON m.request_id = i.request_id AND (m.role = 'prefill' OR m.node = i.node))
        SELECT e._node, {', '.join(f'e.{f}' for f in _EVENT_FIELDS)}, s.request_id IS NOT NULL AS _served, m._lo,
               e._implied, {_PLAN_SQL}
        FROM ends e JOIN mine m ON m.node = e._node AND m.request_id = e.request_id
        LEFT JOIN memory.main.replay_plans p ON p.request_id = e.request_id
        LEFT JOIN memory.main.replay_served s ON s.request_id = e.request_id
        WHERE e.k = 1 AND NOT EXISTS (
          SELECT 1 FROM records x WHERE x.kind = 'transfer' AND x.node = e._node AND x.event = e.event
            AND x.request_id = e.request_id AND x.transfer_id IS NOT DISTINCT FROM e.transfer_id)
        ORDER BY e._node, m._lo, e.request_id, e.transfer_id, e.event"""


def _carried_to(rows: Iterator[tuple[Any, ...]], node: str) -> Iterator[tuple[int, _Row]]:
    """The transfer ends ``node`` did not log itself but another node did, for its side, each with
    the place in the node's order from which it may go (after the last of its request's records
    that come before a transfer end there), in that order (its rows of :func:`_carried_sql`).

    A transfer's ``completed`` or ``failed`` logged by one node is a fact for both sides (the
    schema's section 3): its prefill node (``src_node``) releases its pages then, its decode node
    (``dst_node``) has them land. Each such end (the first record of it, in node order) comes as
    the record that node would have logged, marked ``_carried`` with the node that did; where it
    goes in the node's order is :func:`_placed`'s. Ends of requests the node holds nothing of
    act on nothing there and are left out.

    A request no node logged a transfer end of, that decode started on, had its transfer end
    before that (decode reads what it carried): its end is *implied* there, for both sides
    (``implied``: the engine acts on it and logs no transfer record, as none was logged; the
    decode node places it just before the ``decode_started``, the prefill node by that time).
    """
    for row in rows:
        r = _row(row[:_N_EVENT + 2] + row[_N_EVENT + 3:])
        record = dict(r.record, node=node, seq=None, _carried=r.record["node"])
        if row[_N_EVENT + 2]:
            record["implied"] = True
        yield row[_N_EVENT + 1], r._replace(record=record, last=False)


def _placed(rows: Iterator[_Row], carried: Iterator[tuple[int, _Row]]) -> Iterator[_Row | str]:
    """A node's ``rows`` (in its order) with each carried transfer end put where causality and
    then time say: after the last of its request's records that come before a transfer end
    (``carried`` gives that place, and comes in that order), before the first of the request's
    records that come after one, and, between the two, before the first record (of any request)
    logged after it. Ends at one place go in the order ``carried`` gives them. Each placed record
    takes the (boot, seq) of the record before it as its sort key. A request's id comes as a
    string once nothing of it is left to come on the node (the replay forgets it then)."""
    upcoming = iter(carried)
    nxt = next(upcoming, None)
    armed: dict[str, list[tuple[int, _Row]]] = defaultdict(list)  # by request, in carried order
    by_time: list[tuple[str, int, str]] = []  # heap of the armed: (ts, n, request)
    done: set[str] = set()  # requests past their last record, waiting for their ends
    n = 0
    prev: dict[str, Any] | None = None

    def arm(at: int) -> None:
        nonlocal nxt, n
        while nxt is not None and nxt[0] <= at:
            rid = nxt[1].record["request_id"]
            armed[rid].append((n, nxt[1]))
            heapq.heappush(by_time, (nxt[1].record["ts"], n, rid))
            n += 1
            nxt = next(upcoming, None)

    def place(due: list[tuple[int, _Row]], before: dict[str, Any] | None) -> Iterator[_Row | str]:
        nonlocal prev
        placed = []
        for _, row in sorted(due, key=lambda d: d[0]):
            ref = prev if prev is not None else before
            boot = ref["boot"] if ref is not None else 0
            key = ref.get("_seq_key", ref["seq"]) if ref is not None else None
            record = dict(row.record, boot=boot, _seq_key=_NO_SEQ if key is None else key)
            yield row._replace(record=record)
            prev = record
            placed.append(record["request_id"])
        for rid in dict.fromkeys(placed):  # (once every end due here is placed)
            if rid in done and not armed.get(rid):
                done.discard(rid)
                yield rid

    def take(rid: str, ns: set[int]) -> list[tuple[int, _Row]]:
        mine = armed.get(rid, [])
        out = [d for d in mine if d[0] in ns]
        left = [d for d in mine if d[0] not in ns]
        if left:
            armed[rid] = left
        else:
            armed.pop(rid, None)
        return out

    i = 0
    for row in rows:
        record = row.record
        rid = record["request_id"]
        if nxt is None and not by_time and not armed:  # (nothing to place: most nodes, most of the time)
            yield row
            prev = record
            i += 1
            if row.last and rid is not None:
                yield rid
            continue
        arm(i)
        due_n: dict[str, set[int]] = defaultdict(set)
        while by_time and by_time[0][0] < record["ts"]:
            _, k, r = heapq.heappop(by_time)
            due_n[r].add(k)
        if rid in armed and (record["kind"], record["event"]) in _AFTER_TRANSFER_END:
            due_n[rid].update(k for k, _ in armed[rid])
        due = [d for r, ks in due_n.items() for d in take(r, ks)]
        if due:
            yield from place(due, record)
        yield row
        prev = record
        i += 1
        arm(i)
        if row.last and rid is not None:
            if armed.get(rid):
                done.add(rid)
            else:
                armed.pop(rid, None)
                yield rid
    arm(1 << 62)
    rest = [d for r in list(armed) for d in take(r, {k for k, _ in armed[r]})]
    yield from place(rest, None)
    for rid in sorted(done):
        yield rid


#: The requests the logs show delivered: a finished with a 2xx status and none of 400 or more.
_DELIVERED = ("SELECT request_id FROM records WHERE kind = 'request' AND event = 'finished' AND status IS NOT NULL "
              "GROUP BY request_id HAVING bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400)")

#: What a node's replay reads of each request with its records: the request as the router logged
#: it (``q_``) and the engine's cross-node decisions for it (``p_``), as :func:`plan` made them.
_PLAN_COLUMNS = (
    ("request_id", pa.string()), ("q_tenant_id", pa.string()), ("q_prompt_tokens", pa.int64()),
    ("q_max_new_tokens", pa.int64()), ("q_prefill_node", pa.string()), ("q_decode_node", pa.string()),
    ("q_output_tokens", pa.int64()),
    ("p_router_rejects", pa.bool_()), ("p_over_long", pa.bool_()), ("p_prefill_rejects", pa.bool_()),
    ("p_kv_tokens", pa.int64()), ("p_limit_tokens", pa.int64()), ("p_context_length", pa.int64()),
)
_PLAN_SCHEMA = pa.schema(list(_PLAN_COLUMNS))
_PLAN_SQL = ", ".join(f"p.{name}" for name, _ in _PLAN_COLUMNS[1:])


def _plan_requests(
    con: duckdb.DuckDBPyConnection,
    configs: dict[str, list[tuple[int, int, str, NodeConfig]]],
    roles: dict[str, str],
    engine: str,
    what_if: WhatIf,
    confirm: bool,
    disagreements: list[Disagreement],
) -> dict[str, tuple[Request, Plan, str]]:
    """Plan every received request (its facts read in batches, its plan written to the scratch
    table ``replay_plans``); return the requests that reach the engine under this replay but have
    no engine event in the logs, with their plans and arrival times. Confirming, these are
    disagreements instead (the model admits a prompt the logs show rejected) and none is returned,
    and where the model would reject a request the logs show on the engine, the logs are followed."""
    last_config = {node: what_if.apply(per[-1][3]) for node, per in configs.items() if per}
    prefill_configs = [c for _, c in sorted(last_config.items()) if c.role == "prefill"]
    fallback = prefill_configs[0] if prefill_configs else next(iter(last_config.values()))
    con.execute(f"CREATE TABLE memory.main.replay_plans ({', '.join(f'{n} {_SQL_TYPE[t]}' for n, t in _PLAN_COLUMNS)})")
    unlogged: dict[str, tuple[Request, Plan, str]] = {}
    admitted: list[str] = []
    cur = _reader(con)
    cur.register("node_roles", pa.table({"node": list(roles), "role": list(roles.values())}))
    rows: list[tuple[Any, ...]] = []
    for values in _batches(cur, _FACTS):
        f = dict(zip(_FACT_NAMES, values, strict=True))
        rid = f["request_id"]
        max_new = f["max_new_tokens"] if f["max_new_tokens"] is not None else (f["output"] or 0)
        request = Request(rid, f["tenant_id"], f["prompt_tokens"], max_new, f["prefill_node"], f["decode_node"],
                          f["output"])
        p = plan(request, engine, last_config.get(f["prefill_node"] or f["prefill_of"] or "", fallback))
        if not p.router_rejects and not (f["on_prefill"] or f["on_decode"]):
            if confirm:
                admitted.append(rid)
            else:
                unlogged[rid] = (request, p, _ts(f["ts"]))
        if confirm:
            p = _followed(f, p, disagreements)
        rows.append((rid, request.tenant_id, request.prompt_tokens, request.max_new_tokens, request.prefill_node,
                     request.decode_node, request.output_tokens, p.router_rejects, p.over_long, p.prefill_rejects,
                     p.kv_tokens, p.limit_tokens, p.context_length))
        if len(rows) >= _BATCH:
            _insert_plans(con, rows)
            rows = []
    _insert_plans(con, rows)
    cur.close()
    disagreements += [Disagreement(rid, "router", "model_admits_rejected",
                                   "the model admits a prompt the logs show rejected, never on the engine")
                      for rid in admitted]
    return unlogged


_SQL_TYPE = {pa.string(): "VARCHAR", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}


def _insert_plans(con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    table = pa.Table.from_pylist([dict(zip(_PLAN_SCHEMA.names, r, strict=True)) for r in rows], schema=_PLAN_SCHEMA)
    scan(con, table, "plan_rows", "INSERT INTO memory.main.replay_plans SELECT * FROM plan_rows")


def _followed(f: dict[str, Any], p: Plan, disagreements: list[Disagreement]) -> Plan:
    """Confirmation: where the model's decision for a request goes against what the logs show (it
    would reject at the router or at prefill a request the logs show on the engine), the logs
    are followed and the disagreement listed. (A prompt past the context that each server's
    tokenizer refused, as SGLang does, is the router's rejection of the model: only work on the
    engine contradicts it.)"""
    rid = f["request_id"]
    if p.router_rejects and (f["on_prefill"] or f["on_decode"]) and f["engine_work"]:
        disagreements.append(Disagreement(rid, "router", "model_rejects_served",
                                          f"the router would reject its prompt (context {p.context_length})"))
        return dataclasses.replace(p, router_rejects=False)
    if p.prefill_rejects and f["on_decode"] and f["decode_work"]:
        disagreements.append(Disagreement(rid, "prefill", "model_rejects_served",
                                          f"prefill would reject its prompt (limit {p.limit_tokens})"))
        return dataclasses.replace(p, prefill_rejects=False)
    return p


def _request_of(rid: str, row: tuple[Any, ...]) -> tuple[Request, Plan]:
    """A ``replay_plans`` row (its columns after the request id) as the request and its plan."""
    tenant, prompt, max_new, prefill, decode, output, router, over_long, prefill_rejects, kv, limit, context = row
    return (Request(rid, tenant, prompt, max_new, prefill, decode, output),
            Plan(router, over_long, prefill_rejects, kv, limit, context))


def _arrival_events(
    unlogged: dict[str, tuple[Request, Plan, str]],
    configs: dict[str, list[tuple[int, int, str, NodeConfig]]],
) -> tuple[dict[str, list[dict[str, Any]]], int]:
    """Engine events, timed by the simulator's cost model from each request's arrival, for
    requests the logs show no engine event for: they join each node's logged order by time."""
    roles: dict[str, list[str]] = defaultdict(list)
    for node, per in sorted(configs.items()):
        if per:
            roles[per[-1][3].role].append(node)
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    placed = 0
    for i, (rid, (r, p, arrival)) in enumerate(unlogged.items()):
        prefill = r.prefill_node if r.prefill_node in roles["prefill"] else None
        decode = r.decode_node if r.decode_node in roles["decode"] else None
        prefill = prefill or (roles["prefill"][i % len(roles["prefill"])] if roles["prefill"] else None)
        decode = decode or (roles["decode"][i % len(roles["decode"])] if roles["decode"] else None)
        if prefill is None or decode is None:
            continue
        placed += 1
        t0 = _ns(arrival)
        t1 = t0 + PREFILL_FIXED + PREFILL_PER_TOKEN * p.kv_tokens
        t2 = t1 + TRANSFER_FIXED + TRANSFER_PER_TOKEN * p.kv_tokens
        t3 = t2 + DECODE_PER_TOKEN * r.max_new_tokens

        def ev(node: str, t: int, name: str, kind: str = "request", rid: str = rid, **extra: Any) -> None:
            out[node].append({"kind": kind, "ts": ts_text(t), "node": node, "boot": 0, "seq": None,
                              "request_id": rid, "event": name, **extra})

        transfer: dict[str, Any] = {"transfer_id": f"xfer-{rid}", "src_node": prefill, "dst_node": decode,
                    "tokens": p.kv_tokens}
        if p.prefill_rejects:
            ev(prefill, t0, "rejected")
            continue
        ev(decode, t0, "admitted")
        ev(prefill, t0, "prefill_started")
        ev(prefill, t1, "prefill_done")
        ev(prefill, t1, "started", "transfer", **transfer)
        ev(prefill, t2, "completed", "transfer", **transfer)
        ev(decode, t2, "completed", "transfer", **transfer)
        ev(decode, t2, "decode_started")
        ev(decode, t3, "finished", status=200, finish_reason="stop", output_tokens=r.max_new_tokens)
    for records in out.values():
        records.sort(key=lambda e: e["ts"])  # stable: a request's own events keep their order
    return out, len(unlogged) - placed


def _ns(text: str) -> int:
    return ts_ns(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))


def _replay_node(
    queries: _NodeQueries,
    node: str,
    configs: list[tuple[int, int, str, NodeConfig]],
    role: str | None,
    engine: str,
    what_if: WhatIf,
    log: LogSet,
    unlogged: dict[str, tuple[Request, Plan, str]],
    extra: list[dict[str, Any]],
    confirm: bool,
    disagreements: list[Disagreement],
    schedule: Schedule = LOGGED,
    clocks_used: list[StepClock] | None = None,
) -> None:
    """Feed one node's configs and events, merged in (boot, seq) order, to a node engine;
    ``extra`` events (of requests the logs have no engine event for) join by time. A request is
    known to the engine from its first record on the node to its last (its plan read with its
    records), the unlogged ones throughout."""
    requests = {rid: r for rid, (r, _, _) in unlogged.items()}
    plans = {rid: p for rid, (_, p, _) in unlogged.items()}
    served: set[str] | None = set() if confirm else None
    stream: Iterator[_Row | str] = _placed(_node_events(queries.events.of(node)),
                                           _carried_to(queries.carried.of(node), node))
    engines: list[NodeEngine] = []

    def admit(row: _Row) -> dict[str, Any]:
        rid = row.record["request_id"]
        if rid is not None and rid not in plans and row.plan is not None:
            requests[rid], plans[rid] = _request_of(rid, row.plan)
            if served is not None and row.served:
                served.add(rid)
        return _logged(row.record)

    deferred: list[str] = []  # decode: requests past their last record but still in the running batch

    def forget(rid: str, now: bool = False) -> None:
        if rid in unlogged:
            return
        if not now and role == "decode" and node_engine is not None and rid in node_engine.batch:
            deferred.append(rid)  # it decodes on, its steps placed by time, until its boot ends
            return
        requests.pop(rid, None)
        plans.pop(rid, None)
        if served is not None:
            served.discard(rid)
        for e in engines:
            e.forget(rid)

    if not configs:  # a router (or any node without a config): its events pass through
        router = NodeEngine(NodeConfig(node, "router", 1 << 62, 1, 2), engine, log, requests, plans)
        engines.append(router)
        for item in stream:
            if isinstance(item, str):
                forget(item)
            elif not (item.record["request_id"] in unlogged and item.record["event"] != "received"):
                router.handle(admit(item))  # (else the logged router rejection no longer applies)
        return
    pending = list(reversed(extra))
    steps = sorted((boot, seq, i) for i, (boot, seq, _, _) in enumerate(configs))
    k = 0
    node_engine: NodeEngine | None = None
    applied = {boot: what_if.apply(c) for boot, _, _, c in configs}
    cadences = _cadences(queries.spans.of(node), queries.resolution.get(node, 1_000), applied) \
        if role == "decode" else {}
    clocks: dict[int, StepClock] = {}
    horizons = _horizons(queries.horizons.of(node), applied) if role == "decode" else {}

    def feed(record: dict[str, Any], ts: int | None, finish_at: int | None = None, at: int | None = None) -> None:
        """Hand ``record`` to the node's engine; on a decode node, first the steps that ran before it
        (none where its time, ``ts``, is not the node's own: None); ``at`` and ``finish_at``: where
        it, and its request's delivered finish, come in the node's order (where they do)."""
        assert node_engine is not None
        if role != "decode" or ts is None:
            node_engine.handle(record)
            return
        e = node_engine
        clock = clock_of(e.boot)
        rid = record.get("request_id")
        h = e.held.get(rid) if rid is not None else None
        # a finish with its outputs pins the steps before it (a failure's does not)
        ends = record["kind"] == "request" and record["event"] == "finished" and _ok(record.get("status"))
        finishing = (rid, h.allocs) if ends and h is not None and h.allocs and rid in e.batch else None
        first = clock.steps
        starting = record["kind"] == "request" and record["event"] == "decode_started"
        joining = None
        if starting and rid in requests and finish_at is not None:
            joining = (decode_steps(requests[rid].outputs, e.config.overlap_schedule), finish_at)
        run, fits = clock.before(ts, [x.allocs_left for _, x in e.decoding()], finishing, starting, joining, at)
        if not fits and finishing is not None and served is not None and rid in served:
            disagreements.append(Disagreement(rid, node, "steps_differ", f"its {finishing[1]} decode steps fit no "
                                              "lockstep schedule of the node's logged order"))

        def when(k: int) -> str:
            at = clock.time_of(first + k)
            return record["ts"] if at is None or at > ts else ts_text(at)

        e.advance(run, when)
        e.handle(record)
        if rid is None:
            return
        if finishing is not None:
            clock.finished(rid, ts, finishing[1])
        elif starting and rid in e.batch:
            clock.started(rid, ts, joining, at)
        elif rid not in e.batch:
            clock.forget(rid)

    def clock_of(boot: int) -> StepClock:
        clock = clocks.get(boot)
        if clock is None:
            clock = clocks[boot] = StepClock(cadences.get(boot), schedule, node, horizon=horizons.pop(boot, None))
            if clocks_used is not None:
                clocks_used.append(clock)
        return clock

    def end_boot(ts: int) -> None:
        """The node's process ends before ``ts`` (its next boot's first record): the steps its
        running requests took until then, at its pace, ran first."""
        if role != "decode" or node_engine is None or node_engine.boot not in clocks:
            return
        e, clock = node_engine, clocks[node_engine.boot]
        first = clock.steps
        run, _ = clock.before(ts, [x.allocs_left for _, x in e.decoding()], None)

        def when(k: int) -> str:
            at = clock.time_of(first + k)
            return ts_text(ts if at is None or at > ts else at)

        e.advance(run, when)
        for rid in deferred:
            forget(rid, now=True)
        deferred.clear()

    def configure(boot: int, i: int) -> None:
        nonlocal node_engine
        config = what_if.apply(configs[i][3])
        if node_engine is None or boot != node_engine.boot:
            if node_engine is not None:
                end_boot(_ns(configs[i][2]))
            log.new_boot(node)
            if node_engine is None:
                node_engine = NodeEngine(config, engine, log, requests, plans, boot=boot, served=served,
                                         disagreements=disagreements)
                engines.append(node_engine)
            else:
                node_engine.start_boot(boot, config)
        else:
            node_engine.config = config
        log.emit(config.record(configs[i][2], boot))

    for item in stream:
        if isinstance(item, str):
            forget(item)
            continue
        event = item.record
        key = (event["boot"], event.get("_seq_key", event["seq"] if event["seq"] is not None else _NO_SEQ))
        while k < len(steps) and steps[k][:2] <= key:
            configure(steps[k][0], steps[k][2])
            k += 1
        record = admit(item)
        if node_engine is None:  # events before any config: no pool to act on
            log.emit(record)
            continue
        if event["boot"] != node_engine.boot:
            end_boot(event["_ns"])
            log.new_boot(node)
            node_engine.start_boot(event["boot"], node_engine.config)
        while pending and pending[-1]["ts"] < event["ts"]:
            unlogged_event = pending.pop()
            feed(dict(unlogged_event, boot=node_engine.boot), _ns(unlogged_event["ts"]))
        # (a transfer end another node logged is timed by that node's clock: it places no step)
        feed(record, None if "_carried" in event else event["_ns"], event.get("_finish_i"), event.get("_i"))
    while k < len(steps):
        configure(steps[k][0], steps[k][2])
        k += 1
    while pending and node_engine is not None:
        unlogged_event = pending.pop()
        feed(dict(unlogged_event, boot=node_engine.boot), _ns(unlogged_event["ts"]))
    for rid in deferred:  # (the node's log ends: what it ran after its last record is in no log)
        forget(rid, now=True)


_HORIZONS_SQL = f"""
    WITH ev AS ({_events_sql("kind, event, status, request_id, boot, node")})
    SELECT ev.node, ev.boot, min(ev._i) FILTER (WHERE ev.kind = 'request' AND ev.event = 'decode_started') AS s,
           max(ev._i) FILTER (WHERE ev.kind = 'request' AND ev.event = 'finished'
                              AND ev.status BETWEEN 200 AND 299) AS f,
           any_value(coalesce(p.q_output_tokens, p.q_max_new_tokens)) AS n
    FROM ev JOIN memory.main.replay_roles r USING (node) LEFT JOIN memory.main.replay_plans p USING (request_id)
    WHERE ev.request_id IS NOT NULL AND r.role = 'decode'
    GROUP BY ev.node, ev.boot, ev.request_id HAVING s < f AND n IS NOT NULL
    ORDER BY ev.node, ev.boot, s"""


def _horizons(rows: Iterator[tuple[Any, ...]], configs: dict[int, NodeConfig]) -> dict[int, Horizon]:
    """Each boot's decode starts with a delivered finish after them on the node (where each comes
    in the node's order, and the steps its request takes; its rows of ``_HORIZONS_SQL``):
    :class:`replay.schedule.Horizon`."""
    starts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for boot, start, finish, outputs in rows:
        config = configs.get(boot)
        overlap = config.overlap_schedule if config is not None else True
        starts[boot].append((start, finish, decode_steps(outputs, overlap)))
    return {boot: Horizon(s) for boot, s in starts.items()}


def _ok(status: Any) -> bool:
    return isinstance(status, int) and 200 <= status <= 299


_SPANS_SQL = """
    SELECT r.node, boot, min(epoch_us(ts)) FILTER (WHERE event = 'decode_started') AS s,
           max(epoch_us(ts)) FILTER (WHERE event = 'finished') AS f,
           max(output_tokens) FILTER (WHERE event = 'finished' AND status BETWEEN 200 AND 299) AS n
    FROM records r JOIN memory.main.replay_roles nr USING (node)
    WHERE kind = 'request' AND request_id IS NOT NULL AND nr.role = 'decode'
    GROUP BY r.node, boot, request_id HAVING s IS NOT NULL AND f IS NOT NULL AND n IS NOT NULL
    ORDER BY r.node, boot, request_id"""


def _cadences(rows: Iterator[tuple[Any, ...]], resolution: int, configs: dict[int, NodeConfig]
              ) -> dict[int, Cadence]:
    """Each boot's decode cadence (:class:`replay.schedule.Cadence`), fitted to the spans of the
    requests that started and finished decoding there with their output logged (the node's rows
    of ``_SPANS_SQL``), its times' ``resolution`` in ns (whole milliseconds where every one of
    the node's request times is)."""
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for boot, start, end, outputs in rows:
        config = configs.get(boot)
        overlap = config.overlap_schedule if config is not None else True
        spans[boot].append((decode_steps(outputs, overlap), (end - start) * 1000))
    fitted = {boot: Cadence.fit(pairs, resolution) for boot, pairs in spans.items()}
    return {boot: c for boot, c in fitted.items() if c is not None}


def _logged(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the engine is handed it: the replay's own marks left out (a copy)."""
    return {k: v for k, v in record.items() if k[0] != "_"}


def _ts(value: Any) -> str:
    """A case timestamp (aware datetime, microseconds) as the log text the engine writes."""
    return ts_text(ts_ns(value))


# -- agreement --------------------------------------------------------------------------------


@contextmanager
def _beside(logged: Path, replayed: Path) -> Iterator[Any]:
    """A read-only connection to the replay case with the logged case attached as ``logged``."""
    con = connect(replayed, read_only=True, create=False)
    try:
        con.execute(f"ATTACH '{_sql_path(logged)}' AS logged (READ_ONLY)")
        yield con
    finally:
        con.close()


def _agreement(logged: Path, replayed: Path) -> Agreement:
    """Allocations reproduced page for page, and exposed responses in both, or one, case."""
    with _beside(logged, replayed) as con:
        alloc = one(con, """
            WITH norm AS (
              SELECT src, node, boot, request_id, seq,
                     list_sort(list_transform(page_ranges, lambda r: [r.lo, r.hi])) AS pages
              FROM (SELECT 'log' AS src, * FROM logged.records WHERE kind = 'kv' AND op = 'alloc'
                    UNION ALL BY NAME
                    SELECT 'replay' AS src, * FROM records WHERE kind = 'kv' AND op = 'alloc')
            ), numbered AS (
              SELECT *, row_number() OVER (PARTITION BY src, node, boot, request_id ORDER BY seq) AS k
              FROM norm
            )
            SELECT count(*) FILTER (WHERE l.src IS NOT NULL),
                   count(*) FILTER (WHERE l.src IS NOT NULL AND l.pages = r.pages)
            FROM (SELECT * FROM numbered WHERE src = 'log') l
            FULL JOIN (SELECT * FROM numbered WHERE src = 'replay') r
              USING (node, boot, request_id, k)""")
        pairs = con.execute("""
            SELECT reader_request, victim_request, 'log' FROM logged.exposures WHERE reader_delivered
            UNION ALL
            SELECT reader_request, victim_request, 'replay' FROM exposures WHERE reader_delivered
        """).fetchall()
    logged_allocs, same = alloc or (0, 0)
    log_pairs = {(r, v) for r, v, src in pairs if src == "log"}
    rep_pairs = {(r, v) for r, v, src in pairs if src == "replay"}
    return Agreement(logged_allocs, same, Overlap.of({r for r, _ in log_pairs}, {r for r, _ in rep_pairs}),
                     Overlap.of(log_pairs, rep_pairs))


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")
