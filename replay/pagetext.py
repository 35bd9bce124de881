"""The page string of the reference engine's page arrays (``"1-3,7"``), its runs found by compiled code.

A replay writes a page string for nearly every page record it emits, and most of its arrays are a
prompt's pages: a few hundred ids in a handful of runs (a free list merged and sorted hands out
runs broken where other requests' pages lie). :func:`forensics.emit.page_string` finds the runs
with half a dozen numpy calls: 22 us for 216 pages in 6 runs, 45 us out of order. The kernel here
walks the array once (sorting and dropping repeats first where it is out of order): with the
text, 5.0 and 7.5 us. numba compiles it on first use and caches the machine code beside this
file; until a process has written :data:`COMPILED_FROM` page strings, and for short arrays,
:func:`forensics.emit.page_string` does it (a small replay compiles nothing). Both write the same
text: tests hold them to each other.
"""

from __future__ import annotations

import itertools

import numpy as np

from forensics import compiled
from forensics.emit import page_string, ranges_text

njit = compiled.jit_for(__name__)  # numba's, or nothing in the interpreted twin (forensics.compiled)

#: Arrays of at most this many pages are left to :func:`forensics.emit.page_string` (its Python
#: pass is quicker there than a call into compiled code and its array).
SHORT = 64
#: Page strings of longer arrays a process writes before it loads the compiled kernel.
COMPILED_FROM = 2_000
_CALLS = itertools.count(1)


def load_kernel() -> None:
    """Load the compiled kernel now and take it for every long array from here on: a replay's fork
    server does, before it forks the workers (replay/preload.py)."""
    global _CALLS
    runs(np.arange(1, 3, dtype=np.int64), np.empty(4, np.int64))
    _CALLS = itertools.count(COMPILED_FROM + 1)


@njit(cache=True)
def runs(pages: np.ndarray, out: np.ndarray) -> int:
    """The runs of consecutive ids of ``pages`` (int64, any order, repeats allowed), sorted: each
    run's first and last id into ``out`` (room for ``2 * len(pages)``), in order. Returns how
    many runs; 0 for no pages, -1 where an id is negative."""
    n = len(pages)
    if n == 0:
        return 0
    ordered = True
    for i in range(1, n):
        if pages[i] <= pages[i - 1]:
            ordered = False
            break
    p = pages if ordered else np.unique(pages)
    if p[0] < 0:
        return -1
    k = 0
    lo = p[0]
    hi = p[0]
    for i in range(1, len(p)):
        if p[i] == hi + 1:
            hi = p[i]
        else:
            out[k] = lo
            out[k + 1] = hi
            k += 2
            lo = p[i]
            hi = p[i]
    out[k] = lo
    out[k + 1] = hi
    return k // 2 + 1


def page_text(pages: np.ndarray) -> str:
    """:func:`forensics.emit.page_string` of a numpy array of page ids: the same text."""
    if len(pages) <= SHORT or not compiled.taken(_CALLS, COMPILED_FROM, "page strings"):
        return page_string(pages)
    p = np.asarray(pages, dtype=np.int64)
    out = np.empty(2 * len(p), np.int64)
    k = runs(p, out)
    if k <= 0:
        return page_string(p)  # (its error: no pages, or a negative id)
    ends = out[:2 * k].tolist()
    return ranges_text(ends[::2], ends[1::2])
