"""A decode node replayed by compiled code (:mod:`replay.decode_kernel`), where the node is one it
covers: the same lines, disagreements and figures as :func:`replay.drive.replay_node`, at a
fraction of its Python's cost a record.

Whether a node is covered is decided before it starts, never part way: a node replayed in Python
from a record on would need the Python's state rebuilt from the kernel's. What the kernel does not
cover goes to the Python whole (:func:`covers`, and the case's own records: :data:`BLOCKERS`): a
node of more than one boot or config, a cache flush or a retraction on it, a request decoding
twice there, requests the logs show no engine event for, page tags or coverage checks, a mixed
schedule, a config the replay does not model, a pool past the replay's bound.

Here the node's records, as :func:`replay.carried.placed` hands them out, become the kernel's
columns a batch at a time, with the lines of the records it writes as logged (each a template: its
text before and after the seq, which the kernel numbers), and what it returns becomes the node's
lines in the log set, its disagreements (worded by the same functions as the Python's), and the
clock and engine the replay's tally reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics import compiled
from replay import decode_columns
from replay import decode_kernel as k
from replay.carried import Placer, placed
from replay.configs import WhatIf
from replay.engine import (
    EXCEEDS_POOL,
    POOL_EXHAUSTED,
    Disagreement,
    NodeConfig,
    NodeEngine,
    pages_short,
    prompt_beyond_bound,
    prompt_beyond_pool,
    row_beyond_bound,
    step_starved,
)
from replay.events import AFTER_TRANSFER_END, MARKS, NO_SEQ, Row, named, node_events, ok_status
from replay.logset import PART_RECORDS, LogSet, record_line, ts_text, ts_texts
from replay.planning import request_of
from replay.pool import TOUCHED_BOUND
from replay.schedule import (
    RESTART,
    Cadence,
    Horizon,
    Schedule,
    StepClock,
    pinned_differs,
    placed_differs,
    running_differs,
    step_record_differs,
    steps_differ,
)
from replay.scratch import flags, ints

#: Decode nodes of at least this many records (request, transfer and step) are replayed compiled,
#: where covered; smaller ones in Python (the sample's nodes: nothing to compile).
FAST_FROM = 4_096
#: The environment variable that says which decode nodes the replay compiles: ``never``, ``always``
#: (whatever their size: the tests hold every case to the Python this way), or by size (unset).
VARIABLE = "KVFORENSICS_DECODE_KERNEL"
#: Events handed to the kernel a call.
BATCH = 8_192
#: The engines it stands in for (a decode node's page tags and coverage check are not compiled).
BEHAVIOURS = ("sglang-placeholder", "sglang-hardened")
#: The SQL that names the nodes whose records the kernel does not cover (:func:`blockers`): more
#: than one boot, a cache flushed or retracted, a retracted finish, a request that starts decoding
#: twice; and every node where a time lies outside int64 nanoseconds (1677 to 2262: the kernel's).
BLOCKERS = """
SELECT node FROM records WHERE kind IN ('request', 'transfer', 'step') GROUP BY node
HAVING count(DISTINCT boot) > 1 OR bool_or(kind = 'step' AND cache IS NOT NULL)
    OR bool_or(kind = 'request' AND event = 'finished' AND coalesce(retractions, 0) > 0)
    OR (SELECT min(ts) < TIMESTAMPTZ '1677-09-22 00:00:00+00' OR max(ts) >= TIMESTAMPTZ '2262-04-11 00:00:00+00'
        FROM records WHERE kind IN ('request', 'transfer', 'step'))
UNION
SELECT DISTINCT node FROM records WHERE kind = 'request' AND event = 'decode_started' AND request_id IS NOT NULL
GROUP BY node, request_id HAVING count(*) > 1
"""

#: What a record's line leaves out: the replay's marks, and the implied end's (which is never written).
_MARKED = (*MARKS, "implied")
_SEQ = 918273645546372819  # (a seq no record has: where a template's seq goes)
_SEQ_TEXT = f'"seq":{_SEQ}'
_DST = "0-918273645546372819"  # (a page string no record has: where a transfer's dst_pages go)
_DST_TEXT = f'"dst_pages":"{_DST}"'
_REQUEST_EVENTS = {"admitted": k.E_ADMITTED, "rejected": k.E_REJECTED, "decode_started": k.E_DECODE_STARTED,
                   "finished": k.E_FINISHED}
_CALLS = iter(range(1, 1 << 62))


def load_kernel() -> None:
    """Load the compiled kernel now (compiling it where nothing is cached: about half a minute, once per
    install): a replay's fork server does, before it forks the workers (replay/preload.py)."""
    global _CALLS
    config = NodeConfig("n", "decode", 8, 1, 4)
    _Run("n", 0, config, LogSet(), {}, False, Schedule(), None, None, [])._call(np.zeros((1, k.NEV), np.int64), 0,
                                                                                 _bytes([]))
    _CALLS = iter(range(2, 1 << 62))


