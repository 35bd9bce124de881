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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

import forensics
from forensics.adapters.sglang_eras import releases_of
from forensics.errors import CaseError, OutputExists
from forensics.store import connect, one
from replay.engine import BEHAVIOURS, Disagreement, NodeConfig, NodeEngine, Plan, Request, plan
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
    #: "confirm" (the engine the logs were made with, as configured: the logs are followed where
    #: the model disagrees) or "what-if" (another engine or configuration: the model decides)
    mode: str = "confirm"
    disagreements: tuple[Disagreement, ...] = ()  # confirm: where the model could not follow the logs
    outcomes_changed: int = 0  # requests delivered in the logs and not in the replay, or the reverse

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
            "disagreements": {"count": len(self.disagreements), "by_kind": dict(sorted(kinds.items())),
                              "list": [d.as_dict() for d in self.disagreements]},
        }


def replay(db: Path | str, engine: str, out: Path | str, *, what_if: WhatIf = WhatIf()) -> ReplayResult:
    """Replay the case ``db`` under ``engine`` into the folder ``out`` (replaced)."""
    if engine not in BEHAVIOURS:
        raise CaseError(f"unknown engine {engine!r}; one of: {', '.join(BEHAVIOURS)}")
    out = Path(out)
    con = connect(db, read_only=True, create=False)
    try:
        configs = _configs(con)
        has_pages = (one(con, "SELECT count(*) FROM records WHERE kind = 'kv'") or (0,))[0] > 0
        if not any(c.role in ("prefill", "decode") for per_node in configs.values() for _, _, _, c in per_node):
            raise CaseError(f"{db}: no prefill or decode config records, nothing to replay")
        roles = {node: per[-1][3].role for node, per in configs.items() if per}
        con.register("node_roles", pa.table({"node": list(roles), "role": list(roles.values())}))
        facts = _request_facts(con)
        requests, plans, arrivals, unlogged = _plan_requests(configs, facts, engine, what_if)
        confirming = what_if == WhatIf() and engine == (logged_engine(configs) or "sglang-placeholder")
        mode = "confirm" if confirming else "what-if"
        disagreements: list[Disagreement] = []
        served: frozenset[str] | None = None
        if mode == "confirm":
            served = _delivered(con)
            plans, unlogged = _follow_logs(facts, plans, unlogged, disagreements)
        del facts
        extra, not_replayed = _arrival_events(unlogged, requests, plans, arrivals, configs)
        _make_room(out)
        logs = out / "logs"
        log = LogSet()
        # node by node: only one node's records are held at a time, and its replayed records are
        # written as soon as it is done
        for node in sorted(set(configs) | _nodes_with_events(con)):
            events = _node_events(con, node)
            carried = _carried_to(con, node, roles.get(node))
            if carried:
                events = _placed(events, carried)
            _replay_node(node, configs.get(node, []), events, engine, what_if, log,
                         requests, plans, extra.get(node, []), set(unlogged), served, disagreements)
            log.flush(node, logs)
        logs.mkdir(parents=True, exist_ok=True)
    finally:
        con.close()
    case = out / "replay.duckdb"
    result = forensics.investigate([logs], case)
    agreement = _agreement(Path(db), case) if has_pages else None
    changed = _outcomes_changed(Path(db), case)
    if mode == "confirm":  # following the logs, the replay should answer as they do: say where not
        disagreements += [Disagreement(rid, "replay", "model_outcome_differs",
                                       "delivered in the logs, not in the replay" if delivered
                                       else "delivered in the replay, not in the logs")
                          for rid, delivered in changed]
    done = ReplayResult(engine, what_if, out, log.records, result.exposure, not_replayed, agreement, mode,
                        tuple(disagreements), len(changed))
    _remember(Path(db), done)
    return done


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


def _delivered(con: Any) -> frozenset[str]:
    """The requests the logs show delivered: a finished with a 2xx status and none of 400 or more."""
    return frozenset(rid for (rid,) in con.execute(
        "SELECT request_id FROM records WHERE kind = 'request' AND event = 'finished' AND status IS NOT NULL "
        "GROUP BY request_id HAVING bool_or(status BETWEEN 200 AND 299) AND NOT bool_or(status >= 400)").fetchall())


