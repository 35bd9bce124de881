"""The compiled core of a decode node's steps (``NodeEngine.advance``): which running request takes
a new page at which step, run over the batch's rows as arrays.

A decode step gives every running request the slot of its next token, a new page only where the
slot starts one (reference-engine.md, "The handoff" point 5). Most steps take no page; the rest
take a page for each row whose next token starts one, in batch order. Walking that in Python costs
a loop over the batch a step; here the rows are two int64 arrays (their tokens and the steps each
still has to take) changed in place, and the kernel returns where the new pages go, in the order
the pool hands them out. The pool itself stays in Python: the kernel only counts its pages.

It stops early, leaving the step to :meth:`replay.engine.NodeEngine.advance`'s own loop, where the
pool would act otherwise than hand out pages from its free list: a merge of the release list (the
allocator's rule for the call says the free list may be short), too few pages (a starved step), or
a page past the replay's bound. numba compiles it on first use (about 1 s) and caches the machine
code beside this file; its interpreted twin (:func:`forensics.compiled.interpreted`) runs the same
source as Python, for a node's first runs (``engine.KERNEL_FROM``: a small replay compiles nothing).
"""

from __future__ import annotations

import numpy as np

from forensics.compiled import jit_for

njit = jit_for(__name__)  # numba's, or nothing in the interpreted twin (forensics.compiled)

#: Why :func:`run` stopped: every step asked for ran (or no row is left to decode), or the next
#: step needs the pool to do more than hand out pages (a merge, too few pages, the bound).
DONE = 0
BLOCKED = 1


@njit(cache=True)
def run(tokens: np.ndarray, left: np.ndarray, page_size: int, steps: int, free: int, takeable: int,
        released: int, step_of: np.ndarray, row_of: np.ndarray) -> tuple[int, int, int]:
    """Run up to ``steps`` decode steps over the rows (``tokens``: each row's KV slots so far;
    ``left``: the steps it still takes; both in batch order, changed in place), with ``free``
    pages on the pool's free list, ``takeable`` of them handed out before the replay's bound, and
    ``released`` pages on its release list. Each new page's step (counted from 0) and row go to
    ``step_of`` and ``row_of`` (room for every page the steps could take). Returns the steps run,
    the new pages, and :data:`DONE` or :data:`BLOCKED`."""
    n = len(tokens)
    ran = 0
    pages = 0
    while ran < steps:
        active = 0
        least = steps - ran
        gap = steps  # steps until the first row's next token starts a page
        for i in range(n):
            if left[i] > 0:
                active += 1
                if left[i] < least:
                    least = left[i]
                if page_size > 1:
                    g = (page_size - tokens[i] % page_size) % page_size
                    if g < gap:
                        gap = g
        if active == 0:
            return ran, pages, DONE
        quiet = 0 if page_size == 1 else min(least, gap)
        if quiet > 0:  # steps where no row starts a page: alloc_decode(0, batch) merges if batch > free
            if active > free and released > 0:
                return ran, pages, BLOCKED
            for i in range(n):
                if left[i] > 0:
                    tokens[i] += quiet
                    left[i] -= quiet
            ran += quiet
            continue
        need = 0
        for i in range(n):
            if left[i] > 0 and tokens[i] % page_size == 0:
                need += 1
        # alloc_decode merges when the batch exceeds the free list; alloc (page size 1) when the pages do
        merges = (need > free) if page_size == 1 else (active > free)
        if (merges and released > 0) or need > free or need > takeable:
            return ran, pages, BLOCKED
        for i in range(n):
            if left[i] > 0:
                if tokens[i] % page_size == 0:
                    step_of[pages] = ran
                    row_of[pages] = i
                    pages += 1
                tokens[i] += 1
                left[i] -= 1
        free -= need
        takeable -= need
        ran += 1
    return ran, pages, DONE
