"""An incident generator that shares no code with ``replay/``: written from
``../shared/spec/reference-engine.md`` and ``log-schema.md`` alone, so that the replay is held to
an independent reading of the model, not to itself.

It runs a prefill/decode deployment as a discrete-event simulation in global time (a heap of
timed events), keeps each node's page pool as the spec describes (page 0 reserved; free list
``1..n-1`` ascending taken from its head; freed pages to a release list, merged in and sorted when
the call's own rule says: a prompt's pages when ``tokens // page_size + 2`` exceeds the free list,
a decode step's when the running batch does; never zeroed), decodes in steps (every
:data:`STEP` while a request is decoding, each running request, in the order they joined, taking
the slot of its next token and a page where that slot starts one (its KV written there: a first slot
on a prompt page the transfer left unwritten, a placeholder's last partly filled page, writes that
page, as SGLang's decode writes the token into it); under the overlap scheduler one
step more than the tokens it outputs after the first, its finish logged half a step after its last
step), and writes the full log set: configs, the router's ``received``, each node's request and
transfer events and its ``kv`` page records.

Layouts (how a deployment logs, all valid under the schema), chosen per log set:

- ``ends``: which side logs a transfer's ``completed``: ``prefill``, ``decode``, ``both`` or
  ``none`` (no transfer end is logged: only the decode start that follows it);
- ``starts``: which side logs its ``started``: ``prefill``, ``decode``, ``both`` or ``none``;
- ``skew_ns``: each node's clock is off by up to this much (its ``ts``; never its order);
- ``restart``: a decode node restarts (a new boot, its pool afresh) once, when nothing is in
  flight on it; with ``in_flight`` too, at that moment whatever is in flight: the requests it
  held are lost with its process (it logs nothing more of them, its pages are gone with the
  boot), the router answers each 502 ``decode_restarted`` then, and each one's prefill, when it
  comes to send, logs its transfer ``failed`` (whatever the layout: it is the side that sees
  it) and frees its pages;
- ``seqless_router``: the router's records carry no ``seq``;
- ``chunks``: each request's KV goes in this many transfers (their own ids), each with its
  records, its share of the tokens and its pages landing when it completes;
- ``jitter_ns``: each decode step lasts :data:`STEP` give or take up to this much (uniformly), so
  steps drift off the clock's multiples and a request's times place its steps only roughly;
- ``ms_times``: times are logged to the millisecond (truncated), as SGLang prints them;
- ``prefix_cache``: prefill keeps each prompt's full pages in its prefix cache (reference-engine.md
  point 4; its config says so): after the forward they are cached (held for the request until its
  transfer ends), at the end only the partly filled last page is freed, and a prompt whose pages
  the free and released lists lack first has the cache free the prompts least recently touched
  (cached or ended), none of one in flight, until the shortfall is freed (0.5.21, which this
  deployment runs, evicts only that). Prompts share no prefix here: every hit is zero;
- ``step_log``: each decode node logs a ``step`` record (schema v1.1, docs/schema-v1.1.md) after it
  has processed the result of every ``step_log``-th step of its boot, with that step's rows as
  ``running``: the overlap scheduler processes a step's result once it has launched the next step
  (if any request still decodes) and logged the finishes that result brings (half a step after that
  launch); if none does, half a step after the step itself. Its config says ``step_log_interval``;
- ``flush``: every node's caches are flushed once (SGLang's ``flush_cache``, which only an idle
  node does), halfway through the requests, after a pause of two seconds in the arrivals that
  leaves every node idle: a node frees the prompts its prefix cache holds, its pool starts as at
  its start (the free list ``1..n-1`` ascending, nothing released; the pages' contents as they
  are), a decode node counts its steps from 0 again, and each logs a ``step`` record with
  ``running`` 0 and ``cache: "flushed"`` (schema v1.1);
- ``retract``: once on each decode node, at its :data:`RETRACT_AT`-th step with two requests or more decoding, the one
  that joined last is retracted (as SGLang's decode does under memory pressure): its pages freed,
  out of the batch for 20 steps, then its KV restored into pages taken afresh (allocated, written)
  and back in the batch at the next step; its finish says ``retractions: 1``, and the node logs a
  ``step`` record with ``cache: "retracted"`` where it happens (schema v1.1; not with
  ``unlogged_retraction``);
- ``capped_prompt_pages``: a decode node preallocates at most this many pages for a prompt (as
  ``bench/generate.py``'s does a quarter of its pool), the first of its prompt's pages: an over-long
  prompt's placeholder reads those, where the spec's engine would take the whole prompt's pages (and,
  the pool short, could not).
"""