def _follow_logs(
    facts: list[RequestFacts], plans: dict[str, Plan], unlogged: list[str], disagreements: list[Disagreement],
) -> tuple[dict[str, Plan], list[str]]:
    """Confirmation: where the model's decision for a request goes against what the logs show
    (it would reject at the router or at prefill a request the logs show on the engine; it would
    admit one the logs show rejected and never on the engine), the logs are followed and the
    disagreement listed."""
    # (a prompt past the context that each server's tokenizer refused, as SGLang does, is the
    # router's rejection of the model: only work on the engine contradicts it)
    on_engine = {f.request_id for f in facts if (f.on_prefill or f.on_decode) and f.engine_work}
    on_decode = {f.request_id for f in facts if f.on_decode and f.decode_work}
    out = dict(plans)
    for rid, p in plans.items():
        if p.router_rejects and rid in on_engine:
            disagreements.append(Disagreement(rid, "router", "model_rejects_served",
                                              f"the router would reject its prompt (context {p.context_length})"))
            out[rid] = dataclasses.replace(p, router_rejects=False)
        elif p.prefill_rejects and rid in on_decode:
            disagreements.append(Disagreement(rid, "prefill", "model_rejects_served",
                                              f"prefill would reject its prompt (limit {p.limit_tokens})"))
            out[rid] = dataclasses.replace(p, prefill_rejects=False)
    for rid in unlogged:
        disagreements.append(Disagreement(rid, "router", "model_admits_rejected",
                                          "the model admits a prompt the logs show rejected, never on the engine"))
    return out, []


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
            "outcomes_changed, disagreements) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [result.engine, what_if, str(result.out), result.records,
             result.not_replayed, json.dumps(result.exposure),
             None if result.agreement is None else json.dumps(result.agreement.as_dict()), result.mode,
             result.outcomes_changed, len(result.disagreements)],
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
        f"SELECT {', '.join(_CONFIG_FIELDS)} FROM records WHERE kind = 'config' "
        "ORDER BY node, boot, seq NULLS FIRST, ts"
    ).fetchall()
    out: dict[str, list[tuple[int, int, str, NodeConfig]]] = defaultdict(list)
    for node, boot, seq, ts, role, eng, version, model, ctx, page_size, pool in rows:
        out[node].append((boot, -1 if seq is None else seq, _ts(ts),
                          NodeConfig(node, role, ctx, page_size, pool, eng, version, model)))
    return out


_ORDER = "boot, seq NULLS LAST, ts, file_id, line_no, part"


def _nodes_with_events(con: Any) -> set[str]:
    return {n for (n,) in con.execute(
        "SELECT DISTINCT node FROM records WHERE kind IN ('request', 'transfer')").fetchall()}


def _node_events(con: Any, node: str) -> list[dict[str, Any]]:
    """One node's request and transfer records, in its order."""
    rows = con.execute(
        f"SELECT {', '.join(_EVENT_FIELDS)} FROM records WHERE kind IN ('request', 'transfer') AND node = ? "
        f"ORDER BY {_ORDER}", [node]).fetchall()
    out = []
    for row in rows:
        record = dict(zip(_EVENT_FIELDS, row, strict=True))
        record["ts"] = _ts(record["ts"])
        out.append(record)
    return out


@dataclass(frozen=True)
class RequestFacts:
    """What planning needs of one request: its first ``received`` (in node order), its largest
    logged output, and whether a prefill or decode node logged it (the first such prefill node)."""

    request_id: str
    ts: str
    tenant_id: str
    prompt_tokens: int
    max_new_tokens: int | None
    prefill_node: str | None
    decode_node: str | None
    output: int | None
    on_prefill: bool
    on_decode: bool
    prefill_of: str | None
    #: the engine worked on it: a prefill, a transfer, a decode start or a 2xx answer on an
    #: engine node (not only lines saying it arrived and was refused)
    engine_work: bool = True
    decode_work: bool = True  # the same on a decode node


