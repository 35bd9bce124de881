"""Planning a replay: each received request's cross-node decisions under the engine (the
scratch table ``replay_plans``), the requests the logs show served, and the engine events of
requests the logs show none for, timed by the simulator's cost model."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.store import scan
from replay.configs import NodeConfigs, WhatIf
from replay.engine import Disagreement, NodeConfig, Plan, Request, plan
from replay.logset import ts_text
from replay.scratch import BATCH, flags, log_ns, log_ts, reader
from replay.simulate import DECODE_PER_TOKEN, PREFILL_FIXED, PREFILL_PER_TOKEN, TRANSFER_FIXED, TRANSFER_PER_TOKEN
from replay.statements import SqlList, statement

#: What a node's replay reads of each request with its records: the request as the router logged
#: it (``q_``) and the engine's cross-node decisions for it (``p_``), as :func:`plan` made them.
PLAN_COLUMNS = (
    ("request_id", pa.string()), ("q_tenant_id", pa.string()), ("q_prompt_tokens", pa.int64()),
    ("q_max_new_tokens", pa.int64()), ("q_prefill_node", pa.string()), ("q_decode_node", pa.string()),
    ("q_output_tokens", pa.int64()),
    ("p_router_rejects", pa.bool_()), ("p_over_long", pa.bool_()), ("p_prefill_rejects", pa.bool_()),
    ("p_kv_tokens", pa.int64()), ("p_limit_tokens", pa.int64()), ("p_context_length", pa.int64()),
)
PLAN_SCHEMA = pa.schema(list(PLAN_COLUMNS))
#: A plan's columns after the request id (``{plan_columns}`` of sql/replay.sql).
PLAN_SQL = SqlList.columns(name for name, _ in PLAN_COLUMNS[1:])

#: The columns of the ``request_facts`` statement.
_FACT_NAMES = ("request_id", "ts", "tenant_id", "prompt_tokens", "max_new_tokens", "prefill_node", "decode_node",
               "output", "on_prefill", "on_decode", "prefill_of", "engine_work", "decode_work")


def served_table(con: duckdb.DuckDBPyConnection, confirm: bool) -> None:
    """The scratch table ``replay_served``: confirming, the requests the logs show delivered
    (the replay follows them); else empty (the model decides)."""
    con.execute(statement("served" if confirm else "served_untold"))


def plan_requests(
    con: duckdb.DuckDBPyConnection,
    configs: NodeConfigs,
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
    scan(con, PLAN_SCHEMA.empty_table(), "plan_rows", statement("create_plans"))
    unlogged: dict[str, tuple[Request, Plan, str]] = {}
    admitted: list[str] = []
    cur = reader(con)
    cur.register("node_roles", pa.table({"node": list(roles), "role": list(roles.values())}))
    take = _Planner(last_config, fallback, engine, confirm, disagreements, unlogged, admitted)
    for batch in cur.sql(statement("request_facts")).to_arrow_reader(BATCH):
        if COLUMNS and not batch.column("prompt_tokens").null_count:
            scan(con, take.columns(batch), "plan_rows", statement("insert_plans"))
        else:  # (a prompt without its size: the model's own error, as each request's plan raises it)
            _insert_plans(con, [take.row(dict(zip(_FACT_NAMES, values, strict=True)))
                                for values in zip(*(c.to_pylist() for c in batch.columns), strict=True)])
    cur.close()
    disagreements += [Disagreement(rid, "router", "model_admits_rejected",
                                   "the model admits a prompt the logs show rejected, never on the engine")
                      for rid in admitted]
    return unlogged


#: Whether requests are planned a batch at a time as columns (:meth:`_Planner.columns`), not one at
#: a time (:meth:`_Planner.row`, the reference it is held to: tests/replay/test_planning.py).
COLUMNS = True


@dataclasses.dataclass
class _Planner:
    """Each received request's plan under the replay's engine and the last config of its prefill
    node (``fallback`` where it names none); what it finds said into ``disagreements``, ``unlogged``
    and ``admitted`` (:func:`plan_requests`)."""

    last_config: dict[str, NodeConfig]
    fallback: NodeConfig
    engine: str
    confirm: bool
    disagreements: list[Disagreement]
    unlogged: dict[str, tuple[Request, Plan, str]]
    admitted: list[str]

    def row(self, f: dict[str, Any]) -> tuple[Any, ...]:
        """The plan row of one request's facts ``f``."""
        rid = f["request_id"]
        max_new = f["max_new_tokens"] if f["max_new_tokens"] is not None else (f["output"] or 0)
        request = Request(rid, f["tenant_id"], f["prompt_tokens"], max_new, f["prefill_node"], f["decode_node"],
                          f["output"])
        p = plan(request, self.engine, self.last_config.get(f["prefill_node"] or f["prefill_of"] or "", self.fallback))
        if not p.router_rejects and not (f["on_prefill"] or f["on_decode"]):
            if self.confirm:
                self.admitted.append(rid)
            else:
                self.unlogged[rid] = (request, p, log_ts(f["ts"]))
        if self.confirm:
            p = _followed(f, p, self.disagreements)
        return (rid, request.tenant_id, request.prompt_tokens, request.max_new_tokens, request.prefill_node,
                request.decode_node, request.output_tokens, p.router_rejects, p.over_long, p.prefill_rejects,
                p.kv_tokens, p.limit_tokens, p.context_length)

    def columns(self, batch: pa.RecordBatch) -> pa.Table:
        """:meth:`row` of every request of ``batch`` (its prompts' sizes all known), as a table of plans."""
        col = batch.column
        prompt = col("prompt_tokens").to_numpy(zero_copy_only=False)
        max_new = pc.coalesce(col("max_new_tokens"), col("output"), pa.scalar(0, pa.int64()))
        # the prefill node's config: the one the router named, else the first prefill node that logged it
        named = [pc.if_else(pc.equal(col(c), ""), pa.scalar(None, pa.string()), col(c))
                 for c in ("prefill_node", "prefill_of")]
        nodes = sorted(self.last_config)
        at = pc.index_in(pc.coalesce(*named), value_set=pa.array(nodes, pa.string()))
        known = flags(at.is_valid())
        which = pc.fill_null(at, 0).to_numpy(zero_copy_only=False)
        by_node = [self.last_config[n] for n in nodes] or [self.fallback]
        context = np.where(known, np.array([c.context_length for c in by_node], np.int64)[which],
                           self.fallback.context_length)
        limit = np.where(known, np.array([c.max_req_input_len for c in by_node], np.int64)[which],
                         self.fallback.max_req_input_len)
        router = prompt >= context
        over_long = ~router & (prompt >= limit)
        prefill = over_long & (self.engine == "sglang-hardened")
        on_prefill, on_decode = flags(col("on_prefill")), flags(col("on_decode"))
        rids = col("request_id").to_pylist()
        for j in np.flatnonzero(~router & ~(on_prefill | on_decode)):  # (the engine's: none of its events logged)
            if self.confirm:
                self.admitted.append(rids[j])
                continue
            f = {name: col(name)[j].as_py() for name in _FACT_NAMES}
            request = Request(rids[j], f["tenant_id"], f["prompt_tokens"], int(max_new[j].as_py()), f["prefill_node"],
                              f["decode_node"], f["output"])
            self.unlogged[rids[j]] = (request, Plan(False, bool(over_long[j]), bool(prefill[j]),
                                                    1 if over_long[j] else int(prompt[j]), int(limit[j]),
                                                    int(context[j])), log_ts(f["ts"]))
        if self.confirm:  # (_followed: where the logs show the engine at work, they are followed)
            router_served = router & (on_prefill | on_decode) & flags(col("engine_work"))
            prefill_served = ~router_served & prefill & on_decode & flags(col("decode_work"))
            for j in np.flatnonzero(router_served | prefill_served):
                self.disagreements.append(
                    Disagreement(rids[j], "router", "model_rejects_served",
                                 f"the router would reject its prompt (context {context[j]})") if router_served[j]
                    else Disagreement(rids[j], "prefill", "model_rejects_served",
                                      f"prefill would reject its prompt (limit {limit[j]})"))
            router = router & ~router_served
            prefill = prefill & ~prefill_served
        return pa.Table.from_arrays(
            [col("request_id"), col("tenant_id"), col("prompt_tokens"), max_new, col("prefill_node"),
             col("decode_node"), col("output"), pa.array(router), pa.array(over_long), pa.array(prefill),
             pa.array(np.where(over_long, 1, prompt)), pa.array(limit), pa.array(context)], schema=PLAN_SCHEMA)



def _insert_plans(con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]]) -> None:
    if not rows:
        return
    # (by column: a dict a row cost a third of the planning)
    columns = zip(*rows, strict=True)
    table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(columns, PLAN_SCHEMA, strict=True)],
                                 schema=PLAN_SCHEMA)
    scan(con, table, "plan_rows", statement("insert_plans"))


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


def request_of(rid: str, row: tuple[Any, ...]) -> tuple[Request, Plan]:
    """A ``replay_plans`` row (its columns after the request id) as the request and its plan."""
    tenant, prompt, max_new, prefill, decode, output, router, over_long, prefill_rejects, kv, limit, context = row
    return (Request(rid, tenant, prompt, max_new, prefill, decode, output),
            Plan(router, over_long, prefill_rejects, kv, limit, context))


def arrival_events(
    unlogged: dict[str, tuple[Request, Plan, str]],
    configs: NodeConfigs,
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
        t0 = log_ns(arrival)
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
