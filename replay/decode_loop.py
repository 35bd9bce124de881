"""A decode node driven iteration by iteration, as SGLang's disaggregated decode loop runs it.

The reference engine's decode side (:class:`replay.engine.NodeEngine`) fed a scripted stream the
way SGLang's scheduler iterates (reference-engine.md, "The handoff" points 1, 5 and 6): each
iteration the arrivals join the preallocation queue, the queue's head is preallocated when the pool
can hold it (first come, first served, the head blocking the rest), the requests whose transfer
lands join the running batch at its end (one that outputs a single token finishes as it lands), one
step gives every running request the slot of its next token, and the requests done with their
steps are freed. The engine's own steps (``advance``) and page calls do the work: this module only
times them.

It is the contract that scripts/make_sglang_allocator_fixtures.py drives SGLang's own allocator
with; tests/replay/test_allocator_fixtures.py holds the engine, through it, to what that code did.
Admission is this loop's own rule, not SGLang's token budget (``_allocatable_token_budgets`` in
disaggregation/decode.py, which reserves decode headroom per running request): a request is
preallocated when the pages of every admitted, unfinished request at its final size fit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replay.engine import NodeConfig, NodeEngine, Plan, Request
from replay.logset import LogSet, ts_text
from replay.pool import Pages, pages_for

#: The loop's iterations, a millisecond apart from here (the records need a time).
_T0 = 1_789_372_800 * 10**9
_ITER = 1_000_000


@dataclass(frozen=True)
class Arrival:
    """A request as a decode node meets it: its prompt and output lengths in tokens, the
    iteration it asks for preallocation, and how many iterations its transfer takes."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    arrive_iter: int
    transfer_iters: int


@dataclass
class Row:
    """One request on the node: when it was preallocated, joined and freed, and its KV row."""

    arrival: Arrival
    prealloc_iter: int | None = None  # None: aborted (larger than the pool)
    join_iter: int | None = None  # None: finished at landing, never in the batch
    free_iter: int | None = None
    pages: Pages = field(default_factory=lambda: np.empty(0, np.int64))
    tokens: int = 0

    def slots(self, page_size: int) -> Pages:
        """The row's token slots in order (page * page_size + offset)."""
        pos = np.arange(self.tokens, dtype=np.int64)
        return self.pages[pos // page_size] * page_size + pos % page_size


@dataclass
class DecodeLoop:
    """One decode pool (a server, or one DP rank's pool) run iteration by iteration."""

    pool_pages: int
    page_size: int
    overlap: bool = True
    rows: dict[str, Row] = field(init=False, default_factory=dict)
    aborted: list[str] = field(init=False, default_factory=list)
    engine: NodeEngine = field(init=False)

    def __post_init__(self) -> None:
        config = NodeConfig("decode", "decode", 1 << 40, self.page_size, self.pool_pages,
                            overlap_schedule=self.overlap)
        self.engine = NodeEngine(config, "sglang-placeholder", LogSet(), {}, {})

    def _event(self, it: int, rid: str, event: str, **extra: Any) -> None:
        self.engine.handle({"kind": "request", "ts": ts_text(_T0 + it * _ITER), "request_id": rid,
                            "event": event, **extra})

    def _final_pages(self, arrival: Arrival) -> int:
        """What admission counts a request for until it is freed: its prompt, its output and one
        slot more, in pages (a bound on what it holds at its end, overlap or not)."""
        return pages_for(arrival.prompt_tokens + arrival.output_tokens + 1, self.page_size)

    def _admit(self, arrival: Arrival) -> None:
        rid = arrival.request_id
        self.engine.requests[rid] = Request(rid, "tenant", arrival.prompt_tokens, arrival.output_tokens,
                                            "prefill", "decode", arrival.output_tokens)
        self.engine.plans[rid] = Plan(False, False, False, arrival.prompt_tokens, 1 << 40, 1 << 40)

    def _free(self, row: Row, it: int) -> None:
        rid = row.arrival.request_id
        h = self.engine.held[rid]
        row.pages = np.concatenate(h.pages())
        row.tokens = h.tokens
        row.free_iter = it
        self._event(it, rid, "finished", status=200, output_tokens=row.arrival.output_tokens)

    def run(self, arrivals: Iterable[Arrival]) -> dict[str, Row]:
        """Run the node until every request has left it; each request's row, by id."""
        pending = sorted(arrivals, key=lambda a: a.arrive_iter)
        nxt = 0
        queue: deque[Row] = deque()
        landing: dict[int, list[Row]] = {}
        running: list[Row] = []
        committed = 0  # pages of admitted, unfinished requests at their final size
        it = 0
        while nxt < len(pending) or queue or landing or running:
            while nxt < len(pending) and pending[nxt].arrive_iter <= it:
                row = Row(pending[nxt])
                self.rows[row.arrival.request_id] = row
                queue.append(row)
                nxt += 1
            while queue:
                head = queue[0]
                if pages_for(head.arrival.prompt_tokens, self.page_size) > self.pool_pages - 1:
                    queue.popleft()
                    self.aborted.append(head.arrival.request_id)
                    continue
                final = self._final_pages(head.arrival)
                if committed + final > self.pool_pages - 1:
                    break
                queue.popleft()
                committed += final
                head.prealloc_iter = it
                self._admit(head.arrival)
                self._event(it, head.arrival.request_id, "admitted")
                landing.setdefault(it + head.arrival.transfer_iters, []).append(head)
            for row in landing.pop(it, []):
                self._event(it, row.arrival.request_id, "decode_started")
                if self.engine.held[row.arrival.request_id].allocs:
                    row.join_iter = it
                    running.append(row)
                else:  # a single token: it finishes as it lands
                    self._free(row, it)
                    committed -= self._final_pages(row.arrival)
            self.engine.advance(1, ts_text(_T0 + it * _ITER))
            for row in [r for r in running if self.engine.held[r.arrival.request_id].allocs_left == 0]:
                self._free(row, it)
                committed -= self._final_pages(row.arrival)
                running.remove(row)
            it += 1
        return self.rows