def _request_facts(con: Any) -> list[RequestFacts]:
    """:class:`RequestFacts` of every received request, by request id (``node_roles`` registered)."""
    rows = con.execute(f"""
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
                 max(output_tokens) FILTER (WHERE kind = 'request' AND event = 'finished') AS output,
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
               f.output, coalesce(f.on_prefill, FALSE), coalesce(f.on_decode, FALSE), f.prefill_of,
               coalesce(f.engine_work, FALSE), coalesce(f.decode_work, FALSE)
        FROM received r LEFT JOIN facts f USING (request_id) WHERE r.k = 1 ORDER BY r.request_id""").fetchall()
    return [RequestFacts(rid, _ts(ts), *rest) for rid, ts, *rest in rows]


#: A request's events on a node that come before its transfer ends there, and after.
_BEFORE_TRANSFER_END = {("request", "received"), ("request", "admitted"), ("request", "prefill_started"),
                        ("request", "prefill_done"), ("transfer", "started")}
_AFTER_TRANSFER_END = {("request", "decode_started"), ("request", "finished")}
#: The sort key of a record without seq (the node's order is then its time's).
_NO_SEQ = 1 << 62


def _carried_to(con: Any, node: str, role: str | None) -> list[dict[str, Any]]:
    """The transfer ends ``node`` did not log itself but another node did, for its side.

    A transfer's ``completed`` or ``failed`` logged by one node is a fact for both sides (the
    schema's section 3): its prefill node (``src_node``) releases its pages then, its decode node
    (``dst_node``) has them land. Each such end (the first record of it, in node order) comes as
    the record that node would have logged, marked ``_carried`` with the node that did; where it
    goes in the node's order is :func:`_placed`'s.
    """
    side = {"prefill": "src_node", "decode": "dst_node"}.get(role or "")
    if side is None:
        return []
    rows = con.execute(f"""
        WITH ends AS (
          SELECT *, row_number() OVER (PARTITION BY request_id, transfer_id, event ORDER BY node, {_ORDER}) AS k
          FROM records WHERE kind = 'transfer' AND event IN ('completed', 'failed') AND {side} = $node)
        SELECT {', '.join(_EVENT_FIELDS)} FROM ends e
        WHERE k = 1 AND NOT EXISTS (
          SELECT 1 FROM records x WHERE x.kind = 'transfer' AND x.node = $node AND x.event = e.event
            AND x.request_id = e.request_id AND x.transfer_id IS NOT DISTINCT FROM e.transfer_id)
        ORDER BY e.request_id, e.transfer_id, e.event""", {"node": node}).fetchall()
    out = []
    for row in rows:
        record = dict(zip(_EVENT_FIELDS, row, strict=True))
        out.append(dict(record, ts=_ts(record["ts"]), node=node, seq=None, _carried=record["node"]))
    return out


