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
import json
import shutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import forensics
from forensics.errors import CaseError, OutputExists
from forensics.store import connect, one
from replay.engine import BEHAVIOURS, NodeConfig, NodeEngine, Plan, Request, plan
from replay.logset import LogSet, ts_ns, ts_text
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

    def as_dict(self) -> dict[str, Any]:
        """The replay as JSON-ready data."""
        return {
            "engine": self.engine,
            "what_if": {k: v for k, v in dataclasses.asdict(self.what_if).items() if v is not None},
            "out": str(self.out),
            "records": self.records,
            "exposure": self.exposure,
            "not_replayed": self.not_replayed,
            "agreement": None if self.agreement is None else self.agreement.as_dict(),
        }


def replay(db: Path | str, engine: str, out: Path | str, *, what_if: WhatIf = WhatIf()) -> ReplayResult:
    """Replay the case ``db`` under ``engine`` into the folder ``out`` (replaced)."""
    if engine not in BEHAVIOURS:
        raise CaseError(f"unknown engine {engine!r}; one of: {', '.join(BEHAVIOURS)}")
    out = Path(out)
    con = connect(db, read_only=True, create=False)
    try:
        configs = _configs(con)
        events = _events(con)
        has_pages = (one(con, "SELECT count(*) FROM records WHERE kind = 'kv'") or (0,))[0] > 0
    finally:
        con.close()
    if not any(c.role in ("prefill", "decode") for per_node in configs.values() for _, _, _, c in per_node):
        raise CaseError(f"{db}: no prefill or decode config records, nothing to replay")

    requests, plans, arrivals, unlogged = _plan_requests(configs, events, engine, what_if)
    extra, not_replayed = _arrival_events(unlogged, requests, plans, arrivals, configs)
    log = LogSet()
    for node in sorted(set(configs) | set(events)):
        _replay_node(node, configs.get(node, []), events.get(node, []), engine, what_if, log,
                     requests, plans, extra.get(node, []), set(unlogged))

    if out.exists():
        if not out.is_dir() or not {p.name for p in out.iterdir()} <= _REPLAY_FILES:
            raise OutputExists(f"{out}: exists and is not an earlier replay's folder; choose another --out")
        shutil.rmtree(out)
    logs = out / "logs"
    log.write(logs)
    case = out / "replay.duckdb"
    result = forensics.investigate([logs], case)
    agreement = _agreement(Path(db), case) if has_pages else None
    done = ReplayResult(engine, what_if, out, log.records, result.exposure, not_replayed, agreement)
    _remember(Path(db), done)
    return done


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
    con = connect(db)
    try:
        con.execute(
            "INSERT OR REPLACE INTO replays VALUES (?, ?, ?, ?, ?, ?, ?)",
            [result.engine, json.dumps(d["what_if"], sort_keys=True), str(result.out), result.records,
             result.not_replayed, json.dumps(result.exposure),
             None if result.agreement is None else json.dumps(result.agreement.as_dict())],
        )
    finally:
        con.close()


# -- reading the case -------------------------------------------------------------------------


def _configs(con: Any) -> dict[str, list[tuple[int, int, str, NodeConfig]]]:
    rows = con.execute(
        f"SELECT {', '.join(_CONFIG_FIELDS)} FROM records WHERE kind = 'config' "
        "ORDER BY node, boot, seq NULLS FIRST, ts"
    ).fetchall()
    out: dict[str, list[tuple[int, int, str, NodeConfig]]] = defaultdict(list)
    for node, boot, seq, ts, role, eng, version, model, ctx, page_size, pool in rows:
        out[node].append((boot, -1 if seq is None else seq, _ts(ts),
                          NodeConfig(node, role, ctx, page_size, pool, eng, version, model)))
    return out


def _events(con: Any) -> dict[str, list[dict[str, Any]]]:
    rel = con.sql(
        f"SELECT {', '.join(_EVENT_FIELDS)} FROM records WHERE kind IN ('request', 'transfer') "
        "ORDER BY node, boot, seq NULLS LAST, ts, file_id, line_no, part"
    )
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rel.fetchall():
        record = dict(zip(_EVENT_FIELDS, row, strict=True))
        record["ts"] = _ts(record["ts"])
        out[record["node"]].append(record)
    return out


