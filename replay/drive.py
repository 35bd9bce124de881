"""Driving the engine through a node: its configs and records, merged in its logged order, fed
to a node engine, with a decode node's steps placed by a step clock fitted to its evidence."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from replay import decode_fast, router_columns
from replay.carried import carried_to, placed
from replay.configs import WhatIf
from replay.engine import Disagreement, NodeConfig, NodeEngine, Plan, Request, decode_steps
from replay.events import MARKS, NO_SEQ, NodeReader, Row, named, node_events, ok_status
from replay.logset import LogSet, ts_text
from replay.planning import request_of
from replay.schedule import LOGGED, Cadence, Horizon, Schedule, StepClock, step_record_differs, steps_differ
from replay.scratch import log_ns


def prefix_guesses(guessed: dict[str, int]) -> tuple[str, ...]:
    """What the replay assumed of prefill's prefix cache that the logs do not say: which cached
    prompt a hit shared, where more than one was long enough (``guessed``: how many, by node)."""
    if not guessed:
        return ()
    nodes = sorted(guessed)
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5:,} more" if len(nodes) > 5 else "")
    return (f"{sum(guessed.values()):,} prefix-cache hit(s) on prefill ({shown}) whose cached prompt the logs do "
            "not name took the one touched last (of its tenant first): prefill's pages from there are one layout "
            "of several; decode's pages, and the victims, do not depend on them",)


#: Whether a node without an engine config (the router) is replayed as columns (replay/router_columns.py),
#: not record by record through its engine (the reference it is held to).
ROUTER_COLUMNS = True


def replay_node(
    queries: NodeReader,
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
    engines_used: list[NodeEngine] | None = None,
    fast: bool = False,
) -> None:
    """Feed one node's configs and events, merged in (boot, seq) order, to a node engine;
    ``extra`` events (of requests the logs have no engine event for) join by time. ``fast``: a decode
    node the compiled kernel covers is replayed by it (replay/decode_fast.py: the same lines). A request is
    known to the engine from its first record on the node to its last (its plan read with its
    records), the unlogged ones throughout."""
    requests = {rid: r for rid, (r, _, _) in unlogged.items()}
    plans = {rid: p for rid, (_, p, _) in unlogged.items()}
    served: set[str] | None = set() if confirm else None
    events, carried = queries.events.batches_of(node), carried_to(queries.carried.of(node), node)
    stream: Iterator[Row | str] = placed(node_events(events), carried)  # (lazy: the compiled node reads them itself)
    engines: list[NodeEngine] = []

    def admit(row: Row) -> dict[str, Any]:
        rid = row.record["request_id"]
        if rid is not None and rid not in plans and row.plan is not None:
            requests[rid], plans[rid] = request_of(rid, row.plan)
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
        if ROUTER_COLUMNS and log.writes_files:  # (its records as columns, a batch at a time: the same lines)
            router_columns.route(events, node, log, unlogged)
            return
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
    if fast and role == "decode" and decode_fast.covers(configs, engine, what_if, schedule, extra,
                                                       _unmodelled(what_if.apply(configs[0][3]))):
        boot = configs[0][0]  # (compiled: replay/decode_fast.py; the stream comes back where it does not start)
        rest = decode_fast.replay_columns(events, carried, node, configs, engine, what_if, log, unlogged, confirm,
                                          disagreements, schedule, cadences.get(boot), horizons.get(boot), clocks_used,
                                          engines_used)
        if rest is None:
            return
        stream = rest

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
        ends = record["kind"] == "request" and record["event"] == "finished" and ok_status(record.get("status"))
        finishing = (rid, h.allocs) if ends and h is not None and h.allocs and rid in e.batch else None
        first = clock.steps
        starting = record["kind"] == "request" and record["event"] == "decode_started"
        joining = None
        if starting and rid in requests and finish_at is not None:
            joining = (decode_steps(requests[rid].outputs, e.config.overlap_schedule), finish_at)
        run, fits = clock.before(ts, e.remaining(), finishing, starting, joining, at)
        if not fits and finishing is not None and served is not None and rid in served:
            disagreements.append(Disagreement(rid, node, "steps_differ", steps_differ(finishing[1])))
        e.advance(run, _stamps(clock, first, ts, record["ts"]))
        clock.settle(ts, record["kind"] == "request" and record["event"] == "finished")
        e.handle(record)
        if rid is None:
            return
        if finishing is not None:
            clock.finished(rid, ts, finishing[1])
        elif starting and rid in e.batch:
            clock.started(rid, ts, joining, at, e.held[rid].allocs)
        elif starting and (rid not in requests or decode_steps(requests[rid].outputs, e.config.overlap_schedule)):
            clock.blind = True  # (it decodes on the node, not in the replay: the batch is not the node's)
            clock.forget(rid)
        elif rid not in e.batch:
            clock.forget(rid)

    def step_record(event: dict[str, Any]) -> None:
        """A decode node's step record: held to the replay's steps; where its place is exact and the
        records before it fixed the node's count, the steps up to the one it reports run first."""
        assert node_engine is not None
        e = node_engine
        clock = clock_of(e.boot)
        when = _stamps(clock, clock.steps, event["_ns"], event["ts"])
        label = named(event)
        step = clock.reported(event["steps"] or e.config.step_log_interval, event["running"], event["seq"],
                              event["_ns"], label)
        pinned = False
        if step is not None:  # (where the steps cannot reach it, none runs: the record is not followed)
            room = clock.room(e.remaining(), event["_i"])
            gap = step - clock.steps
            if 0 <= gap <= room:  # (under overlap the next step too, where a request still decodes: launched before it)
                clock.ran(e.advance(gap + 1 if e.config.overlap_schedule and gap < room else gap, when))
            pinned = clock.pinned(step, event["running"], label)
        if not pinned and event["seq"] is not None:  # its place exact: the steps its time says ran before it
            doubts = clock.ambiguous
            run, _ = clock.before(event["_ns"], e.remaining(), None, at=event["_i"])
            e.advance(run, when)
            clock.placed(exact=clock.ambiguous == doubts and clock.cadence is not None)
        e.handle(_logged(event))  # (kept as logged: evidence the replayed set carries, as its requests' events)

    def clock_of(boot: int) -> StepClock:
        clock = clocks.get(boot)
        if clock is None:
            assert node_engine is not None
            clock = clocks[boot] = StepClock(cadences.get(boot), schedule, node, horizon=horizons.pop(boot, None),
                                             overlap=node_engine.config.overlap_schedule)
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
        run, _ = clock.before(ts, e.remaining(), None)
        e.advance(run, _stamps(clock, first, ts, ts_text(ts)))
        clock.settle()
        for rid in deferred:
            forget(rid, now=True)
        deferred.clear()

    def flush(event: dict[str, Any]) -> None:
        """The node's caches flushed (SGLang's ``flush_cache``, which only an idle node does): the
        steps its running requests still take run before it; then, where the replay holds no
        request's pages, the pool and the prefix cache start afresh. Confirming, the logs are
        followed: a request the replay still holds is listed (``flush_not_idle``) and lets its pages
        go. In a what-if a node still busy there would not flush (SGLang logs "Cache not flushed"):
        nothing happens, and the record is not written."""
        assert node_engine is not None
        e = node_engine
        clock = clock_of(e.boot) if role == "decode" else None
        if clock is not None:
            first = clock.steps
            run, _ = clock.before(event["_ns"], e.remaining(), None, at=event["_i"])
            e.advance(run, _stamps(clock, first, event["_ns"], event["ts"]))
            rest = max(e.remaining(), default=0)
            if confirm and rest:  # (idle: whatever still decodes ran its steps before it)
                clock.ran(e.advance(rest, _stamps(clock, clock.steps, event["_ns"], event["ts"])))
        holding = e.holding()
        if holding and not confirm:
            return
        disagreements.extend(Disagreement(rid, node, "flush_not_idle", f"the node's caches were flushed at "
                                          f"{event['ts']} (SGLang flushes only an idle node); the replay still held "
                                          "its pages there: it lets them go") for rid in holding)
        e.flush(event["ts"])
        if clock is not None:
            for rid in holding:
                clock.forget(rid)
            clock.flushed()
        for rid in deferred:
            forget(rid, now=True)
        deferred.clear()
        e.handle(_logged(event))

    def retraction(event: dict[str, Any]) -> None:
        """The node's scheduler retracted running requests under memory pressure here (SGLang's ``KV
        cache pool is full. Retract requests.`` line, which names none of them): their pages freed,
        taken afresh later, which the replay does not model. Confirming, it is listed
        (``decode_retracted``, no request: the job makes the victims of the readers that take their
        pages from here on possible); either way the record is carried, placed among the events by
        its time as any other."""
        if confirm:
            label = named(event)
            disagreements.append(Disagreement("", node, "decode_retracted", f"boot {event['boot']}, {label}: the "
                                              "node's scheduler retracted running requests under memory pressure"))
        feed(_logged(event), event["_ns"], None, event["_i"])

    unmodelled: set[tuple[int, str]] = set()  # (boot, what the replay does not model there), listed

    def configure(boot: int, i: int) -> None:
        nonlocal node_engine
        config = what_if.apply(configs[i][3])
        if node_engine is None or boot != node_engine.boot:
            if node_engine is not None:
                end_boot(log_ns(configs[i][2]))
            log.new_boot(node)
            if node_engine is None:
                node_engine = NodeEngine(config, engine, log, requests, plans, boot=boot, served=served,
                                         disagreements=disagreements)
                engines.append(node_engine)
                if engines_used is not None:
                    engines_used.append(node_engine)
            else:
                node_engine.start_boot(boot, config)
        else:
            node_engine.config = config
        for kind, what in _unmodelled(config):
            if (boot, kind) not in unmodelled:  # (once a boot: its configs all say so, as the server's flags do)
                unmodelled.add((boot, kind))
                disagreements.append(Disagreement("", node, kind, f"boot {boot}: the config says {what}, which the "
                                                  "replay does not model: its pages here are one layout of several"))
        log.emit(config.record(configs[i][2], boot))

    for item in stream:
        if isinstance(item, str):
            forget(item)
            continue
        event = item.record
        key = (event["boot"], event.get("_seq_key", event["seq"] if event["seq"] is not None else NO_SEQ))
        while k < len(steps) and steps[k][:2] <= key:
            configure(steps[k][0], steps[k][2])
            k += 1
        if event["kind"] == "step":
            if event.get("cache") == "flushed" and node_engine is not None and event["boot"] == node_engine.boot:
                flush(event)
                continue
            if role != "decode" or node_engine is None or event["boot"] != node_engine.boot:
                continue
            if event.get("cache") == "retracted":
                retraction(event)
            elif confirm:
                step_record(event)
            else:  # (a what-if's batch is not the logged one: its records are carried, placed by time, not read)
                feed(_logged(event), event["_ns"], None, event["_i"])
            continue
        record = admit(item)
        if role == "decode" and (event["kind"], event["event"]) == ("request", "finished") and event.get("retractions"):
            disagreements.append(Disagreement(event["request_id"], node, "decode_retracted", f"its finish says the "
                                              f"node retracted it {event['retractions']:,} time(s) under memory "
                                              "pressure, which the replay does not model: its pages here from then "
                                              "on are one layout of several"))
        if node_engine is None:  # events before any config: no pool to act on
            log.emit(record)
            continue
        if event["boot"] != node_engine.boot:
            end_boot(event["_ns"])
            log.new_boot(node)
            node_engine.start_boot(event["boot"], node_engine.config)
        while pending and pending[-1]["ts"] < event["ts"]:
            unlogged_event = pending.pop()
            feed(dict(unlogged_event, boot=node_engine.boot), log_ns(unlogged_event["ts"]))
        # (a transfer end another node logged is timed by that node's clock: it places no step)
        feed(record, None if "_carried" in event else event["_ns"], event.get("_finish_i"), event.get("_i"))
    while k < len(steps):
        configure(steps[k][0], steps[k][2])
        k += 1
    while pending and node_engine is not None:
        unlogged_event = pending.pop()
        feed(dict(unlogged_event, boot=node_engine.boot), log_ns(unlogged_event["ts"]))
    if node_engine is not None and node_engine.boot in clocks:  # (records after its last event: up to its batch's end)
        clocks[node_engine.boot].settle(beyond=max(node_engine.remaining(), default=0))
    for rid in deferred:  # (the node's log ends: what it ran after its last record is in no log)
        forget(rid, now=True)
    if confirm:  # where the node's own step log and the replay's steps disagree, say so
        for boot, clock in sorted(clocks.items()):
            disagreements.extend(Disagreement("", node, "step_record_differs", step_record_differs(boot, label, d))
                                 for label, d in clock.step_disagreements)


