"""The compiled core of :meth:`replay.schedule.Horizon.ceiling`: the most steps that may have run by an
event of a decode node, by the constraints of order and lockstep among the decode starts still to come.

A replay asks it at every event whose step count the times leave open: on a node whose times are
coarse for its pace, nearly every event (95,096 of them in a replay of 50,000 requests of
``bench/generate.py``'s incident), each over a handful of starts and finishes. The Python of
:meth:`~replay.schedule.Horizon.ceiling` builds sets, dicts and lists for it, 14 us a call; the
kernel walks arrays. numba compiles it on first use and caches the machine code beside this file;
until a process has asked :data:`COMPILED_FROM` ceilings the Python answers (a small replay
compiles nothing). Both give the same answer: tests hold them to each other.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled import jit_for

njit = jit_for(__name__)  # numba's, or nothing in the interpreted twin (forensics.compiled)

#: A value no path has reached: above any step count (replay.schedule's own).
UNREACHED = 1 << 62


@njit(cache=True)
def ceiling(at: int, fixed_at: np.ndarray, fixed_value: np.ndarray, starts: np.ndarray, finishes: np.ndarray,
            steps: np.ndarray) -> tuple[bool, int]:
    """:meth:`replay.schedule.Horizon.ceiling` over arrays: the event at ``at`` in the node's order;
    the fixed finishes (``fixed_at``: where each comes, ``fixed_value``: the step count there, at
    least one); the starts to come (``starts``, sorted, each with where its request's delivered
    finish comes and its steps: ``finishes``, ``steps``; in the order of their ``(start, finish,
    steps)``). Returns whether the constraints admit a schedule, and the ceiling where they do."""
    last = fixed_at.max()
    lo = np.searchsorted(starts, at, side="left")
    hi = np.searchsorted(starts, last, side="left")
    m = max(hi - lo, 0)
    k = len(fixed_at)
    every = np.empty(k + 2 * m, np.int64)
    every[:k] = fixed_at
    every[k:k + m] = starts[lo:lo + m]
    every[k + m:] = finishes[lo:lo + m]
    places = np.unique(every)  # ascending: a position's rank, counted from the highest, is n - 1 - its index
    n = len(places)
    best = np.full(n, UNREACHED, np.int64)
    for i in range(k):
        r = n - 1 - np.searchsorted(places, fixed_at[i])
        if fixed_value[i] < best[r]:
            best[r] = fixed_value[i]
    jump_start = np.empty(m, np.int64)
    jump_finish = np.empty(m, np.int64)
    for j in range(m):
        jump_start[j] = n - 1 - np.searchsorted(places, starts[lo + j])
        jump_finish[j] = n - 1 - np.searchsorted(places, finishes[lo + j])
    suffix = np.empty(n, np.int64)  # the least value at a position or after it
    for _ in range(2 * m + 2):  # (a sweep takes each path one jump further; a shortest path makes each
        least = UNREACHED       # request's two jumps at most once)
        for q in range(n):
            if best[q] < least:
                least = best[q]
            suffix[q] = least
        changed = False
        for j in range(m):
            ks = jump_start[j]
            kf = jump_finish[j]
            a = steps[lo + j]
            if suffix[ks] < UNREACHED and suffix[ks] + a < best[kf]:  # from any position at or after the
                best[kf] = suffix[ks] + a  # start, on to its finish
                changed = True
            if suffix[kf] < UNREACHED and suffix[kf] - a < best[ks]:  # from any position at or after the
                best[ks] = suffix[kf] - a  # finish, back to its start
                changed = True
        if not changed:
            return True, best.min()
    return False, 0  # (still falling: a negative cycle, the logs fit no lockstep schedule)