from __future__ import annotations

import heapq
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EPOCH_NS = 1_789_372_800 * 10**9  # 2026-09-14T08:00:00Z
STEP = 1_000_000  # a decode step, ns (1 ms: requests decode side by side): on the clock's multiples of it
RETRACT_AT = 1500  # layout.retract: the decode step of each node (its boot's) that retracts a request first


@dataclass(frozen=True)
class Layout:
    """How the deployment logs (module docstring)."""

    ends: str = "both"
    starts: str = "prefill"
    skew_ns: int = 0
    restart: bool = False
    in_flight: bool = False
    seqless_router: bool = False
    chunks: int = 1
    jitter_ns: int = 0
    ms_times: bool = False
    prefix_cache: bool = False
    step_log: int = 0
    flush: bool = False
    retract: bool = False
    #: with ``retract``: no ``step`` record with ``cache: "retracted"`` where it happens (SGLang's
    #: scheduler prints its line on every retraction; logs filtered above its level lack it)
    unlogged_retraction: bool = False
    #: the most pages a decode node preallocates for a prompt (0: all of them)
    capped_prompt_pages: int = 0



@dataclass
class Pool:
    """A node's page pool as reference-engine.md states it."""

    pages: int
    free: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.free = list(range(1, self.pages))

    def available(self) -> int:
        return len(self.free) + len(self.released)

    def merge(self) -> None:
        self.free = sorted(self.free + self.released)
        self.released = []

    def take_prompt(self, n: int, tokens: int, page_size: int) -> list[int]:
        """A prompt's ``n`` pages for ``tokens`` tokens (one request's ``alloc_extend``)."""
        if tokens // page_size + 2 > len(self.free):
            self.merge()
        out, self.free = self.free[:n], self.free[n:]
        return out

    def take_step(self, n: int, batch: int) -> list[int]:
        """A decode step's ``n`` new pages for a running batch of ``batch`` (``alloc_decode``)."""
        if batch > len(self.free):
            self.merge()
        out, self.free = self.free[:n], self.free[n:]
        return out

    def give_back(self, pages: list[int]) -> None:
        self.released.extend(pages)


def ranges(pages: list[int]) -> str:
    """Pages as the schema's string of inclusive ranges, in the order held."""
    out: list[str] = []
    start = prev = pages[0]
    for p in pages[1:]:
        if p == prev + 1:
            prev = p
            continue
        out.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = p
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class Node:
    name: str
    role: str
    pool_pages: int
    boot: int = 0
    seq: int = 0
    pool: Pool = field(init=False)
    records: list[dict[str, Any]] = field(default_factory=list)
    skew: int = 0
    batch: list[str] = field(default_factory=list)  # decode: the running requests, in join order
    stepping: bool = False  # decode: its next step is on the clock
    next_step: int = 0  # decode, while stepping: when
    reserved: int = 0  # decode: pages its admitted requests' outputs may still take
    steps: int = 0  # decode: steps launched this boot
    to_log: int | None = None  # decode: the rows of a step whose result the next step's launch processes
    retracted: bool = False  # decode: it has retracted a request

    def __post_init__(self) -> None:
        self.pool = Pool(self.pool_pages)


