"""A node's KV page pool with SGLang's disaggregated allocator policy (reference-engine.md).

Page 0 is reserved. The free list starts as ``1 .. pool_pages-1`` ascending; an allocation
takes pages from its head. Freed pages go to a separate release list, which is merged into
the free list and sorted ascending (``merge_and_sort_free``) when a call's own rule says the
free list may be short. The rule depends on the call, as in SGLang's ``mem_cache/allocator``
(held to that code, run from released wheels, by tests/replay/allocator/):

- :meth:`PagePool.alloc` (``alloc``; the token allocator's every call at page size 1): merge
  when the pages asked for are more than the free list holds;
- :meth:`PagePool.alloc_extend` (a prefill batch; decode's preallocation at page size > 1):
  merge when ``extend_tokens // page_size + batch + 1`` is more than the free list holds;
- :meth:`PagePool.alloc_decode` (one decode step at page size > 1): merge when the batch is
  larger than the free list.

Pages are numpy arrays in allocation order: a request's pages stay in the order it got them.

Memory follows the pages the replay has touched, not the pool's size (a config may say 2^40
pages): the pages never allocated yet are the free list's tail, ``fresh .. pool_pages-1``
ascending, kept as that range. Every page on the release list or on the free list's head was
allocated once, so lies below ``fresh``, and a merge's sort leaves the range where it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

Pages = npt.NDArray[np.int64]


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that ``tokens`` tokens occupy."""
    return -(-tokens // page_size)


#: The replay's bound on the distinct pages a node's pool hands out in one boot (page ids up to
#: it): the pages handed out are held as arrays (8 bytes a page), so an allocation that would take
#: a page beyond it is refused with :class:`BeyondBound` instead of exhausting memory. A pool of
#: at most this many pages never reaches it; a larger one (a config may say 2^40) reaches it once
#: it has handed out that many pages, as it takes never-used pages before it reuses freed ones.
#: 2^25 pages is 256 MiB an array: at page size 1, 32 times the incident's context window.
TOUCHED_BOUND = 2**25


class PoolExhausted(Exception):
    """Fewer free pages than an allocation asks for."""


class BeyondBound(Exception):
    """An allocation would take a page beyond the replay's bound (:data:`TOUCHED_BOUND`): the pool
    is left as it was, but for a merge the call itself made first."""


class PagePool:
    """Free and release lists of one node's pool; the pages held are the rest."""

    def __init__(self, pool_pages: int, bound: int = TOUCHED_BOUND) -> None:
        if pool_pages < 2:
            raise ValueError(f"a pool needs at least 2 pages (page 0 is reserved), not {pool_pages}")
        self.pool_pages = pool_pages
        self.bound = bound
        self._free: Pages = np.empty(0, dtype=np.int64)  # the free list's head: pages allocated before
        self._head = 0
        self.fresh = 1  # the free list's tail: pages fresh .. pool_pages-1, never allocated
        self._released: list[Pages] = []
        self._n_released = 0
        self.merges = 0

    @property
    def available(self) -> int:
        """Pages an allocation can take now (free and released)."""
        return self.free_count + self._n_released

    @property
    def free_count(self) -> int:
        """Pages on the free list itself (released pages not counted until a merge)."""
        return len(self._free) - self._head + self.pool_pages - self.fresh

    @property
    def released_count(self) -> int:
        """Pages on the release list (free, but not on the free list until a merge)."""
        return self._n_released

    @property
    def takeable(self) -> int:
        """Pages the free list hands out before one would lie past the replay's bound."""
        return len(self._free) - self._head + self.bound + 1 - self.fresh

    def merge_and_sort_free(self) -> None:
        """The release list joins the free list, all sorted ascending (a no-op when empty)."""
        if not self._n_released:
            return
        self._free = np.sort(np.concatenate([self._free[self._head:], *self._released]))
        self._head = 0
        self._released = []
        self._n_released = 0
        self.merges += 1

    def take(self, n: int) -> Pages:
        """``n`` pages from the head of the free list, as they are (no merge; known to be there)."""
        return self._take(n)

    def _take(self, n: int) -> Pages:
        beyond = self.fresh + n - (len(self._free) - self._head) - 1
        if beyond > self.bound:
            raise BeyondBound(f"{n:,} pages would reach page {beyond:,}, beyond the replay's bound of "
                              f"{self.bound:,} distinct pages a node's pool hands out")
        head = self._free[self._head:self._head + n]
        self._head += len(head)
        if len(head) == n:
            return head
        more = n - len(head)
        tail = np.arange(self.fresh, self.fresh + more, dtype=np.int64)
        self.fresh += more
        return np.concatenate([head, tail]) if len(head) else tail

    def alloc(self, n: int) -> Pages:
        """``n`` pages from the head of the free list, merging the release list if short."""
        if n > self.available:
            raise PoolExhausted(f"{n} pages asked, {self.available} available")
        if self.free_count < n:
            self.merge_and_sort_free()
        return self._take(n)

    def try_alloc(self, n: int) -> Pages | None:
        """SGLang's ``alloc`` (the token allocator's every call at page size 1): ``n`` pages,
        merging the release list when the free list is short; None, after that merge, when the
        pool cannot supply them."""
        if self.free_count < n:
            self.merge_and_sort_free()
        return self._take(n) if n <= self.free_count else None

    def alloc_extend(self, new_pages: Sequence[int], extend_tokens: int, page_size: int) -> list[Pages] | None:
        """A batch's new pages, the requests' in batch order: ``new_pages[i]`` pages for the
        i-th request, which extends by ``extend_tokens`` tokens in all. SGLang merges when its
        bound on the pages needed, ``extend_tokens // page_size + batch + 1``, exceeds the free
        list (while the pages really needed may still fit); None, after that merge, when they
        do not."""
        if extend_tokens // page_size + len(new_pages) + 1 > self.free_count:
            self.merge_and_sort_free()
        need = sum(new_pages)
        if need > self.free_count:
            return None
        taken = self._take(need)
        return np.split(taken, np.cumsum(new_pages)[:-1]) if len(new_pages) > 1 else [taken]

    def alloc_decode(self, new_pages: int, batch_size: int) -> Pages | None:
        """One decode step's new pages, in batch order of the requests whose next token starts
        a page; merged first when the batch is larger than the free list. None, after that
        merge, when the pages do not fit."""
        if batch_size > self.free_count:
            self.merge_and_sort_free()
        if new_pages > self.free_count:
            return None
        return self._take(new_pages)

    def free_list(self, first: int | None = None) -> Pages:
        """The free list in its order (a copy), or its ``first`` pages."""
        head = self._free[self._head:] if first is None else self._free[self._head:self._head + first]
        stop = self.pool_pages if first is None else min(self.pool_pages, self.fresh + max(0, first - len(head)))
        return np.concatenate([head, np.arange(self.fresh, stop, dtype=np.int64)])

    def released_pages(self) -> Pages:
        """The pages waiting on the release list, sorted."""
        if not self._released:
            return np.empty(0, np.int64)
        return np.sort(np.concatenate(self._released))

    def release(self, pages: Pages) -> None:
        """Pages a request frees, kept apart until the next shortage (never zeroed)."""
        if len(pages):
            self._released.append(pages)
            self._n_released += len(pages)

    def check(self, held: Iterable[Pages]) -> None:
        """The allocator invariant: free, released and held pages are each page 1..n-1 once (the
        free list's tail, pages never allocated, is ``fresh`` on: the rest are each below it once)."""
        parts = [self._free[self._head:], *self._released, *held]
        everything = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
        expected = np.arange(1, self.fresh, dtype=np.int64)
        if len(everything) != len(expected) or not np.array_equal(everything, expected):
            dup = everything[1:][np.diff(everything) == 0][:5].tolist()
            raise AssertionError(
                f"pool invariant broken: {len(everything)} pages accounted for, "
                f"{len(expected)} in the pool; pages held twice: {dup}"
            )