def _plan_requests(
    configs: dict[str, list[tuple[int, int, str, NodeConfig]]],
    events: dict[str, list[dict[str, Any]]],
    engine: str,
    what_if: WhatIf,
) -> tuple[dict[str, Request], dict[str, Plan], dict[str, str], list[str]]:
    """The requests as the router logged them, the engine's cross-node decisions, and the
    requests that reach the engine under this replay but have no engine event in the logs."""
    last_config = {node: what_if.apply(per[-1][3]) for node, per in configs.items() if per}
    prefill_configs = [c for _, c in sorted(last_config.items()) if c.role == "prefill"]
    fallback = prefill_configs[0] if prefill_configs else next(iter(last_config.values()))
    received: dict[str, dict[str, Any]] = {}
    output: dict[str, int] = {}
    engine_nodes: dict[str, set[str]] = defaultdict(set)
    prefill_of: dict[str, str] = {}
    for node, records in events.items():
        role = last_config[node].role if node in last_config else "router"
        for r in records:
            rid = r["request_id"]
            if r["kind"] == "request" and r["event"] == "received":
                received.setdefault(rid, r)
            if r["kind"] == "request" and r["event"] == "finished" and r["output_tokens"] is not None:
                output[rid] = max(output.get(rid, 0), r["output_tokens"])
            if role in ("prefill", "decode"):
                engine_nodes[rid].add(node)
                if role == "prefill":
                    prefill_of.setdefault(rid, node)
    requests: dict[str, Request] = {}
    plans: dict[str, Plan] = {}
    arrivals: dict[str, str] = {}
    for rid, r in sorted(received.items()):
        max_new = r["max_new_tokens"] if r["max_new_tokens"] is not None else output.get(rid, 0)
        request = Request(rid, r["tenant_id"], r["prompt_tokens"], max_new,
                          r["prefill_node"], r["decode_node"])
        prefill_node = r["prefill_node"] or prefill_of.get(rid)
        prefill = last_config.get(prefill_node or "", fallback)
        requests[rid] = request
        plans[rid] = plan(request, engine, prefill)
        arrivals[rid] = r["ts"]
    unlogged = [rid for rid, p in plans.items() if not p.router_rejects and not engine_nodes[rid]]
    return requests, plans, arrivals, unlogged


def _arrival_events(
    unlogged: list[str],
    requests: dict[str, Request],
    plans: dict[str, Plan],
    arrivals: dict[str, str],
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
    for i, rid in enumerate(unlogged):
        r, p = requests[rid], plans[rid]
        prefill = r.prefill_node if r.prefill_node in roles["prefill"] else None
        decode = r.decode_node if r.decode_node in roles["decode"] else None
        prefill = prefill or (roles["prefill"][i % len(roles["prefill"])] if roles["prefill"] else None)
        decode = decode or (roles["decode"][i % len(roles["decode"])] if roles["decode"] else None)
        if prefill is None or decode is None:
            continue
        placed += 1
        t0 = _ns(arrivals[rid])
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
    node: str,
    configs: list[tuple[int, int, str, NodeConfig]],
    events: list[dict[str, Any]],
    engine: str,
    what_if: WhatIf,
    log: LogSet,
    requests: dict[str, Request],
    plans: dict[str, Plan],
    extra: list[dict[str, Any]],
    unlogged: set[str],
) -> None:
    """Feed one node's configs and events, merged in (boot, seq) order, to a node engine;
    ``extra`` events (of requests the logs have no engine event for) join by time."""
    if not configs:  # a router (or any node without a config): its events pass through
        router = NodeEngine(NodeConfig(node, "router", 1 << 62, 1, 2), engine, log, requests, plans)
        for record in events:
            if record["request_id"] in unlogged and record["event"] != "received":
                continue  # the logged router rejection no longer applies
            router.handle(dict(record))
        return
    pending = list(reversed(extra))
    timeline = sorted(
        [(boot, seq, 0, i) for i, (boot, seq, _, _) in enumerate(configs)]
        + [(e["boot"], e["seq"] if e["seq"] is not None else 1 << 62, 1, i) for i, e in enumerate(events)]
    )
    node_engine: NodeEngine | None = None
    for boot, _, what, i in timeline:
        if what == 0:
            config = what_if.apply(configs[i][3])
            if node_engine is None or boot != node_engine.boot:
                log.new_boot(node)
                if node_engine is None:
                    node_engine = NodeEngine(config, engine, log, requests, plans, boot=boot)
                else:
                    node_engine.start_boot(boot, config)
            else:
                node_engine.config = config
            log.emit(config.record(configs[i][2], boot))
            continue
        if node_engine is None:  # events before any config: no pool to act on
            log.emit(dict(events[i]))
            continue
        if events[i]["boot"] != node_engine.boot:
            log.new_boot(node)
            node_engine.start_boot(events[i]["boot"], node_engine.config)
        while pending and pending[-1]["ts"] < events[i]["ts"]:
            node_engine.handle(dict(pending.pop(), boot=node_engine.boot))
        node_engine.handle(dict(events[i]))
    while pending and node_engine is not None:
        node_engine.handle(dict(pending.pop(), boot=node_engine.boot))


def _ts(value: Any) -> str:
    """A case timestamp (aware datetime, microseconds) as the log text the engine writes."""
    return ts_text(ts_ns(value))


# -- agreement --------------------------------------------------------------------------------


def _agreement(logged: Path, replayed: Path) -> Agreement:
    """Allocations reproduced page for page, and exposed responses in both, or one, case."""
    con = connect(replayed, read_only=True, create=False)
    try:
        con.execute(f"ATTACH '{_sql_path(logged)}' AS logged (READ_ONLY)")
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
    finally:
        con.close()
    logged_allocs, same = alloc or (0, 0)
    log_pairs = {(r, v) for r, v, src in pairs if src == "log"}
    rep_pairs = {(r, v) for r, v, src in pairs if src == "replay"}
    return Agreement(logged_allocs, same, Overlap.of({r for r, _ in log_pairs}, {r for r, _ in rep_pairs}),
                     Overlap.of(log_pairs, rep_pairs))


def _sql_path(path: Path) -> str:
    return str(path).replace("'", "''")
