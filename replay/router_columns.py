"""A node without an engine config (the router) replayed a batch of its records at a time as
columns: the same lines as :func:`replay.drive.replay_node` writes through the router's
:class:`~replay.engine.NodeEngine`, which stays their reference (tests/replay/test_router_columns.py).

The router passes its records through, numbered afresh, with three exceptions: a request whose plan
has the router reject it keeps its ``received`` record, followed by the router's rejection and its
finish (the engine's own records), and loses every later record there; and a request the logs show
no engine event for (the replay's ``unlogged``) keeps only its ``received``. A record's plan is its
request's (every record of a request carries the same: one join), or the unlogged request's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay import logset
from replay.decode_columns import flat, lines
from replay.engine import ROUTER_REJECT
from replay.logset import LogSet, record_line, ts_text
from replay.scratch import flags


def route(batches: Iterator[pa.RecordBatch], node: str, log: LogSet, unlogged: dict[str, Any]) -> None:
    """Write ``node``'s records of ``node_events`` (``ByNode.batches_of``) as its router replays them."""
    for batch in batches:
        if batch.num_rows:
            _route(batch, node, log, unlogged)



def _route(batch: pa.RecordBatch, node: str, log: LogSet, unlogged: dict[str, Any]) -> None:
    col = batch.column
    rids = col("request_id").to_pylist()
    kind = col("kind")
    engine_event = flags(pc.or_(pc.equal(kind, "request"), pc.equal(kind, "transfer"))) & \
        flags(col("request_id").is_valid())
    named_received = flags(pc.equal(col("event"), "received"))
    received = named_received & flags(pc.equal(kind, "request"))
    mine = np.array([rid in unlogged for rid in rids], bool) if unlogged else np.zeros(len(rids), bool)
    names = batch.schema.names
    plans = names[names.index("_last") + 1:names.index("_finish_i")]
    planned = flags(col(plans[-1]).is_valid()) | mine  # (a plan: its row's, or the unlogged request's)
    rejects = flags(col("p_router_rejects")).copy()
    context = col("p_context_length").to_pylist()
    for j in np.flatnonzero(mine):
        plan = unlogged[rids[j]][1]
        rejects[j], context[j] = plan.router_rejects, plan.context_length
    rejected = engine_event & planned & rejects
    kept = ~(mine & ~named_received) & ~(rejected & ~received)
    rejecting = kept & rejected & received
    # each kept record's line, then (rejecting) the router's rejection and the request's finish
    counts = kept.astype(np.int64) + 2 * rejecting
    at = np.cumsum(counts) - counts  # (each row's first line among the batch's)
    total = int(counts.sum())
    first = log.seq(node)
    ordered = np.empty(total, np.int64)  # (each line's place in `texts`)
    kept_rows = np.flatnonzero(kept)
    ordered[at[kept_rows]] = np.arange(len(kept_rows))
    before, after = lines(batch.filter(pa.array(kept)), node, 0)
    seqs = pa.array(first + at[kept_rows], pa.int64()).cast(pa.string())
    texts = [pc.binary_join_element_wise(before, seqs, after, "")]
    ends: list[str] = []
    for j in np.flatnonzero(rejecting):
        ts = ts_text(col("ts")[j].as_py() * 1000)
        seq = first + int(at[j]) + 1
        ordered[at[j] + 1], ordered[at[j] + 2] = len(kept_rows) + len(ends), len(kept_rows) + len(ends) + 1
        ends.append(record_line({"kind": "request", "ts": ts, "node": node, "seq": seq, "request_id": rids[j],
                                 "event": "rejected", "reason": ROUTER_REJECT[1], "limit_tokens": context[j]}) + "\n")
        ends.append(record_line({"kind": "request", "ts": ts, "node": node, "seq": seq + 1, "request_id": rids[j],
                                 "event": "finished", "status": ROUTER_REJECT[0], "finish_reason": ROUTER_REJECT[1],
                                 "output_tokens": 0}) + "\n")
    if ends:
        texts.append(pa.array(ends, pa.string()))
    data, offsets = flat(pa.concat_arrays(texts).take(pa.array(ordered)))
    # a packed file closes after the record that brings it to its limit (LogSet.emit)
    part = log.part_records
    splits: list[int] = []
    if log.packed:
        limit = logset.PART_RECORDS
        splits = [int(offsets[k + 1]) for k in range(limit - part - 1, total, limit)]
        part = (part + total) % limit
    else:
        part += total
    log.emit_lines(node, data.tobytes(), total, first + total, splits, part)
