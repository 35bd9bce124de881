"""A decode node step by step, as SGLang's disaggregated decode loop takes its pages.

The reference engine's decode side at the level of iterations (reference-engine.md, "The
handoff" points 1, 5 and 6): a request is preallocated its prompt's pages when the pool can
hold it (first come, first served, the queue's head blocking the rest), its transfer lands some
iterations later, and from then on it is in the running batch, which keeps its requests in the
order they joined. Every iteration each running request gets the KV slot of its next token, in
batch order (``alloc_decode``; at page size 1 one ``alloc`` for the batch), so the output pages
of requests decoding together interleave. Under the overlap scheduler (SGLang's default on
decode) a request's last step is followed by one more allocation before its row is freed.

The loop is the contract that scripts/make_sglang_allocator_fixtures.py drives SGLang's own
allocator with; tests/replay/test_allocator_fixtures.py holds this module to what that code did.
Admission is this loop's own rule, not SGLang's token budget (``_allocatable_token_budgets`` in
disaggregation/decode.py, which reserves decode headroom per running request): a request is
preallocated when the pages of every admitted, unfinished request at its final size fit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from replay.pool import PagePool, Pages, pages_for


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
    """One request's KV row on the node: its pages in row order and the tokens they hold."""

    arrival: Arrival
    pages: list[Pages] = field(default_factory=list)
    tokens: int = 0
    produced: int = 0  # output tokens so far (the first came from prefill)
    prealloc_iter: int | None = None  # None: aborted (larger than the pool)
    join_iter: int | None = None  # None: finished at landing, never in the batch
    free_iter: int | None = None

    def page_ids(self) -> Pages:
        """The row's pages in order."""
        return np.concatenate(self.pages) if self.pages else np.empty(0, np.int64)

    def slots(self, page_size: int) -> Pages:
        """The row's token slots in order (page * page_size + offset)."""
        pages = self.page_ids()
        pos = np.arange(self.tokens, dtype=np.int64)
        return pages[pos // page_size] * page_size + pos % page_size


@dataclass
class DecodeLoop:
    """One decode pool (a server, or one DP rank's pool) run iteration by iteration."""

    pool_pages: int
    page_size: int
    overlap: bool = True
    pool: PagePool = field(init=False)
    rows: dict[str, Row] = field(init=False, default_factory=dict)
    aborted: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.pool = PagePool(self.pool_pages)

    def _alloc(self, n: int) -> Pages | None:
        """SGLang's ``alloc``: merge when the free list is short, None when still short."""
        if n > self.pool.available:
            self.pool.merge_and_sort_free()
            return None
        return self.pool.alloc(n)

    def _preallocate(self, row: Row) -> bool:
        prompt = row.arrival.prompt_tokens
        if self.page_size == 1:
            got = self._alloc(prompt)
        else:
            extend = self.pool.alloc_extend([pages_for(prompt, self.page_size)], prompt, self.page_size)
            got = None if extend is None else extend[0]
        if got is None:
            return False
        row.pages.append(got)
        row.tokens = prompt
        return True

    def _final_pages(self, arrival: Arrival) -> int:
        """What admission counts a request for until it is freed: its prompt, its output and one
        slot more, in pages (a bound on what it holds at its end, overlap or not)."""
        return pages_for(arrival.prompt_tokens + arrival.output_tokens + 1, self.page_size)

    def _step(self, batch: list[Row]) -> None:
        """One decode step: the next token's slot for each running request, in batch order."""
        ps = self.page_size
        if ps == 1:
            got = self._alloc(len(batch))
            assert got is not None, "the decode step found no free slot (the admission rule keeps room)"
            for row, slot in zip(batch, got, strict=True):
                row.pages.append(slot[None])
                row.tokens += 1
            return
        starts = [row.tokens % ps == 0 for row in batch]
        new = self.pool.alloc_decode(sum(starts), len(batch))
        assert new is not None, "the decode step found no free page (the admission rule keeps room)"
        taken = 0
        for row, start in zip(batch, starts, strict=True):
            if start:
                row.pages.append(new[taken:taken + 1])
                taken += 1
            row.tokens += 1

    def _free(self, rows: Iterable[Row], it: int) -> None:
        """Free whole rows (one free group: their pages reach the release list together)."""
        for row in rows:
            row.free_iter = it
            pages = np.unique(row.page_ids())
            self.pool.release(pages)

    def run(self, arrivals: Iterable[Arrival]) -> dict[str, Row]:
        """Run the node until every request has left it; each request's row, by id."""
        pending = sorted(arrivals, key=lambda a: a.arrive_iter)
        nxt = 0
        queue: deque[Row] = deque()
        landing: dict[int, list[Row]] = {}
        batch: list[Row] = []
        finishing: list[Row] = []  # overlap: done at the previous step, freed after this one
        committed = 0  # pages of admitted, unfinished requests at their final size
        it = 0
        while nxt < len(pending) or queue or landing or batch:
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
                if committed + final > self.pool_pages - 1 or not self._preallocate(head):
                    break
                queue.popleft()
                committed += final
                head.prealloc_iter = it
                landing.setdefault(it + head.arrival.transfer_iters, []).append(head)
            for row in landing.pop(it, []):
                row.produced = 1
                if row.arrival.output_tokens == 1:
                    self._free([row], it)
                    committed -= self._final_pages(row.arrival)
                else:
                    row.join_iter = it
                    batch.append(row)
            if batch:
                self._step(batch)
                done_now = []
                already = {id(r) for r in finishing}
                for row in batch:
                    if id(row) not in already:
                        row.produced += 1
                        if row.produced == row.arrival.output_tokens:
                            done_now.append(row)
                leaving = finishing if self.overlap else done_now
                self._free(leaving, it)
                for row in leaving:
                    committed -= self._final_pages(row.arrival)
                gone = {id(r) for r in leaving}
                batch = [r for r in batch if id(r) not in gone]
                finishing = done_now if self.overlap else []
            it += 1
        return self.rows
