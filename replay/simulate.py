"""A deterministic simulation of a disaggregated deployment, written as a canonical log set.

Requests arrive at a router, which assigns a prefill and a decode node round-robin. Decode
preallocates the prompt's pages at admission; where it has too few free pages, the request waits
in its preallocation queue (first come, first served) until a finish frees enough, and a prompt
larger than the whole decode pool is refused (400), as SGLang's decode does. Each prefill node computes one prompt at a
time in arrival order and frees its pages once the transfer is sent; the transfer lands on
decode, where the request joins the running batch at the node's next step. A decode node steps
every :data:`DECODE_PER_TOKEN` on one clock (steps at ``T0 + k * DECODE_PER_TOKEN`` while a
request is decoding), each step giving every running request the slot of its next token; a
request's finish is logged half a step after its last step, and decode frees everything then.
Durations follow a fixed cost model (below), so the same arrivals and options always give the
same log, byte for byte. The page decisions are the reference engine's (:mod:`replay.engine`),
the same code a replay runs.
"""

from __future__ import annotations

import datetime as dt
import functools
import heapq
import os
import random
import shutil
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forensics.errors import BadOption, OutputExists
from replay.engine import NodeConfig, NodeEngine, Plan, Request, plan
from replay.logset import LogSet, ts_ns, ts_text
from replay.workload import Arrival, read_trace, synthetic

# Cost model, in nanoseconds.
PREFILL_FIXED = 30_000_000
PREFILL_PER_TOKEN = 5_000  # 200k tokens/s
TRANSFER_FIXED = 5_000_000
TRANSFER_PER_TOKEN = 500  # 2M tokens/s
DECODE_PER_TOKEN = 25_000_000  # a decode step: 40 tokens/s per request
DECODE_TIMEOUT = 30_000_000_000  # decode gives up on a transfer after 30 s
LATE_BY = 5_000_000_000  # a late transfer lands 5 s after that

T0 = dt.datetime(2026, 9, 14, 8, 0, tzinfo=dt.UTC)


def pool_pages(tokens: int, page_size: int) -> int:
    """Pool page ids for a pool of ``tokens`` tokens (page 0 reserved, so one more)."""
    return tokens // page_size + 1


@dataclass(frozen=True)
class Deployment:
    """The deployment simulated; the defaults are the incident's (GLM-5.3 on SGLang)."""

    engine: str = "sglang-placeholder"
    context_length: int = 1_048_576
    prefill_pool_tokens: int = 681_280
    decode_pool_tokens: int = 2_097_152
    page_size: int = 64
    prefill_nodes: int = 4
    decode_nodes: int = 4
    tenants: int = 12
    model: str = "glm-5.3"
    engine_version: str = "0.5.21"
    #: decode's overlap scheduler (SGLang's default; off: ``--disable-overlap-schedule``)
    overlap_schedule: bool = True
    #: prefill's prefix (radix) cache: on (SGLang's default), a prompt's full pages stay cached after
    #: its transfer until an allocation evicts them; off, they are freed at its end; None, not said in
    #: the configs (as a v1 log), and the engine runs SGLang's default
    prefix_cache: bool | None = True
    #: decode: steps between two ``step`` records (SGLang's ``decode_log_interval``, 40 by
    #: default); None: the decode nodes write none, as a v1 log
    step_log_interval: int | None = 40

    def configs(self) -> list[NodeConfig]:
        """Every node's config: prefill nodes, then decode nodes."""
        out = []
        for role, n, tokens in (("prefill", self.prefill_nodes, self.prefill_pool_tokens),
                                ("decode", self.decode_nodes, self.decode_pool_tokens)):
            for i in range(n):
                out.append(NodeConfig(
                    node=f"{role}-{i}", role=role, context_length=self.context_length,
                    page_size=self.page_size, pool_pages=pool_pages(tokens, self.page_size),
                    engine="sglang", engine_version=self.engine_version, model=self.model,
                    overlap_schedule=self.overlap_schedule or role != "decode",
                    prefix_cache=self.prefix_cache if role == "prefill" else None,
                    step_log_interval=self.step_log_interval if role == "decode" else None))
        return out