def _placed(records: list[dict[str, Any]], extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` (a node's, in its order) with each of ``extra`` put where causality and then
    time say; each placed record takes the (boot, seq) of the record before it as its sort key."""
    by_request: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        if r.get("request_id") is not None:
            by_request[r["request_id"]].append(i)
    at: list[tuple[int, int, dict[str, Any]]] = []
    for n, e in enumerate(extra):
        mine = by_request.get(e["request_id"], [])
        if not mine:
            continue  # the node holds nothing of the request: the end acts on nothing there
        lo = max((i + 1 for i in mine if (records[i]["kind"], records[i]["event"]) in _BEFORE_TRANSFER_END), default=0)
        hi = min((i for i in mine if (records[i]["kind"], records[i]["event"]) in _AFTER_TRANSFER_END and i >= lo),
                 default=len(records))
        pos = next((i for i in range(lo, hi) if records[i]["ts"] > e["ts"]), hi)
        at.append((pos, n, e))
    out: list[dict[str, Any]] = []
    at.sort(key=lambda t: (t[0], t[1]))
    k = 0
    for i in range(len(records) + 1):
        while k < len(at) and at[k][0] == i:
            e = at[k][2]
            before = out[-1] if out else (records[i] if i < len(records) else None)
            boot = before["boot"] if before is not None else 0
            key = before.get("_seq_key", before["seq"]) if before is not None else None
            out.append(dict(e, boot=boot, _seq_key=_NO_SEQ if key is None else key))
            k += 1
        if i < len(records):
            out.append(records[i])
    return out


def _plan_requests(
    configs: dict[str, list[tuple[int, int, str, NodeConfig]]],
    facts: list[RequestFacts],
    engine: str,
    what_if: WhatIf,
) -> tuple[dict[str, Request], dict[str, Plan], dict[str, str], list[str]]:
    """The requests as the router logged them, the engine's cross-node decisions, and the
    requests that reach the engine under this replay but have no engine event in the logs."""
    last_config = {node: what_if.apply(per[-1][3]) for node, per in configs.items() if per}
    prefill_configs = [c for _, c in sorted(last_config.items()) if c.role == "prefill"]
    fallback = prefill_configs[0] if prefill_configs else next(iter(last_config.values()))
    requests: dict[str, Request] = {}
    plans: dict[str, Plan] = {}
    arrivals: dict[str, str] = {}
    unlogged: list[str] = []
    for f in facts:
        max_new = f.max_new_tokens if f.max_new_tokens is not None else (f.output or 0)
        request = Request(f.request_id, f.tenant_id, f.prompt_tokens, max_new, f.prefill_node, f.decode_node)
        prefill = last_config.get(f.prefill_node or f.prefill_of or "", fallback)
        requests[f.request_id] = request
        plans[f.request_id] = p = plan(request, engine, prefill)
        arrivals[f.request_id] = f.ts
        if not p.router_rejects and not (f.on_prefill or f.on_decode):
            unlogged.append(f.request_id)
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
    served: frozenset[str] | None = None,
    disagreements: list[Disagreement] | None = None,
) -> None:
    """Feed one node's configs and events, merged in (boot, seq) order, to a node engine;
    ``extra`` events (of requests the logs have no engine event for) join by time."""
    if not configs:  # a router (or any node without a config): its events pass through
        router = NodeEngine(NodeConfig(node, "router", 1 << 62, 1, 2), engine, log, requests, plans)
        for record in events:
            if record["request_id"] in unlogged and record["event"] != "received":
                continue  # the logged router rejection no longer applies
            router.handle(_logged(record))
        return
    pending = list(reversed(extra))
    timeline = sorted(
        [(boot, seq, 0, i) for i, (boot, seq, _, _) in enumerate(configs)]
        + [(e["boot"], e.get("_seq_key", e["seq"] if e["seq"] is not None else _NO_SEQ), 1, i)
           for i, e in enumerate(events)]
    )
    node_engine: NodeEngine | None = None
    for boot, _, what, i in timeline:
        if what == 0:
            config = what_if.apply(configs[i][3])
            if node_engine is None or boot != node_engine.boot:
                log.new_boot(node)
                if node_engine is None:
                    node_engine = NodeEngine(config, engine, log, requests, plans, boot=boot, served=served,
                                             disagreements=disagreements if disagreements is not None else [])
                else:
                    node_engine.start_boot(boot, config)
            else:
                node_engine.config = config
            log.emit(config.record(configs[i][2], boot))
            continue
        if node_engine is None:  # events before any config: no pool to act on
            log.emit(_logged(events[i]))
            continue
        if events[i]["boot"] != node_engine.boot:
            log.new_boot(node)
            node_engine.start_boot(events[i]["boot"], node_engine.config)
        while pending and pending[-1]["ts"] < events[i]["ts"]:
            node_engine.handle(dict(pending.pop(), boot=node_engine.boot))
        node_engine.handle(_logged(events[i]))
    while pending and node_engine is not None:
        node_engine.handle(dict(pending.pop(), boot=node_engine.boot))


def _logged(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the engine is handed it: the replay's own marks left out (a copy)."""
    if "_carried" not in record and "_seq_key" not in record:
        return dict(record)
    return {k: v for k, v in record.items() if not k.startswith("_")}


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