def wanted(rows: int) -> bool:
    """Whether a decode node of ``rows`` records is replayed compiled where covered (:data:`VARIABLE`)."""
    told = os.environ.get(VARIABLE, "").strip().lower()
    if told in ("never", "0", "off"):
        return False
    return told in ("always", "1", "on") or rows >= FAST_FROM


def blockers(con: Any) -> frozenset[str]:
    """The nodes whose records the kernel does not cover (:data:`BLOCKERS`)."""
    return frozenset(node for (node,) in con.execute(BLOCKERS).fetchall())


def covers(configs: list[tuple[int, int, str, NodeConfig]], engine: str, what_if: WhatIf, schedule: Schedule,
           extra: list[dict[str, Any]], unmodelled: list[tuple[str, str]]) -> bool:
    """Whether the kernel replays a decode node of these configs (``unmodelled``: what its config says
    the replay does not model) under this engine, what-if and schedule, with ``extra`` events."""
    if len(configs) != 1 or extra or engine not in BEHAVIOURS or schedule.pick not in ("logged", "early", "late"):
        return False
    config = what_if.apply(configs[0][3])
    return config.role == "decode" and not unmodelled and 2 <= config.pool_pages <= TOUCHED_BOUND


def replay(stream: Iterator[Row | str], node: str, configs: list[tuple[int, int, str, NodeConfig]], engine: str,
           what_if: WhatIf, log: LogSet, unlogged: dict[str, Any], confirm: bool, disagreements: list[Disagreement],
           schedule: Schedule, cadence: Cadence | None, horizon: Horizon | None,
           clocks_used: list[StepClock] | None, engines_used: list[NodeEngine] | None) -> Iterator[Row | str] | None:
    """Replay the decode node ``node`` from its ``stream`` by the kernel (:func:`covers` said it may).
    None once done; where its first record comes before its config or in another boot (the Python
    configures it otherwise), the stream, unread, for the Python."""
    head: list[Row | str] = []
    first: Row | None = None
    for item in stream:
        head.append(item)
        if not isinstance(item, str):
            first = item
            break
    if first is None:
        return chain(head, stream)
    record = first.record
    if not _starts(configs[0], record["boot"], record.get("_seq_key", record["seq"])):
        return chain(head, stream)
    run = _begin(node, configs, engine, what_if, log, unlogged, confirm, disagreements, schedule, cadence, horizon,
                 engines_used)
    run.all(chain(head, stream))
    _end(run, cadence, schedule, horizon, clocks_used, disagreements)
    return None


def replay_columns(batches: Iterator[pa.RecordBatch], carried: Iterator[tuple[int, Row]], node: str,
                   configs: list[tuple[int, int, str, NodeConfig]], engine: str, what_if: WhatIf, log: LogSet,
                   unlogged: dict[str, Any], confirm: bool, disagreements: list[Disagreement], schedule: Schedule,
                   cadence: Cadence | None, horizon: Horizon | None, clocks_used: list[StepClock] | None,
                   engines_used: list[NodeEngine] | None) -> Iterator[Row | str] | None:
    """:func:`replay` of a decode node from its rows of ``node_events`` as Arrow batches
    (``ByNode.batches_of``), read a batch at a time as columns (:mod:`replay.decode_columns`), with
    the transfer ends ``carried`` to it placed among them as :func:`replay.carried.placed` places
    them: the same lines, disagreements and figures. Where its first record does not start its
    config's boot, its records as :func:`replay` would hand them back."""
    batches = (b for b in batches if b.num_rows)
    first = next(batches, None)
    if first is None:  # (no record of its own: what is carried to it, if anything, record by record)
        return replay(placed(iter(()), carried), node, configs, engine, what_if, log, unlogged, confirm,
                      disagreements, schedule, cadence, horizon, clocks_used, engines_used)
    # (a carried end placed before its first row takes that row's boot and seq: the row decides)
    if not _starts(configs[0], first.column("boot")[0].as_py(), first.column("seq")[0].as_py()):
        return placed(node_events(chain([first], batches)), carried)
    run = _begin(node, configs, engine, what_if, log, unlogged, confirm, disagreements, schedule, cadence, horizon,
                 engines_used)
    run.columns(chain([first], batches), carried)
    _end(run, cadence, schedule, horizon, clocks_used, disagreements)
    return None


def _starts(config: tuple[int, int, str, NodeConfig], boot: int | None, seq: int | None) -> bool:
    """Whether a node's first record (in ``boot``, at ``seq``) comes in its config's boot after it."""
    return boot == config[0] and (config[0], config[1]) <= (boot, NO_SEQ if seq is None else seq)