def _stamps(clock: StepClock, first: int, ts_ns: int, ts: str) -> Callable[[int], str]:
    """The time of the ``k``-th step of a run that starts at the clock's step ``first``, as its pace
    places it, never after the event it runs before (at ``ts_ns``, written ``ts``)."""

    def when(k: int) -> str:
        at = clock.time_of(first + k)
        return ts if at is None or at > ts_ns else ts_text(at)

    return when


def _horizons(rows: Iterator[tuple[Any, ...]], configs: dict[int, NodeConfig]) -> dict[int, Horizon]:
    """Each boot's decode starts with a delivered finish after them on the node (where each comes
    in the node's order, and the steps its request takes; its rows of ``decode_horizons``):
    :class:`replay.schedule.Horizon`."""
    starts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for boot, start, finish, outputs in rows:
        config = configs.get(boot)
        overlap = config.overlap_schedule if config is not None else True
        starts[boot].append((start, finish, decode_steps(outputs, overlap)))
    return {boot: Horizon(s) for boot, s in starts.items()}


def _unmodelled(config: NodeConfig) -> list[tuple[str, str]]:
    """What a node's config says it runs that the replay does not model (each a disagreement kind,
    and what it is): on decode, a prefix cache, speculative decoding, the KV offloaded to host and a
    KV pool of another layout than the plain paged one. (A prefill node's pages of another layout
    name no victim: replay.configs.assumptions says so.)"""
    if config.role != "decode":
        return []
    out = []
    if config.caches_prefixes:
        out.append(("decode_prefix_cache", "decode keeps prompts in a prefix cache (SGLang's "
                                           "--disaggregation-decode-enable-radix-cache)"))
    if config.speculative_decoding:
        out.append(("speculative_decoding", "decode runs speculative decoding (SGLang's --speculative-algorithm: "
                                            "several KV slots a request a step, the rejected drafts freed)"))
    if config.kv_offload:
        out.append(("decode_kv_offload", "decode offloads each request's KV to host storage (SGLang's "
                                         "--disaggregation-decode-enable-offload-kvcache: a finished request's "
                                         "pages freed once the copies are done)"))
    if config.hybrid_pool:
        out.append(("decode_hybrid_pool", "decode's KV pool is not the plain paged one (SGLang's hybrid "
                                          "sliding-window pools or its unified memory pool)"))
    return out


def _cadences(rows: Iterator[tuple[Any, ...]], resolution: int, configs: dict[int, NodeConfig]
              ) -> dict[int, Cadence]:
    """Each boot's decode cadence (:class:`replay.schedule.Cadence`), fitted to the spans of the
    requests that started and finished decoding there with their output logged (the node's rows
    of ``decode_spans``), its times' ``resolution`` in ns (whole milliseconds where every one of
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
    out = record.copy()  # (a copy and a few deletions: a comprehension over every field cost twice as much)
    for mark in MARKS:
        if mark in out:
            del out[mark]
    return out

