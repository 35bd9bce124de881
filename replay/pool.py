"""A node's KV page pool with SGLang's disaggregated allocator policy (reference-engine.md).

Page 0 is reserved. The free list starts as ``1 .. pool_pages-1`` ascending; an allocation
takes pages from its head. Freed pages go to a separate release list, which is merged into
the free list and sorted ascending only when the free list is too short for an allocation.
Pages are numpy arrays in allocation order: a request's pages stay in the order it got them.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

Pages = npt.NDArray[np.int64]


class PoolExhausted(Exception):
    """Fewer free pages than an allocation asks for."""


class PagePool:
    """Free and release lists of one node's pool; the pages held are the rest."""

    def __init__(self, pool_pages: int) -> None:
        if pool_pages < 2:
            raise ValueError(f"a pool needs at least 2 pages (page 0 is reserved), not {pool_pages}")
        self.pool_pages = pool_pages
        self._free: Pages = np.arange(1, pool_pages, dtype=np.int64)
        self._head = 0
        self._released: list[Pages] = []
        self._n_released = 0
        self.merges = 0

    @property
    def available(self) -> int:
        """Pages an allocation can take now (free and released)."""
        return len(self._free) - self._head + self._n_released

    def alloc(self, n: int) -> Pages:
        """``n`` pages from the head of the free list, merging the release list if short."""
        if n > self.available:
            raise PoolExhausted(f"{n} pages asked, {self.available} available")
        if len(self._free) - self._head < n:
            self._free = np.sort(np.concatenate([self._free[self._head:], *self._released]))
            self._head = 0
            self._released = []
            self._n_released = 0
            self.merges += 1
        out = self._free[self._head:self._head + n]
        self._head += n
        return out

    def release(self, pages: Pages) -> None:
        """Pages a request frees, kept apart until the next shortage (never zeroed)."""
        if len(pages):
            self._released.append(pages)
            self._n_released += len(pages)

    def check(self, held: Iterable[Pages]) -> None:
        """The allocator invariant: free, released and held pages are each page 1..n-1 once."""
        parts = [self._free[self._head:], *self._released, *held]
        everything = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
        expected = np.arange(1, self.pool_pages, dtype=np.int64)
        if len(everything) != len(expected) or not np.array_equal(everything, expected):
            dup = everything[1:][np.diff(everything) == 0][:5].tolist()
            raise AssertionError(
                f"pool invariant broken: {len(everything)} pages accounted for, "
                f"{len(expected)} in the pool; pages held twice: {dup}"
            )