def _begin(node: str, configs: list[tuple[int, int, str, NodeConfig]], engine: str, what_if: WhatIf, log: LogSet,
           unlogged: dict[str, Any], confirm: bool, disagreements: list[Disagreement], schedule: Schedule,
           cadence: Cadence | None, horizon: Horizon | None, engines_used: list[NodeEngine] | None) -> _Run:
    """The node's boot begun: its config's record written, its engine and its run made."""
    boot, _, ts, raw = configs[0]
    compiled.taken(_CALLS, 0, "decode nodes")  # (says so where the first run compiles it)
    config = what_if.apply(raw)
    log.new_boot(node)
    engine_used = NodeEngine(config, engine, log, {}, {}, boot=boot)
    if engines_used is not None:
        engines_used.append(engine_used)
    log.emit(config.record(ts, boot))
    run = _Run(node, boot, config, log, unlogged, confirm, schedule, cadence, horizon, disagreements)
    run.engine = engine_used
    return run


def _end(run: _Run, cadence: Cadence | None, schedule: Schedule, horizon: Horizon | None,
         clocks_used: list[StepClock] | None, disagreements: list[Disagreement]) -> None:
    """What the run found, for the replay's tally: its clock, its engine's figures, its disagreements."""
    if run.clock_made:
        clock = StepClock(cadence, schedule, run.node, horizon=horizon, overlap=run.config.overlap_schedule)
        clock.steps, clock.ambiguous, clock.blind = run.scalar(k.S_STEPS), run.scalar(k.S_AMBIG), run.blind
        clock.step_records = run.scalar(k.S_SREC)
        clock.step_records_undecided = run.scalar(k.S_SUNDEC)
        clock.step_records_unchecked = run.scalar(k.S_SUNCHK)
        if clocks_used is not None:
            clocks_used.append(clock)
    assert run.engine is not None
    run.engine.unsupplied = run.unsupplied
    run.engine.starved_steps = run.scalar(k.S_STARVED)
    if run.confirm:
        disagreements.extend(Disagreement("", run.node, "step_record_differs", step_record_differs(run.boot, label, d))
                             for label, d in run.step_disagreements)