def generate(out: Path, *, seed: int, requests: int = 160, layout: Layout = Layout()) -> Path:
    """Write a log set of one simulated incident to ``out`` (one file per node); ``out``."""
    rng = random.Random(seed)
    jitter = random.Random(seed + 1)  # (its own stream: the incident is the same with or without jitter)
    page_size, context = 16, 100_000
    prefill_pages, decode_pages = 4096, 9000
    limit = min(context - 1, (prefill_pages - 1) * page_size - 1) - 5  # max_req_input_len
    prefills = [Node(f"prefill-{i}", "prefill", prefill_pages) for i in range(2)]
    decodes = [Node(f"decode-{i}", "decode", decode_pages) for i in range(2)]
    router = Node("router", "router", 2)
    nodes = {n.name: n for n in (*prefills, *decodes, router)}
    for n in (*prefills, *decodes):
        n.skew = rng.randint(-layout.skew_ns, layout.skew_ns) if layout.skew_ns else 0

    def emit(node: Node, t: int, record: dict[str, Any]) -> None:
        ts = t + node.skew
        if layout.ms_times:
            ts -= (EPOCH_NS + ts) % 1_000_000
        rec = {"kind": record.pop("kind"), "ts": _iso(EPOCH_NS + ts), "node": node.name, **record}
        if node.role != "router" or not layout.seqless_router:
            rec["seq"] = node.seq
            node.seq += 1
        if node.boot:
            rec["boot"] = node.boot
        node.records.append(rec)

    def config(node: Node, t: int) -> None:
        # (its prefill frees a prompt's pages once it is sent: SGLang's --disable-radix-cache, which
        # schema v1.1's prefix_cache says; a v1 config is taken to run SGLang's default, the cache on)
        emit(node, t, {"kind": "config", "role": node.role, "engine": "sglang", "engine_version": "0.5.21",
                       "model": "glm-5.3", "context_length": context, "page_size": page_size,
                       "pool_pages": node.pool_pages,
                       **({"prefix_cache": layout.prefix_cache} if node.role == "prefill" else {}),
                       **({"step_log_interval": layout.step_log} if node.role == "decode" and layout.step_log else {})})

    # prefill, with the prefix cache: each node's cached prompts, request -> [full pages, last touched, in flight]
    cached: dict[str, dict[str, list[Any]]] = {n.name: {} for n in prefills}
    touches = [0]

    def touched(node: Node, rid: str) -> None:
        touches[0] += 1
        cached[node.name][rid][1] = touches[0]

    def make_room(node: Node, t: int, tokens: int) -> None:
        """Before a prompt of ``tokens`` tokens takes its pages (and a page more, as SGLang asks):
        the least recently touched prompts not in flight freed until the shortfall is."""
        short = tokens + page_size - node.pool.available() * page_size
        for x in sorted((x for x, c in cached[node.name].items() if not c[2]), key=lambda x: cached[node.name][x][1]):
            if short <= 0:
                break
            pages = cached[node.name].pop(x)[0]
            kv(node, t, x, "free", pages)
            node.pool.give_back(pages)
            short -= len(pages) * page_size

    def let_go(node: Node, t: int, rid: str, tokens: int) -> None:
        """A prompt's transfer is over on prefill: what the cache does not keep is freed."""
        pages = held.pop((node.name, rid))
        kept = tokens // page_size if (node.name, rid) in inserted else 0  # (inserted: with the cache only)
        if pages[kept:]:
            kv(node, t, rid, "free", pages[kept:])
            node.pool.give_back(pages[kept:])
        if rid in cached[node.name]:
            touched(node, rid)
            cached[node.name][rid][2] = False

    inserted: set[tuple[str, str]] = set()

    for n in (*prefills, *decodes):
        config(n, 0)
    # (time, phase, order, ...): at one time, a decode step (phase 1) after the other events
    heap: list[tuple[int, int, int, str, str, dict[str, Any]]] = []
    order = 0

    def at(t: int, what: str, rid: str, phase: int = 0, **data: Any) -> None:
        nonlocal order
        heapq.heappush(heap, (t, phase, order, what, rid, data))
        order += 1

    t = 1_000_000
    info: dict[str, dict[str, Any]] = {}
    restart_at = requests // 2 if layout.restart else -1
    for i in range(requests):
        t += rng.randint(2, 40) * 1_000_000
        if layout.flush and i == requests // 2:
            t += 2_000_000_000
            at(t - 1_000_000, "flush", "")
        over = rng.random() < 0.08
        prompt = rng.randint(limit + 1, context - 1) if over else rng.randint(20, 3000)
        rid = f"req-{seed}-{i:05d}"
        info[rid] = {"prompt": prompt, "max_new": rng.randint(1, 300), "tenant": f"t{rng.randint(0, 5)}",
                     "prefill": prefills[rng.randrange(2)], "decode": decodes[rng.randrange(2)], "over": over,
                     "restart": i == restart_at}
        at(t, "arrive", rid)
    in_flight: dict[str, set[str]] = {n.name: set() for n in decodes}
    held: dict[tuple[str, str], list[int]] = {}
    lost: set[str] = set()  # requests whose decode node restarted under them

    def kv(node: Node, t: int, rid: str, op: str, pages: list[int], source: str | None = None) -> None:
        record: dict[str, Any] = {"kind": "kv", "request_id": rid, "op": op, "pages": ranges(pages)}
        if source:
            record["source"] = source
        emit(node, t, record)

    def request(node: Node, t: int, rid: str, event: str, **extra: Any) -> None:
        emit(node, t, {"kind": "request", "request_id": rid, "event": event, **extra})

    def transfer(node: Node, t: int, rid: str, event: str, r: dict[str, Any], tokens: int, chunk: int = 0) -> None:
        tid = f"x-{rid}" if layout.chunks == 1 else f"x-{rid}-{chunk}"
        emit(node, t, {"kind": "transfer", "transfer_id": tid, "request_id": rid, "event": event,
                       "src_node": r["prefill"].name, "dst_node": r["decode"].name, "tokens": tokens})

    def shares(tokens: int) -> list[tuple[int, int]]:
        """Each chunk's (first token, tokens): the KV split as evenly as pages allow."""
        pages = ceil_div(tokens, page_size)
        n = max(1, min(layout.chunks, pages))
        bounds = [round(pages * k / n) * page_size for k in range(n + 1)]
        return [(a, min(tokens, b) - a) for a, b in zip(bounds, bounds[1:], strict=False) if min(tokens, b) > a]

    decoding: dict[tuple[str, str], list[int]] = {}  # (decode node, request): [slots held, steps left]
    retracted: set[str] = set()  # requests a decode node retracted (layout.retract)

    def prompt_pages(r: dict[str, Any]) -> int:
        """The pages decode preallocates for ``r``'s prompt."""
        need = ceil_div(r["prompt"], page_size)
        return min(need, layout.capped_prompt_pages) if layout.capped_prompt_pages else need

    def output_pages(r: dict[str, Any]) -> int:
        return ceil_div(r["prompt"] + r["max_new"] + 1, page_size) - ceil_div(r["prompt"], page_size)

    def end_decoding(d: Node, rid: str) -> None:
        if rid in d.batch:
            d.batch.remove(rid)
        decoding.pop((d.name, rid), None)

    while heap:
        t, _, _, what, rid, data = heapq.heappop(heap)
        if what == "flush":  # every node idle (the pause before it): its caches emptied, its pool afresh
            for n in (*prefills, *decodes):
                assert not n.stepping and not any(node == n.name for node, _ in held), "a flush needs an idle node"
                for x in sorted(cached.get(n.name, {}), key=lambda x: cached[n.name][x][1]):
                    kv(n, t, x, "free", cached[n.name].pop(x)[0])
                n.pool = Pool(n.pool_pages)
                n.steps, n.to_log = 0, None
                emit(n, t, {"kind": "step", "running": 0, "cache": "flushed"})
            continue
        if what == "steplog":  # rid: the decode node; its step record, unless it restarted since
            if nodes[rid].boot == data["boot"]:
                emit(nodes[rid], t, {"kind": "step", "running": data["running"]})
            continue
        if what == "step":  # rid: the decode node
            d = nodes[rid]
            running = [x for x in d.batch if decoding[(d.name, x)][1] > 0]
            if layout.retract and not d.retracted and d.steps == RETRACT_AT - 1 and len(running) >= 2:
                x = running.pop()  # (the last to join: out of the batch, its pages freed, restored later)
                d.retracted = True
                retracted.add(x)
                if not layout.unlogged_retraction:  # (the scheduler's line, which names no request)
                    emit(d, t, {"kind": "step", "cache": "retracted"})
                pages = held.pop((d.name, x))
                kv(d, t, x, "free", pages)
                d.pool.give_back(pages)
                d.batch.remove(x)
                at(t + 20 * STEP, "restore", x)
            d.steps += 1
            if d.to_log is not None:  # this launch comes before the result of the step to log is processed
                at(t + STEP // 2, "steplog", d.name, phase=1, boot=d.boot, running=d.to_log)
                d.to_log = None
            if layout.step_log and d.steps % layout.step_log == 0:
                d.to_log = len(running)
            for x in running:  # a step writes its token's KV into its slot: a first slot on a prompt
                slots = decoding[(d.name, x)][0]  # page the transfer left unwritten writes that page
                sent = 1 if info[x]["over"] else info[x]["prompt"]
                if slots == info[x]["prompt"] and slots % page_size and slots // page_size >= ceil_div(sent, page_size):
                    kv(d, t, x, "write", [held[(d.name, x)][slots // page_size]], "decode")
            starting = [x for x in running if decoding[(d.name, x)][0] % page_size == 0]
            for x, page in zip(starting, d.pool.take_step(len(starting), len(running)), strict=True):
                held[(d.name, x)].append(page)
                for op in ("alloc", "write", "read"):
                    kv(d, t, x, op, [page], "decode" if op == "write" else None)
            for x in running:
                decoding[(d.name, x)][0] += 1
                decoding[(d.name, x)][1] -= 1
                if not decoding[(d.name, x)][1]:  # its last step: it finishes half a step on
                    at(t + STEP // 2, "finish", x)
            if any(decoding[(d.name, x)][1] > 0 for x in d.batch):
                wobble = jitter.randint(-layout.jitter_ns, layout.jitter_ns) if layout.jitter_ns else 0
                d.next_step = t + STEP + wobble
                at(d.next_step, "step", d.name, phase=1)
            else:
                d.stepping = False
                if d.to_log is not None:  # no step follows: its result is processed after it
                    at(t + STEP // 2, "steplog", d.name, phase=1, boot=d.boot, running=d.to_log)
                    d.to_log = None
            continue
        r = info[rid]
        p, d = r["prefill"], r["decode"]
        kv_tokens = 1 if r["over"] else r["prompt"]
        if rid in lost and what in ("admit", "decode", "join", "finish"):
            continue  # (its decode process is gone: nothing more of it there)
        if what == "restart" or (what == "arrive" and r["restart"] and not layout.in_flight
                                 and not in_flight[d.name]):
            for x in sorted(in_flight[d.name]):
                request(router, t, x, "finished", status=502, finish_reason="decode_restarted", output_tokens=0)
                held.pop((d.name, x), None)
                end_decoding(d, x)
                lost.add(x)
            in_flight[d.name].clear()
            d.reserved = 0
            d.boot += 1
            d.seq = 0
            d.steps, d.to_log = 0, None
            d.pool = Pool(d.pool_pages)
            config(d, t)
            if what == "restart":
                continue
        if what == "arrive":
            request(router, t, rid, "received", tenant_id=r["tenant"], prompt_tokens=r["prompt"],
                    max_new_tokens=r["max_new"], prefill_node=p.name, decode_node=d.name)
            need = prompt_pages(r)
            # decode cannot preallocate with room for every admitted request's output: it rejects
            if need + output_pages(r) + d.reserved > d.pool.available():
                request(d, t, rid, "rejected", reason="kv_pool_exhausted")
                request(d, t, rid, "finished", status=503, finish_reason="kv_pool_exhausted", output_tokens=0)
                continue
            d.reserved += output_pages(r)
            in_flight[d.name].add(rid)
            at(t + 1000, "admit", rid)  # (what a node logs, it does at that time: its pages then)
            if r["restart"] and layout.in_flight:  # while it is being prefilled
                at(t + 30_000, "restart", rid)
        elif what == "admit":
            request(d, t, rid, "admitted")
            held[(d.name, rid)] = d.pool.take_prompt(prompt_pages(r), r["prompt"], page_size)
            kv(d, t, rid, "alloc", held[(d.name, rid)])
            at(t + 1000, "prefill", rid)
        elif what == "prefill":
            request(p, t, rid, "prefill_started")
            if r["over"]:  # the placeholder: marked rejected, one token computed and sent
                request(p, t, rid, "rejected", reason="input_too_long", limit_tokens=limit)
            if layout.prefix_cache:
                make_room(p, t, kv_tokens)
            pages = p.pool.take_prompt(ceil_div(kv_tokens, page_size), kv_tokens, page_size)
            held[(p.name, rid)] = pages
            kv(p, t, rid, "alloc", pages)
            done = t + 50_000 + 30 * kv_tokens
            at(done, "prefilled", rid)
        elif what == "prefilled":
            request(p, t, rid, "prefill_done")
            kv(p, t, rid, "write", held[(p.name, rid)], "compute")
            if layout.prefix_cache:
                inserted.add((p.name, rid))
                if kv_tokens // page_size:
                    cached[p.name][rid] = [held[(p.name, rid)][:kv_tokens // page_size], 0, True]
                    touched(p, rid)
            for c, (_, n) in enumerate(shares(kv_tokens)):
                if layout.starts in ("prefill", "both"):
                    transfer(p, t, rid, "started", r, n, c)
                if layout.starts in ("decode", "both") and rid not in lost:
                    transfer(d, t + 100, rid, "started", r, n, c)
            at(t + 20_000 + 10 * kv_tokens, "sent", rid)
        elif what == "sent" and rid in lost:  # the decode side is gone: the transfer fails
            for c, (_, n) in enumerate(shares(kv_tokens)):
                transfer(p, t, rid, "failed", r, n, c)
            let_go(p, t, rid, kv_tokens)
        elif what == "sent":
            chunks = shares(kv_tokens)
            for c, (first, n) in enumerate(chunks):
                step = t + 300 * c
                if layout.ends in ("prefill", "both"):
                    transfer(p, step, rid, "completed", r, n, c)
                if c == len(chunks) - 1:  # the prefill side keeps its pages until the last chunk is sent
                    let_go(p, step, rid, kv_tokens)
                landed = held[(d.name, rid)][first // page_size: ceil_div(first + n, page_size)]
                if layout.ends in ("decode", "both"):
                    transfer(d, step + 200, rid, "completed", r, n, c)
                kv(d, step + 200, rid, "write", landed, "transfer")
            at(t + 5_000 + 300 * len(chunks), "decode", rid)
        elif what == "restore":  # a retracted request's KV restored into pages taken afresh, then back in the batch
            slots = decoding[(d.name, rid)][0]
            held[(d.name, rid)] = d.pool.take_prompt(ceil_div(slots, page_size), slots, page_size)
            kv(d, t, rid, "alloc", held[(d.name, rid)])
            kv(d, t, rid, "write", held[(d.name, rid)], "decode")
            at(d.next_step if d.stepping else -(-t // STEP) * STEP, "rejoin", rid)
        elif what == "rejoin":
            d.batch.append(rid)
            if not d.stepping:
                d.stepping, d.next_step = True, t
                at(t, "step", d.name, phase=1)
        elif what == "decode":  # the request joins the running batch at the node's next step
            at(d.next_step if d.stepping else -(-t // STEP) * STEP, "join", rid)
        elif what == "join":
            request(d, t, rid, "decode_started")
            kv(d, t, rid, "read", held[(d.name, rid)])
            steps = r["max_new"] if r["max_new"] > 1 else 0  # the tokens after prefill's, and one more
            if steps:
                d.batch.append(rid)
                decoding[(d.name, rid)] = [min(r["prompt"], len(held[(d.name, rid)]) * page_size), steps]
                if not d.stepping:
                    d.stepping, d.next_step = True, t
                    at(t, "step", d.name, phase=1)
            else:
                at(t + STEP // 2, "finish", rid)
        elif what == "finish":
            request(d, t, rid, "finished", status=200, finish_reason="stop", output_tokens=r["max_new"],
                    **({"retractions": 1} if rid in retracted else {}))
            pages = held.pop((d.name, rid))
            kv(d, t, rid, "free", pages)
            d.pool.give_back(pages)
            end_decoding(d, rid)
            d.reserved -= output_pages(r)
            in_flight[d.name].discard(rid)
    out.mkdir(parents=True, exist_ok=True)
    for node in nodes.values():
        (out / f"{node.name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in node.records))
    return out


def _iso(ns: int) -> str:
    import datetime as dt

    t = dt.datetime.fromtimestamp(ns // 10**9, dt.UTC).replace(microsecond=(ns % 10**9) // 1000)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def strip_pages(src: Path, out: Path) -> Path:
    """The log set without its page records: the request-level evidence a replay starts from."""
    out.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("*.jsonl")):
        kept = [line for line in f.read_text().splitlines() if json.loads(line)["kind"] != "kv"]
        (out / f.name).write_text("".join(line + "\n" for line in kept))
    return out