@dataclass
class SimResult:
    """What a simulation wrote and what happened to its requests."""

    files: list[Path]
    records: int
    requests: int
    over_long: int
    late_writes: int
    outcomes: dict[str, int] = field(default_factory=dict)
    #: requests that waited in a decode node's preallocation queue before it admitted them
    waited: int = 0
    #: decode steps that found too few free pages: SGLang would have retracted a request there,
    #: which the engine does not model (the step took no page); 0 where the run is faithful
    starved_steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The run as JSON-ready data."""
        return {
            "files": [str(f) for f in self.files], "records": self.records, "requests": self.requests,
            "over_long": self.over_long, "late_writes": self.late_writes, "outcomes": self.outcomes,
            "waited": self.waited, "starved_steps": self.starved_steps,
        }


def simulate_to(
    out: Path,
    *,
    deployment: Deployment = Deployment(),
    requests: int | None = None,
    seed: int = 0,
    trace: Path | None = None,
    length_scale: float = 1.0,
    over_long: float | None = None,
    late_writes: float = 0.0,
    rate: float = 4.0,
) -> SimResult:
    """The ``simulate`` command: a synthetic workload (or ``trace``'s arrivals) shaped and
    simulated on ``deployment`` into the new or empty folder ``out``."""
    checks = {"--page-size": deployment.page_size, "--prefill-nodes": deployment.prefill_nodes,
              "--decode-nodes": deployment.decode_nodes, "--context-length": deployment.context_length,
              "--requests": 1 if requests is None else requests}
    for name, number in checks.items():
        if number < 1:
            raise BadOption(f"{name} must be at least 1, not {number}")
    for name, tokens in (("--prefill-pool-tokens", deployment.prefill_pool_tokens),
                         ("--decode-pool-tokens", deployment.decode_pool_tokens)):
        if tokens < deployment.page_size:
            raise BadOption(f"{name} must hold at least one page ({deployment.page_size} tokens), not {tokens}")
    if length_scale <= 0 or rate <= 0:
        raise BadOption("--length-scale and --rate must be positive")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputExists(f"{out}: exists and is not an empty folder; choose another --out")
    rng = random.Random(seed)
    if trace is not None:
        arrivals = read_trace(trace, limit=requests)
        share = 0.0 if over_long is None else over_long
    else:
        arrivals = synthetic(1000 if requests is None else requests, rng, rate=rate)
        share = 0.02 if over_long is None else over_long
    for name, value in (("--over-long", share), ("--late-writes", late_writes)):
        if not 0.0 <= value <= 1.0:
            raise BadOption(f"{name} is a share between 0 and 1, not {value}")
    shaped = shape(arrivals, rng, deployment, over_long=share, length_scale=length_scale)
    return simulate(out, shaped, deployment=deployment, seed=seed, late_writes=late_writes)


def shape(arrivals: list[Arrival], rng: random.Random, deployment: Deployment, *,
          over_long: float = 0.0, length_scale: float = 1.0) -> list[Arrival]:
    """Scale prompt lengths by ``length_scale`` and make a share ``over_long`` of prompts
    longer than prefill admits (but inside the context window)."""
    limit = NodeConfig("p", "prefill", deployment.context_length, deployment.page_size,
                       pool_pages(deployment.prefill_pool_tokens, deployment.page_size)).max_req_input_len
    out = []
    for a in arrivals:
        prompt = max(1, round(a.prompt_tokens * length_scale))
        if rng.random() < over_long:
            prompt = rng.randint(limit + 1, deployment.context_length - 1)
        out.append(Arrival(a.offset_ns, prompt, a.output_tokens))
    return out


def simulate(
    out: Path,
    arrivals: list[Arrival],
    *,
    deployment: Deployment = Deployment(),
    seed: int = 0,
    late_writes: float = 0.0,
    check_invariants: bool = False,
) -> SimResult:
    """Simulate ``arrivals`` on ``deployment`` and write the full log set (page records
    included) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    # the records go to their files as they are made (a run of a million requests is 19 million
    # records), in a folder beside ``out`` that only a finished run's files leave
    writing = Path(tempfile.mkdtemp(prefix=f".{out.name}.writing-", dir=out.parent))
    try:
        return _simulate(out, writing, arrivals, deployment=deployment, seed=seed, late_writes=late_writes,
                         check_invariants=check_invariants)
    finally:
        shutil.rmtree(writing, ignore_errors=True)


def _simulate(out: Path, writing: Path, arrivals: list[Arrival], *, deployment: Deployment, seed: int,
              late_writes: float, check_invariants: bool) -> SimResult:
    rng = random.Random(seed)
    log = LogSet(into=writing)
    t0 = ts_ns(T0)
    configs = deployment.configs()
    prefill_cfgs = [c for c in configs if c.role == "prefill"]
    decode_cfgs = [c for c in configs if c.role == "decode"]
    tenants = [f"tenant-{i:02d}" for i in range(deployment.tenants)]
    weights = [1 / (i + 1) for i in range(len(tenants))]

    requests: dict[str, Request] = {}
    plans: dict[str, Plan] = {}
    arrival_of: dict[str, int] = {}
    late: set[str] = set()
    for i, a in enumerate(sorted(arrivals, key=lambda a: a.offset_ns)):
        rid = f"req-{seed}-{i:06d}"
        pre, dec = prefill_cfgs[i % len(prefill_cfgs)], decode_cfgs[i % len(decode_cfgs)]
        requests[rid] = Request(rid, rng.choices(tenants, weights)[0], a.prompt_tokens,
                                a.output_tokens, pre.node, dec.node)
        plans[rid] = plan(requests[rid], deployment.engine, pre)
        arrival_of[rid] = t0 + a.offset_ns
        if late_writes and rng.random() < late_writes:
            late.add(rid)

    router_cfg = NodeConfig("router", "router", deployment.context_length, deployment.page_size, 2)
    engines: dict[str, NodeEngine] = {
        c.node: NodeEngine(c, deployment.engine, log, requests, plans, check_invariants)
        for c in (router_cfg, *configs)
    }
    for c in configs:
        log.emit(c.record(ts_text(t0)))

    queue: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
    order = 0
    next_step: dict[str, int] = {}  # decode nodes with a request decoding: the time of their next step

    def at(t: int, fn: Callable[..., None], *args: Any) -> None:
        nonlocal order
        heapq.heappush(queue, (t, order, fn, args))
        order += 1

    stepping = {c.node: _Stepping(c.step_log_interval, c.overlap_schedule) for c in decode_cfgs}

    def catch_up(node: str, t: int) -> None:
        """The decode steps of ``node`` launched before ``t`` (at one time, an event comes before
        the step, as an iteration of SGLang's decode loop takes landed requests in before it steps),
        with the ``step`` records due before ``t`` among them (:class:`_Stepping`)."""
        s = stepping.get(node)
        first = next_step.get(node)
        if first is not None and first < t:
            engine = engines[node]
            due = -(-(t - first) // DECODE_PER_TOKEN)
            launched = 0
            while launched < due:
                at_ns = first + launched * DECODE_PER_TOKEN  # (the next step's launch)
                chunk = due - launched if s is None else s.chunk(engine, at_ns, due - launched)
                if not chunk:  # a step record is due before the next step
                    assert s is not None
                    s.write(engine, at_ns + 1)
                    continue
                ran = engine.advance(chunk, functools.partial(_step_time, at_ns))
                launched += ran
                if s is not None:
                    s.ran(ran, at_ns)
                if ran < chunk:
                    del next_step[node]  # nothing decoding: no step until a request joins
                    break
            else:
                next_step[node] = first + due * DECODE_PER_TOKEN
        if s is not None:
            s.write(engines[node], t)

    waiting: dict[str, deque[str]] = {c.node: deque() for c in prefill_cfgs}
    #: decode's preallocation queue: requests waiting for pages, in arrival order
    preallocating: dict[str, deque[str]] = {c.node: deque() for c in decode_cfgs}
    admitted_at: dict[str, int] = {}
    waited: set[str] = set()
    busy: dict[str, bool] = {c.node: False for c in prefill_cfgs}
    finished = {"delivered": 0}

    def done(rid: str, node: str) -> None:
        """No event of ``rid`` is left to come on ``node``: the engine lets go of what it kept of it
        (its pages stay where they are), so that the simulator's memory follows the requests in
        flight, not all it has seen."""
        engines[node].forget(rid)

    def event(rid: str, node: str, t: int, name: str, **extra: Any) -> bool:
        catch_up(node, t)
        return engines[node].handle({"kind": "request", "ts": ts_text(t), "node": node,
                                     "request_id": rid, "event": name, **extra})

    def transfer(rid: str, node: str, t: int, name: str) -> bool:
        r = requests[rid]
        catch_up(node, t)
        return engines[node].handle({
            "kind": "transfer", "ts": ts_text(t), "node": node, "transfer_id": f"xfer-{rid}",
            "request_id": rid, "event": name, "src_node": r.prefill_node, "dst_node": r.decode_node,
            "tokens": plans[rid].kv_tokens})

    def arrive(t: int, rid: str) -> None:
        r = requests[rid]
        assert r.prefill_node is not None and r.decode_node is not None
        if not event(rid, "router", t, "received", tenant_id=r.tenant_id, prompt_tokens=r.prompt_tokens,
                     max_new_tokens=r.max_new_tokens, prefill_node=r.prefill_node,
                     decode_node=r.decode_node):
            return
        if plans[rid].prefill_rejects:
            event(rid, r.prefill_node, t, "rejected")
            done(rid, r.prefill_node)
            return
        queue = preallocating[r.decode_node]
        catch_up(r.decode_node, t)
        fits = engines[r.decode_node].preallocation(rid)
        if fits == "wait" or (queue and fits == "take"):
            queue.append(rid)  # decode has too few free pages: it waits, behind any waiting before it
            waited.add(rid)
            return
        admit(t, rid)  # (a prompt larger than the whole pool is refused as it comes)

    def admit(t: int, rid: str) -> None:
        """Decode preallocates the prompt's pages (or refuses a prompt larger than its pool); the
        prompt joins its prefill node's queue."""
        r = requests[rid]
        assert r.prefill_node is not None and r.decode_node is not None
        admitted_at[rid] = t
        if not event(rid, r.decode_node, t, "admitted"):
            done(rid, r.decode_node)
            return
        if rid in late:
            at(t + DECODE_TIMEOUT, time_out, rid)
        waiting[r.prefill_node].append(rid)
        if not busy[r.prefill_node]:
            busy[r.prefill_node] = True
            at(t, prefill_start, r.prefill_node)

    def preallocate(node: str, t: int) -> None:
        """Pages were freed on the decode node ``node``: admit the requests waiting there, first come
        first served, while the first one's prompt fits (SGLang's ``pop_preallocated`` stops at the
        first that does not)."""
        queue = preallocating[node]
        while queue and engines[node].preallocation(queue[0]) != "wait":
            admit(t, queue.popleft())

    def prefill_start(t: int, node: str) -> None:
        rid = waiting[node].popleft()
        event(rid, node, t, "prefill_started")
        at(t + PREFILL_FIXED + PREFILL_PER_TOKEN * plans[rid].kv_tokens, prefill_done, rid)

    def prefill_done(t: int, rid: str) -> None:
        r = requests[rid]
        assert r.prefill_node is not None
        event(rid, r.prefill_node, t, "prefill_done")
        transfer(rid, r.prefill_node, t, "started")
        sent = t + TRANSFER_FIXED + TRANSFER_PER_TOKEN * plans[rid].kv_tokens
        at(sent, send, rid)
        at(max(sent, admitted_at[rid] + DECODE_TIMEOUT + LATE_BY) if rid in late else sent, land, rid)

    def send(t: int, rid: str) -> None:
        """Prefill has sent its last chunk: it frees its pages and takes the next prompt."""
        node = requests[rid].prefill_node
        assert node is not None
        transfer(rid, node, t, "completed")
        done(rid, node)
        if waiting[node]:
            at(t, prefill_start, node)
        else:
            busy[node] = False

    def time_out(t: int, rid: str) -> None:
        node = requests[rid].decode_node
        assert node is not None
        catch_up(node, t)
        engines[node].time_out(ts_text(t), rid)
        preallocate(node, t)

    def land(t: int, rid: str) -> None:
        r = requests[rid]
        assert r.decode_node is not None
        if transfer(rid, r.decode_node, t, "completed"):
            at(t0 + -(-(t - t0) // DECODE_PER_TOKEN) * DECODE_PER_TOKEN, decode_start, rid)  # the next step
        else:  # (ended: timed out before it landed, or failed)
            done(rid, r.decode_node)
        preallocate(r.decode_node, t)  # (page tags may have failed readers of what landed)

    def decode_start(t: int, rid: str) -> None:
        node = requests[rid].decode_node
        assert node is not None
        if event(rid, node, t, "decode_started"):
            steps = engines[node].held[rid].allocs
            if steps and node not in next_step:
                next_step[node] = t  # its first step is launched now
            at(t + DECODE_PER_TOKEN * max(steps - 1, 0) + DECODE_PER_TOKEN // 2, finish, rid)
        else:  # an integrity check failed it: its pages are free
            done(rid, node)
            preallocate(node, t)

    def finish(t: int, rid: str) -> None:
        node = requests[rid].decode_node
        assert node is not None
        held = engines[node].held.get(rid)
        if held is not None and held.ended:  # the engine failed it already (page tags)
            done(rid, node)
            return
        event(rid, node, t, "finished", status=200, finish_reason="stop",
              output_tokens=requests[rid].max_new_tokens)
        done(rid, node)
        finished["delivered"] += 1
        preallocate(node, t)

    for rid, t in arrival_of.items():
        at(t, arrive, rid)
    while queue:
        t, _, fn, args = heapq.heappop(queue)
        fn(t, *args)
    for node, s in stepping.items():  # (the step records due after the node's last event)
        s.write(engines[node])

    files = []
    for written in log.write(writing):
        files.append(out / written.name)
        os.replace(written, files[-1])
    by_router = sum(p.router_rejects for p in plans.values())
    by_prefill = sum(p.prefill_rejects for p in plans.values())
    return SimResult(
        files=files, records=log.records, requests=len(requests),
        over_long=sum(p.over_long for p in plans.values()), late_writes=len(late),
        outcomes={"delivered": finished["delivered"], "rejected_by_router": by_router,
                  "rejected_by_prefill": by_prefill,
                  "failed_on_decode": len(requests) - finished["delivered"] - by_router - by_prefill},
        waited=len(waited), starved_steps=sum(e.starved_steps for e in engines.values()),
    )


def _step_time(first_ns: int, k: int) -> str:
    """The time of the k-th of decode steps launched from ``first_ns``."""
    return ts_text(first_ns + k * DECODE_PER_TOKEN)


#: When a decode node's ``step`` record comes after the launch of the step it reports: after that
#: step's finishes (half a step after its launch) and, under the overlap scheduler, after the next
#: step's launch and finishes too (SGLang reports step P when it processes P's result, which the
#: overlap scheduler does after it has launched step P + 1), before the step after that.
STEP_RECORD_AFTER = DECODE_PER_TOKEN * 4 // 5


@dataclass
class _Stepping:
    """A decode node's ``step`` records, as SGLang's scheduler prints its ``Decode batch`` line
    (docs/schema-v1.1.md): after the result of every ``interval``-th decode step is processed, the
    rows of that step as ``running``. The node's steps are counted from its start (the simulator
    runs no warmup)."""

    interval: int | None
    overlap: bool
    count: int = 0  # steps launched
    rows: int = 0  # the rows of the step to report, read as it is launched
    #: the records due, in order: each its time and running batch
    pending: deque[tuple[int, int]] = field(default_factory=deque)

    def chunk(self, engine: NodeEngine, at_ns: int, due: int) -> int:
        """How many of ``due`` steps (the first launched at ``at_ns``) run before the next record
        due or the next step to report (0: a record due comes first)."""
        if self.interval is None:
            return due
        if self.pending:
            before = -(-(self.pending[0][0] - at_ns) // DECODE_PER_TOKEN)  # steps launched before it
            if before <= 0:
                return 0
            due = min(due, before)
        to_report = self.interval - self.count % self.interval  # (the step to report is the to_report-th)
        if to_report == 1:
            self.rows = len(engine.decoding())
            return 1
        return min(due, to_report - 1)

    def ran(self, steps: int, at_ns: int) -> None:
        """``steps`` steps ran from ``at_ns``: where the last is one to report, its record is due."""
        if self.interval is None or not steps:
            return
        self.count += steps
        if self.count % self.interval == 0:
            launched = at_ns + (steps - 1) * DECODE_PER_TOKEN
            self.pending.append((launched + (DECODE_PER_TOKEN if self.overlap else 0) + STEP_RECORD_AFTER, self.rows))

    def write(self, engine: NodeEngine, before: int | None = None) -> None:
        """The records due (before ``before``, where given), written."""
        while self.pending and (before is None or self.pending[0][0] < before):
            at, rows = self.pending.popleft()
            engine.step_record(ts_text(at), rows)