class _Run:
    """One decode node's replay by the kernel: its state between calls, and what it found."""

    def __init__(self, node: str, boot: int, config: NodeConfig, log: LogSet, unlogged: dict[str, Any],
                 confirm: bool, schedule: Schedule, cadence: Cadence | None, horizon: Horizon | None,
                 disagreements: list[Disagreement]) -> None:
        self.node, self.boot, self.config, self.log = node, boot, config, log
        self.unlogged, self.confirm, self.disagreements = unlogged, confirm, disagreements
        self.step_disagreements: list[tuple[str, str]] = []
        self.unsupplied: list[str] = []
        S = self.S = np.zeros(k.NS, np.int64)
        S[k.S_PS], S[k.S_POOL_PAGES], S[k.S_POOL_TOKENS] = config.page_size, config.pool_pages, config.pool_tokens
        S[k.S_OVERLAP], S[k.S_CONFIRM] = config.overlap_schedule, confirm
        S[k.S_PICK] = {"logged": k.PICK_LOGGED, "early": k.PICK_EARLY, "late": k.PICK_LATE}[schedule.pick]
        S[k.S_HAS_CADENCE], S[k.S_HAS_HORIZON] = cadence is not None, horizon is not None
        S[k.S_PACKED], S[k.S_PART_LIMIT], S[k.S_FRESH] = log.packed, PART_RECORDS, 1
        self.F = np.zeros(4, np.float64)
        if cadence is not None:
            self.F[:] = (cadence.step_ns, cadence.finish_ns, cadence.tolerance_ns, cadence.drift_ns)
        empty = np.empty(0, np.int64)
        self.hz = horizon.arrays if horizon is not None else (empty, empty, empty)
        self.ct, self.co = _texts(node, boot, config)
        self.R = np.zeros((1024, k.NR), np.int64)
        self.slot_list: list[str] = []
        self.slots: dict[str, int] = {}
        self.planned: set[str] = set()
        #: each request's id as a JSON string, at its row's offset (rows of requests forgotten are
        #: taken again by new ones, once the kernel has let them go: memory follows the requests in flight)
        self.rid_text = np.empty(1 << 16, np.uint8)
        self.rid_used = 0
        self.free_slots: list[int] = []
        self.forgotten: list[int] = []
        self.requests = 0  # (the requests the node's records name)
        self.free = np.empty(16, np.int64)
        self.rel = np.empty(1024, np.int64)
        self.arena = np.empty(1 << 16, np.int64)
        self.chains = np.empty(1024, np.int64)
        self.batch = np.empty(1024, np.int64)
        self.ends = np.empty(1024, np.int64)
        self.rowsl = np.empty(1024, np.int64)
        self.left = np.empty((64, 2), np.int64)
        self.recs = np.empty((16, k.NQ), np.int64)
        self.out = np.empty(1 << 20, np.uint8)
        self.splits = np.empty(4096, np.int64)
        self.logv = np.empty(1024, np.int64)
        self.interval = config.step_log_interval
        self.clock_made = False
        self.blind = False
        self.engine: NodeEngine | None = None  # (the engine figures are read from, _begin's)

    def scalar(self, index: int) -> int:
        return int(self.S[index])

    # -- the node's records as the kernel's columns --------------------------------------------

    def all(self, stream: Iterator[Row | str]) -> None:
        """Run the node's records, as :func:`replay.carried.placed` hands them out, a batch at a time."""
        self._rows(stream)
        self._close()

    def _rows(self, stream: Iterator[Row | str]) -> None:
        EV = np.zeros((BATCH, k.NEV), np.int64)
        pieces: list[bytes] = []
        used = 0
        n = 0
        for item in stream:
            row = EV[n]
            if isinstance(item, str):
                if item in self.unlogged:
                    continue
                slot = self.slots.pop(item, None)
                if slot is None:
                    continue
                self.planned.discard(item)
                self.forgotten.append(slot)
                row[:] = 0
                row[k.EV_KIND], row[k.EV_SLOT] = k.K_FORGET, slot
            else:
                used = self._event(item, row, pieces, used)
            n += 1
            if n == BATCH:
                self._call(EV, n, _bytes(pieces))
                pieces, used, n = [], 0, 0
        if n:
            self._call(EV, n, _bytes(pieces))

    def columns(self, batches: Iterator[pa.RecordBatch], carried: Iterator[tuple[int, Row]]) -> None:
        """Run the node's rows of ``node_events`` with the transfer ends ``carried`` to it
        (:func:`replay.carried.carried_to`), a batch at a time as columns: what :meth:`all` does over
        them as :func:`replay.carried.placed` orders them, for each batch at once where it can."""
        placer = _Batches(carried)
        for batch in batches:
            for lo in range(0, batch.num_rows, BATCH):
                part = batch.slice(lo, BATCH)
                self._columns(part, placer.order(part))
        rest = placer.rest()
        if rest:
            self._rows(iter(rest))
        self._close()

    def _close(self) -> None:
        self.logv = k.finish(self.R, self.S, self.batch, self.rowsl, self.left, self.recs, self.logv)
        self._drain()
        self.clock_made = bool(self.S[k.S_CLOCK])
        self.blind = bool(self.S[k.S_BLIND])

    def _columns(self, batch: pa.RecordBatch, items: list[int | Row | str] | None) -> None:
        """The rows of ``batch`` as the kernel's events, given to it in one call, in the order of
        ``items`` (:class:`_Batches`: a row by its place in the batch, a transfer end carried to the
        node as its record, a request forgotten by its id); None: the rows in order, each request's
        last followed by its forgetting (nothing carried to place among them)."""
        n = batch.num_rows
        col = batch.column
        step = flags(pc.equal(col("kind"), "step"))
        request = flags(pc.equal(col("kind"), "request"))
        completed = ~step & ~request & flags(pc.equal(col("event"), "completed"))
        names = batch.schema.names
        plans = [col(i) for i in range(names.index("_last") + 1, names.index("_finish_i"))]
        rids = col("request_id").to_pylist()
        # the requests, event by event: rows, plans, carried ends, forgetting (drive's admit; placed's order)
        slots = np.full(n, -1, np.int64)
        admit = np.zeros(n, np.int64)
        served = np.zeros(n, np.int64)
        tokens = np.full(n, -1, np.int64)  # a transfer's end that lands pages: its request's tokens
        plan_rows: list[tuple[Any, ...]] | None = None
        has_plan = flags(plans[-1].is_valid())
        logged_served = flags(col("_served"))
        planned, unlogged, known = self.planned, self.unlogged, self.slots
        what: list[int] = []  # each event's: a row of the batch (its place), a carried end, a forgetting
        which: list[int] = []  # and which: the row, the carried end's row in `carried`, the slot forgotten
        carried: list[np.ndarray] = []
        pieces: list[bytes] = []
        used = 0
        for item in _in_order(rids, flags(col("_last"))) if items is None else items:
            if isinstance(item, int):
                j = item
                what.append(_ROW)
                which.append(j)
                rid = rids[j]
                if rid is None or step[j]:
                    continue
                slot = known.get(rid)
                if slot is None:
                    slot = self._slot(rid)
                slots[j] = slot
                if has_plan[j] and rid not in planned:
                    if plan_rows is None:
                        plan_rows = list(zip(*(c.to_pylist() for c in plans), strict=True))
                    self._plan(slot, plan_rows[j], rid)
                    planned.add(rid)
                    admit[j], served[j] = 1, self.confirm and logged_served[j]
                if completed[j] and rid in planned:
                    tokens[j] = self.R[slot, k.R_KV]
            elif isinstance(item, str):
                if item in unlogged:
                    continue
                slot = known.pop(item, None)
                if slot is None:
                    continue
                planned.discard(item)
                self.forgotten.append(slot)
                what.append(_FORGET)
                which.append(slot)
            else:
                row = np.zeros(k.NEV, np.int64)
                used = self._event(item, row, pieces, used)
                what.append(_CARRIED)
                which.append(len(carried))
                carried.append(row)
        rows = np.zeros((n, k.NEV), np.int64)
        rows[:, k.EV_TS] = ints(col("ts"), 0) * 1000
        rows[:, k.EV_AT] = ints(col("_i"), -1)
        rows[:, k.EV_SLOT] = slots
        rows[:, k.EV_KIND] = np.where(step, k.K_STEP, np.where(request, k.K_REQUEST, k.K_TRANSFER))
        event = pc.index_in(col("event"), value_set=_EVENT_NAMES)
        rows[:, k.EV_EVENT] = np.where(request, _EVENT_CODES[ints(event, len(_EVENT_NAMES))],
                                       np.where(completed, k.E_COMPLETED, k.E_OTHER))
        status = ints(col("status"), 0)
        rows[:, k.EV_OK] = ~step & (status >= 200) & (status <= 299)
        rows[:, k.EV_FINISH_AT] = np.where(step, 0, ints(col("_finish_i"), -1))
        rows[:, k.EV_ADMIT], rows[:, k.EV_SERVED] = admit, served
        seq = col("seq")
        rows[:, k.EV_HAS_SEQ] = step & flags(seq.is_valid())
        rows[:, k.EV_SEQ] = np.where(step, ints(seq, 0), 0)
        steps = ints(col("steps"), 0)
        interval = -1 if self.interval is None else self.interval
        rows[:, k.EV_STEPS] = np.where(step, np.where(steps != 0, steps, interval), 0)
        rows[:, k.EV_RUNNING] = np.where(step, ints(col("running"), 0), 0)
        data, start, middle = decode_columns.templates(batch, self.node, self.boot)
        rows[:, k.EV_TA], rows[:, k.EV_TB] = start, middle
        rows[:, k.EV_TC] = np.append(start[1:], len(data))
        texts = [data]
        lands = np.flatnonzero(tokens >= 0)
        if len(lands):
            more, first, second, third = decode_columns.landed(batch.take(lands), self.node, self.boot, tokens[lands])
            rows[lands, k.EV_WA], rows[lands, k.EV_WB] = first + len(data), second + len(data)
            rows[lands, k.EV_WC] = third + len(data)
            rows[lands, k.EV_WD] = np.append(first[1:], len(more)) + len(data)
            texts.append(more)
        kinds, places = np.array(what, np.int64), np.array(which, np.int64)
        EV = np.zeros((len(kinds), k.NEV), np.int64)
        EV[kinds == _ROW] = rows[places[kinds == _ROW]]
        EV[kinds == _FORGET, k.EV_KIND] = k.K_FORGET
        EV[kinds == _FORGET, k.EV_SLOT] = places[kinds == _FORGET]
        if carried:  # (their templates after the rows': the offsets _event gave them moved past those)
            ends = np.array(carried)
            before = sum(len(t) for t in texts)
            logged = ends[:, k.EV_IMPLIED] == 0  # (an implied end is not written: no template)
            ends[np.ix_(logged, [k.EV_TA, k.EV_TB, k.EV_TC])] += before
            lands_too = ends[:, k.EV_WD] != 0
            ends[np.ix_(lands_too, [k.EV_WA, k.EV_WB, k.EV_WC, k.EV_WD])] += before
            EV[kinds == _CARRIED] = ends[places[kinds == _CARRIED]]
            texts.append(_bytes(pieces))
        self._call(EV, len(EV), np.concatenate(texts))  # (a new array: writable, as the kernel's signature has it)

    def _event(self, item: Row, row: np.ndarray, pieces: list[bytes], used: int) -> int:
        """Event ``item`` as a row of the kernel's columns, its templates appended to ``pieces``
        (``used`` bytes before them); the bytes after them."""
        row[:] = 0
        record = item.record
        kind = record["kind"]
        row[k.EV_TS] = record["_ns"]
        at = record.get("_i")
        row[k.EV_AT] = -1 if at is None else at
        logged = record.copy()  # (as drive._logged: a copy and a few deletions, not a comprehension over every field)
        for mark in _MARKED:
            if mark in logged:
                del logged[mark]
        logged["node"], logged["boot"] = self.node, self.boot
        slot = -1
        if kind == "step":
            row[k.EV_KIND], row[k.EV_EVENT] = k.K_STEP, k.E_OTHER
            row[k.EV_HAS_SEQ] = record["seq"] is not None
            row[k.EV_SEQ] = record["seq"] if record["seq"] is not None else 0
            steps = record["steps"] or self.interval
            row[k.EV_STEPS] = -1 if steps is None else steps
            row[k.EV_RUNNING] = record["running"]
        else:
            row[k.EV_KIND] = k.K_REQUEST if kind == "request" else k.K_TRANSFER
            event = record["event"]
            row[k.EV_EVENT] = (_REQUEST_EVENTS.get(event, k.E_OTHER) if kind == "request"
                               else k.E_COMPLETED if event == "completed" else k.E_OTHER)
            row[k.EV_CARRIED] = "_carried" in record
            row[k.EV_IMPLIED] = bool(record.get("implied"))
            row[k.EV_OK] = ok_status(record.get("status"))
            finish_at = record.get("_finish_i")
            row[k.EV_FINISH_AT] = -1 if finish_at is None else finish_at
            rid = record["request_id"]
            if rid is not None:
                slot = self._slot(rid)
                if rid not in self.planned and item.plan is not None:  # (drive's admit)
                    self._plan(slot, item.plan, rid)
                    self.planned.add(rid)
                    row[k.EV_ADMIT], row[k.EV_SERVED] = 1, self.confirm and item.served
        row[k.EV_SLOT] = slot
        if row[k.EV_IMPLIED]:
            return used
        before, after = record_line(dict(logged, seq=_SEQ)).split(_SEQ_TEXT, 1)
        text = (before + '"seq":').encode(), (after + "\n").encode()
        row[k.EV_TA], row[k.EV_TB], row[k.EV_TC] = used, used + len(text[0]), used + len(text[0]) + len(text[1])
        pieces.extend(text)
        used = int(row[k.EV_TC])
        if kind == "transfer" and record["event"] == "completed" and slot >= 0 and \
                record["request_id"] in self.planned:  # (its pages written in, as the engine logs it)
            landed = dict(logged, seq=_SEQ, tokens=int(self.R[slot, k.R_KV]), dst_pages=_DST)
            landed.pop("src_pages", None)
            before, after = record_line(landed).split(_SEQ_TEXT, 1)
            middle, rest = after.split(_DST_TEXT, 1)
            parts = ((before + '"seq":').encode(), (middle + '"dst_pages":"').encode(), ('"' + rest + "\n").encode())
            row[k.EV_WA] = used
            row[k.EV_WB] = used + len(parts[0])
            row[k.EV_WC] = row[k.EV_WB] + len(parts[1])
            row[k.EV_WD] = row[k.EV_WC] + len(parts[2])
            pieces.extend(parts)
            used = int(row[k.EV_WD])
        return used

    def _slot(self, rid: str) -> int:
        slot = self.slots.get(rid)
        if slot is not None:
            return slot
        self.requests += 1
        if self.free_slots:
            slot = self.slots[rid] = self.free_slots.pop()
            self.slot_list[slot] = rid
            self.R[slot] = 0
        else:
            slot = self.slots[rid] = len(self.slot_list)
            self.slot_list.append(rid)
            if slot >= len(self.R):
                self.R = np.concatenate([self.R, np.zeros_like(self.R)])
                for name in ("batch", "ends", "rowsl"):
                    setattr(self, name, np.concatenate([getattr(self, name), np.empty(len(self.R) // 2, np.int64)]))
        quoted = np.frombuffer(record_line({"request_id": rid})[len('{"request_id":'):-1].encode(), np.uint8)
        if self.rid_used + len(quoted) > len(self.rid_text):
            self._pack_ids(len(quoted))
        self.rid_text[self.rid_used:self.rid_used + len(quoted)] = quoted
        self.R[slot, k.R_RID_OFF], self.R[slot, k.R_RID_LEN] = self.rid_used, len(quoted)
        self.rid_used += len(quoted)
        self.R[slot, k.R_FIRST_WRITE] = -1  # (none)
        self.S[k.S_NSLOTS] = len(self.slot_list)
        if rid in self.unlogged:  # (known to the engine from the start: its plan given, never forgotten)
            request, plan, _ = self.unlogged[rid]
            self._fill(slot, request, plan)
            self.R[slot, k.R_PLAN] = 1
            self.planned.add(rid)
        return slot

    def _pack_ids(self, more: int) -> None:
        """Room for ``more`` bytes of request ids: the ids of the rows in use packed, the text grown where
        they fill half of it."""
        free = set(self.free_slots)
        rows = [s for s in range(len(self.slot_list)) if s not in free]
        live = int(self.R[rows, k.R_RID_LEN].sum()) if rows else 0
        packed = np.empty(max(len(self.rid_text), 2 * (live + more)), np.uint8)
        used = 0
        for s in rows:
            off, n = self.R[s, k.R_RID_OFF], self.R[s, k.R_RID_LEN]
            packed[used:used + n] = self.rid_text[off:off + n]
            self.R[s, k.R_RID_OFF] = used
            used += n
        self.rid_text, self.rid_used = packed, used

    def _plan(self, slot: int, plan_row: tuple[Any, ...], rid: str) -> None:
        request, plan = request_of(rid, plan_row)
        self._fill(slot, request, plan)

    def _fill(self, slot: int, request: Any, plan: Any) -> None:
        r = self.R[slot]
        r[k.R_ROUTER_REJ], r[k.R_PREFILL_REJ], r[k.R_KV] = plan.router_rejects, plan.prefill_rejects, plan.kv_tokens
        r[k.R_PROMPT], r[k.R_OUTPUTS] = request.prompt_tokens, request.outputs

    # -- the kernel, and what it returns -------------------------------------------------------

    def _call(self, EV: np.ndarray, n: int, tb: np.ndarray) -> None:
        """The kernel over the first ``n`` events of ``EV``, their lines' templates in ``tb``
        (writable, as load_kernel's: numba compiles, and caches, one signature)."""
        S = self.S
        S[k.S_SEQ] = self.log.seq(self.node)
        S[k.S_PART] = self.log.part_records
        (self.free, self.rel, self.arena, self.chains, self.left, self.recs, self.out, self.logv) = k.run(
            EV, n, tb, self.R, self.rid_text, S, self.F, *self.hz, self.ct, self.co, self.free, self.rel, self.arena,
            self.chains, self.batch, self.ends, self.rowsl, self.left, self.recs, self.out, self.splits, self.logv)
        self._drain()
        # the rows the kernel let go (forgotten out of the batch) are taken by the next new requests
        if self.forgotten:
            forgotten = np.array(self.forgotten, np.int64)
            self.free_slots.extend(forgotten[self.R[forgotten, k.R_DEAD] != 0].tolist())
            self.forgotten.clear()

    def _drain(self) -> None:
        """The kernel's lines to the log set, its log worded: after each call."""
        S = self.S
        if S[k.S_ERROR] == k.ERR_NO_PAGES:
            raise ValueError("a page list is never empty")
        if S[k.S_ERROR]:
            raise RuntimeError(f"the compiled decode node stopped with error {int(S[k.S_ERROR])}")
        if S[k.S_OUT]:
            self.log.emit_lines(self.node, self.out[:S[k.S_OUT]].tobytes(), int(S[k.S_RECORDS]), int(S[k.S_SEQ]),
                                self.splits[:S[k.S_NSPLIT]].tolist(), int(S[k.S_PART]))
        logv = self.logv[:S[k.S_NLOG]].tolist()
        i = 0
        while i < len(logv):
            kind, code, slot, n = logv[i:i + 4]
            values = logv[i + 4:i + 4 + n]
            i += 4 + n
            if kind == k.L_UNSUPPLIED:
                self.unsupplied.append(self.slot_list[slot])
            elif kind == k.L_DISAGREE:
                what, detail = _worded(code, values)
                self.disagreements.append(Disagreement(self.slot_list[slot], self.node, what, detail))
            else:
                self.step_disagreements.append((_label(values[:3]), _step_worded(code, values[3:])))
        S[k.S_OUT] = S[k.S_NSPLIT] = S[k.S_RECORDS] = S[k.S_NLOG] = 0


#: What an event of :meth:`_Run._columns` is: a row of the batch, a transfer end carried to the node, a
#: request forgotten.
_ROW, _CARRIED, _FORGET = 0, 1, 2


def _in_order(rids: list[str | None], last: np.ndarray) -> Iterator[int | str]:
    """A batch's rows in order, each request's last followed by its id (:func:`replay.carried.placed`
    with nothing carried to place)."""
    for j, rid in enumerate(rids):
        yield j
        if last[j] and rid is not None:
            yield rid


class _Batches:
    """:func:`replay.carried.placed` over a node's rows a batch at a time (its :class:`Placer`): a
    batch's events in placed's order (a row by its place in the batch, a carried end as its record, a
    forgotten request by its id), or None where nothing carried is to be placed among its rows (the
    rows in order, each request's last followed by its id); then :meth:`rest`, what comes after the
    node's last row."""

    def __init__(self, carried: Iterator[tuple[int, Row]]) -> None:
        self.placer = Placer(carried)
        self._i = 0  # the node's rows before the batch

    def order(self, batch: pa.RecordBatch) -> list[int | Row | str] | None:
        n = batch.num_rows
        placer, first = self.placer, self._i
        self._i += n
        col = batch.column
        boots, seqs = col("boot"), col("seq")
        if placer.quiet() or placer.waits_past(first + n - 1):  # (nothing to place among these rows)
            if n:
                placer.passed((boots[n - 1].as_py(), seqs[n - 1].as_py()))
            return None
        rids = col("request_id").to_pylist()
        times = ts_texts(col("ts")).to_pylist()
        keys = list(zip(boots.to_pylist(), seqs.to_pylist(), strict=True))
        after = flags(pc.equal(col("kind"), "request")) & flags(pc.is_in(col("event"), value_set=_AFTER_END))
        last = flags(col("_last"))
        out: list[int | Row | str] = []
        for j in range(n):
            rid = rids[j]
            if placer.quiet():
                out.append(j)
                placer.passed(keys[j])
                if last[j] and rid is not None:
                    out.append(rid)
                continue
            out.extend(placer.before(first + j, rid, times[j], bool(after[j]), keys[j]))
            out.append(j)
            out.extend(placer.after(first + j, rid, bool(last[j]), keys[j]))
        return out

    def rest(self) -> list[Row | str]:
        return self.placer.rest()


#: The events after which no transfer end of their request comes (replay.events.AFTER_TRANSFER_END).
_AFTER_END = pa.array(sorted(e for kind, e in AFTER_TRANSFER_END if kind == "request"))
assert all(kind == "request" for kind, _ in AFTER_TRANSFER_END)


def _bytes(pieces: list[bytes]) -> np.ndarray:
    """Templates' texts as the kernel reads them (a writable array: the signature it is compiled for)."""
    return np.frombuffer(bytearray(b"".join(pieces)), np.uint8)




#: The request events the kernel tells apart, and their codes (any other: E_OTHER, last).
_EVENT_NAMES = pa.array(["admitted", "rejected", "decode_started", "finished"])
_EVENT_CODES = np.array([k.E_ADMITTED, k.E_REJECTED, k.E_DECODE_STARTED, k.E_FINISHED, k.E_OTHER], np.int64)


def _worded(code: int, v: list[int]) -> tuple[str, str]:
    """A disagreement of the kernel's log: its kind and detail, as the Python words it."""
    if code == k.D_SUPPLY_PROMPT:
        return "pool_cannot_supply", prompt_beyond_pool(v[0], v[1])
    if code == k.D_SUPPLY_PAGES:
        return "pool_cannot_supply", pages_short(v[0], v[1])
    if code == k.D_STARVED:
        return "pool_cannot_supply", step_starved(v[0], v[1])
    if code == k.D_BEYOND_PROMPT:
        return "beyond_replay_bound", prompt_beyond_bound(v[0], v[1])
    if code == k.D_BEYOND_ROW:
        return "beyond_replay_bound", row_beyond_bound(v[0], v[1])
    return "steps_differ", steps_differ(v[0])


def _step_worded(code: int, v: list[int]) -> str:
    if code == k.SD_PLACE:
        return placed_differs(*v)
    if code == k.SD_PINNED:
        return pinned_differs(*v)
    return running_differs(v[0], v[1:])


def _label(v: list[int]) -> str:
    """A step record's name (drive's named): its seq, its time, or the name of one read again."""
    kind, seq, ns = v
    if kind == k.LABEL_RESTART:
        return RESTART
    return named({"seq": seq if kind == k.LABEL_SEQ else None, "ts": ts_text(ns)})


def _texts(node: str, boot: int, config: NodeConfig) -> tuple[np.ndarray, np.ndarray]:
    """The constant texts of a node's lines (decode_kernel's fragments, in their order), as the
    log set writes them; and each one's offset and length."""
    def after_rid(**fields: Any) -> str:  # (a request record the engine makes itself, after its request id)
        line = record_line({"kind": "request", "ts": "t", "node": node, "seq": 0, "request_id": "r", **fields})
        return line.split('"request_id":"r"', 1)[1] + "\n"

    quoted_node = record_line({"node": node})[len('{"node":'):-1]
    texts = [
        '{"kind":"kv","ts":"', '","node":', quoted_node, ',"seq":', f',"boot":{boot}' if boot else "",
        ',"request_id":', ',"op":"alloc","pages":"', ',"op":"write","pages":"', ',"op":"read","pages":"',
        ',"op":"free","pages":"', '"}\n', '","source":"transfer"}\n', '","source":"decode"}\n',
        '{"kind":"request","ts":"',
        after_rid(event="rejected", reason=POOL_EXHAUSTED[1]),
        after_rid(event="finished", status=POOL_EXHAUSTED[0], finish_reason=POOL_EXHAUSTED[1], output_tokens=0),
        after_rid(event="rejected", reason=EXCEEDS_POOL[1], limit_tokens=config.pool_tokens),
        after_rid(event="finished", status=EXCEEDS_POOL[0], finish_reason=EXCEEDS_POOL[1], output_tokens=0),
    ]
    assert len(texts) == k.NC
    data = [t.encode() for t in texts]
    co = np.zeros((k.NC, 2), np.int64)
    offset = 0
    for i, d in enumerate(data):
        co[i] = offset, len(d)
        offset += len(d)
    return np.frombuffer(b"".join(data), np.uint8).copy(), co
