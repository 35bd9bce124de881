"""The compiled core of the page sweep (``sweep``): per (node, boot), an interval map of
page content versions and the requests reading them, walked one event at a time.

numba compiles it on first use (about 13 s) and caches the machine code beside this
file, or in the user's cache where that is read-only. Its interpreted twin
(:func:`forensics.compiled.interpreted`) runs the same source as Python, about 25 us an event:
the sweep takes it for small cases, where compiling (or loading the machine code) costs more.

All state is in int64 arrays changed in place, with how many rows of each are in use kept in
``used``. Only the event loop grows arrays, before an op that could need more room, so the ops
themselves return plain numbers and never a new array.
"""

from __future__ import annotations

import numpy as np

from forensics.compiled import jit_for
from forensics.exposure.rows import (
    ALLOC,
    AT_COUNT,
    AT_NB,
    AT_OFFSET,
    ENDED,
    EXP_INFERRED,
    EXP_NB,
    EXP_READER,
    EXP_SEQ,
    EXP_VERSION,
    EXP_VICTIM,
    EXPOSED,
    F_PAGE,
    F_READERS,
    F_VERSION,
    FRAGS,
    FREE,
    H_HI,
    H_LO,
    HELD,
    HELD_LIVE,
    HI,
    I_INFERRED,
    I_READER,
    I_START,
    ISL_INFERRED,
    ISL_NB,
    ISL_READER,
    ISL_SEQ,
    ISL_TS,
    ISL_VICTIM,
    ITEMS,
    LO,
    LONGEST,
    N_USED,
    NO_VERSION,
    OPEN,
    S_AT,
    S_LEN,
    SETS,
    SH_READER,
    SH_VERSION,
    SHARE,
    SHARED,
    START,
    STILL_OPEN,
    UNINITIALIZED,
    WIDTH,
    WRITE,
    WRITER,
)

njit = jit_for(__name__)  # numba's, or nothing in the interpreted twin (forensics.compiled)


# --- arrays and rows ----------------------------------------------------------------------------


@njit(cache=True)
def _room(a: np.ndarray, used: int, need: int) -> np.ndarray:
    """``a``, or a larger copy of its first ``used`` rows, with room for ``need`` more rows."""
    if used + need <= a.shape[0]:
        return a
    bigger = np.empty((max(2 * a.shape[0], used + need), a.shape[1]), np.int64)
    for i in range(used):
        for j in range(a.shape[1]):
            bigger[i, j] = a[i, j]
    return bigger


# frags and items rows are three columns wide; whole rows are copied and compared as such
@njit(cache=True, inline="always")
def _copy_row(dst: np.ndarray, i: int, src: np.ndarray, j: int) -> None:
    """Row ``j`` of ``src`` into row ``i`` of ``dst`` (both three wide)."""
    dst[i, 0], dst[i, 1], dst[i, 2] = src[j, 0], src[j, 1], src[j, 2]


@njit(cache=True, inline="always")
def _same_row(a: np.ndarray, i: int, b: np.ndarray, j: int) -> bool:
    """Whether row ``i`` of ``a`` equals row ``j`` of ``b`` (both three wide)."""
    return a[i, 0] == b[j, 0] and a[i, 1] == b[j, 1] and a[i, 2] == b[j, 2]


@njit("void(int64[:, ::1], int64[::1], int64, int64, int64, int64, int64, int64, int64, int64, "
      "int64)", cache=True)
def _emit(rows: np.ndarray, used: np.ndarray, slot: int, k0: int, k1: int, k2: int, k3: int,
          k4: int, k5: int, lo: int, hi: int) -> None:
    """Add a row (room made); a row extending the previous one merges into it."""
    n = used[slot]
    if n > 0:
        last = rows[n - 1]
        if (last[7] == lo - 1 and last[0] == k0 and last[1] == k1 and last[2] == k2
                and last[3] == k3 and last[4] == k4 and last[5] == k5):
            last[7] = hi
            return
    row = rows[n]
    row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7] = k0, k1, k2, k3, k4, k5, lo, hi
    used[slot] = n + 1


# --- reader sets: immutable, in a pool; set 0 is the empty set ----------------------------------
# sets rows: (offset, length) into items; items rows: (request, start seq, inferred), by request


@njit(cache=True)
def _find(sets: np.ndarray, items: np.ndarray, s: int, rid: int) -> int:
    """The item index of ``rid`` in set ``s``, or -1."""
    for t in range(sets[s, S_AT], sets[s, S_AT] + sets[s, S_LEN]):
        if items[t, I_READER] == rid:
            return t
    return -1


@njit(cache=True)
def _with(sets: np.ndarray, items: np.ndarray, used: np.ndarray, s: int, rid: int, seq: int,
          inferred: int) -> int:
    """The id of a new set: set ``s`` and the reader ``rid`` (room made)."""
    new, out = used[SETS], used[ITEMS]
    size = sets[s, S_LEN]
    sets[new, S_AT], sets[new, S_LEN] = out, size + 1
    placed = False
    for t in range(sets[s, S_AT], sets[s, S_AT] + size):
        if not placed and items[t, I_READER] > rid:
            items[out, I_READER], items[out, I_START], items[out, I_INFERRED] = rid, seq, inferred
            out += 1
            placed = True
        _copy_row(items, out, items, t)
        out += 1
    if not placed:
        items[out, I_READER], items[out, I_START], items[out, I_INFERRED] = rid, seq, inferred
        out += 1
    used[SETS], used[ITEMS], used[LONGEST] = new + 1, out, max(used[LONGEST], size + 1)
    return new


@njit(cache=True)
def _without(sets: np.ndarray, items: np.ndarray, used: np.ndarray, s: int, drop: int) -> int:
    """The id of a new set: set ``s`` without item ``drop`` (room made)."""
    size = sets[s, S_LEN]
    if size == 1:
        return 0
    new, out = used[SETS], used[ITEMS]
    sets[new, S_AT], sets[new, S_LEN] = out, size - 1
    for t in range(sets[s, S_AT], sets[s, S_AT] + size):
        if t != drop:
            _copy_row(items, out, items, t)
            out += 1
    used[SETS], used[ITEMS] = new + 1, out
    return new


@njit(cache=True)
def _same(sets: np.ndarray, items: np.ndarray, a: int, b: int) -> bool:
    if a == b:
        return True
    if sets[a, S_LEN] != sets[b, S_LEN]:
        return False
    for k in range(sets[a, S_LEN]):
        ta, tb = sets[a, S_AT] + k, sets[b, S_AT] + k
        if not _same_row(items, ta, items, tb):
            return False
    return True


@njit(cache=True)
def _compacted(frags: np.ndarray, sets: np.ndarray, items: np.ndarray,
               used: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New set and item pools holding only the sets fragments still use (ids renumbered)."""
    renumber = np.full(used[SETS], -1, np.int64)
    renumber[0] = 0
    n_sets, n_items = 1, 0
    for i in range(used[FRAGS]):
        s = frags[i, F_READERS]
        if renumber[s] < 0:
            renumber[s] = n_sets
            n_sets += 1
            n_items += sets[s, S_LEN]
    new_sets = np.zeros((2 * n_sets + 64, 2), np.int64)
    new_items = np.empty((2 * n_items + 256, 3), np.int64)
    out = 0
    for s in range(used[SETS]):
        new = renumber[s]
        if new <= 0:
            continue
        new_sets[new, S_AT], new_sets[new, S_LEN] = out, sets[s, S_LEN]
        for t in range(sets[s, S_AT], sets[s, S_AT] + sets[s, S_LEN]):
            _copy_row(new_items, out, items, t)
            out += 1
    for i in range(used[FRAGS]):
        frags[i, F_READERS] = renumber[frags[i, F_READERS]]
    used[SETS], used[ITEMS] = n_sets, out
    return new_sets, new_items


# --- the interval map: frags rows (first page, version, reader set), sorted by first page -------
# fragment i covers pages [frags[i, F_PAGE], frags[i + 1, F_PAGE]); the last one runs to infinity


@njit(cache=True)
def _fragment_at(frags: np.ndarray, n: int, page: int) -> int:
    """The index of the fragment holding ``page``."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if frags[mid, F_PAGE] <= page:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@njit(cache=True)
def _split(frags: np.ndarray, used: np.ndarray, page: int) -> int:
    """The index of the fragment starting at ``page``, splitting the one holding it (room made)."""
    n = used[FRAGS]
    i = _fragment_at(frags, n, page)
    if frags[i, F_PAGE] == page:
        return i
    for j in range(n, i + 1, -1):
        _copy_row(frags, j, frags, j - 1)
    _copy_row(frags, i + 1, frags, i)
    frags[i + 1, F_PAGE] = page
    used[FRAGS] = n + 1
    return i + 1


@njit(cache=True)
def _merge(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, used: np.ndarray, a: int,
           b: int) -> None:
    """Merge equal neighbours among fragments ``a`` to ``b``."""
    n = used[FRAGS]
    a, b = max(a, 0), min(b, n - 1)
    w = a
    for j in range(a + 1, b + 1):
        if (frags[j, F_VERSION] != frags[w, F_VERSION]
                or not _same(sets, items, frags[j, F_READERS], frags[w, F_READERS])):
            w += 1
            _copy_row(frags, w, frags, j)
    gone = b - w
    if gone > 0:
        for j in range(b + 1, n):
            _copy_row(frags, j - gone, frags, j)
        used[FRAGS] = n - gone


@njit(cache=True)
def _seen(exposed: np.ndarray, uninitialized: np.ndarray, used: np.ndarray, writers: np.ndarray,
          nb: int, rid: int, version: int, lo: int, hi: int, seq: int, inferred: int) -> None:
    """``rid`` sees ``version`` on pages ``[lo, hi]`` at ``seq``."""
    if version == NO_VERSION:
        _emit(uninitialized, used, UNINITIALIZED, nb, rid, seq, inferred, 0, 0, lo, hi)
    elif writers[version, WRITER] != rid:
        _emit(exposed, used, EXPOSED, nb, rid, writers[version, WRITER], version, seq, inferred, lo, hi)


# --- the ops on the map (room made) -------------------------------------------------------------


@njit(cache=True)
def _write(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, exposed: np.ndarray,
           uninitialized: np.ndarray, used: np.ndarray, writers: np.ndarray, nb: int,
           version: int, lo: int, hi: int, seq: int) -> None:
    """The version ``version`` on ``[lo, hi]``: its open readers see it (late writes)."""
    ia = _split(frags, used, lo)
    ib = _split(frags, used, hi + 1)
    for i in range(ia, ib):
        s = frags[i, F_READERS]
        for t in range(sets[s, S_AT], sets[s, S_AT] + sets[s, S_LEN]):
            _seen(exposed, uninitialized, used, writers, nb, items[t, I_READER], version, frags[i, F_PAGE],
                  frags[i + 1, F_PAGE] - 1, seq, items[t, I_INFERRED])
        frags[i, F_VERSION] = version
    _merge(frags, sets, items, used, ia - 1, ib)


@njit(cache=True)
def _read(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, exposed: np.ndarray,
          uninitialized: np.ndarray, used: np.ndarray, writers: np.ndarray, nb: int, rid: int,
          lo: int, hi: int, seq: int, inferred: int) -> None:
    """``rid`` starts reading ``[lo, hi]`` where it does not already: it sees what is there."""
    ia = _split(frags, used, lo)
    ib = _split(frags, used, hi + 1)
    for i in range(ia, ib):
        s = frags[i, F_READERS]
        if _find(sets, items, s, rid) >= 0:
            continue
        frags[i, F_READERS] = _with(sets, items, used, s, rid, seq, inferred)
        _seen(exposed, uninitialized, used, writers, nb, rid, frags[i, F_VERSION], frags[i, F_PAGE],
              frags[i + 1, F_PAGE] - 1, seq, inferred)
    _merge(frags, sets, items, used, ia - 1, ib)


@njit(cache=True)
def _free(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, ended: np.ndarray,
          used: np.ndarray, nb: int, rid: int, lo: int, hi: int, seq: int) -> None:
    """``rid``'s reading intervals on ``[lo, hi]`` end at ``seq``."""
    ia = _split(frags, used, lo)
    ib = _split(frags, used, hi + 1)
    for i in range(ia, ib):
        s = frags[i, F_READERS]
        t = _find(sets, items, s, rid)
        if t < 0:
            continue
        _emit(ended, used, ENDED, nb, rid, items[t, I_START], seq, items[t, I_INFERRED], 0, frags[i, F_PAGE],
              frags[i + 1, F_PAGE] - 1)
        frags[i, F_READERS] = _without(sets, items, used, s, t)
    _merge(frags, sets, items, used, ia - 1, ib)


@njit(cache=True)
def _share(frags: np.ndarray, shared: np.ndarray, used: np.ndarray, rid: int, lo: int,
           hi: int) -> None:
    """The versions on ``[lo, hi]`` are now ``rid``'s own, seen before or after (room made)."""
    n = used[FRAGS]
    i = _fragment_at(frags, n, lo)
    while i < n and frags[i, F_PAGE] <= hi:
        if frags[i, F_VERSION] != NO_VERSION:
            end = min(frags[i + 1, F_PAGE] - 1, hi) if i + 1 < n else hi
            _emit(shared, used, SHARED, rid, frags[i, F_VERSION], 0, 0, 0, 0, max(frags[i, F_PAGE], lo), end)
        i += 1


@njit(cache=True)
def _finish(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, still_open: np.ndarray,
            used: np.ndarray, nb: int) -> None:
    """Reading intervals still open at the end of the boot (room made; sorted later)."""
    for i in range(used[FRAGS]):
        s = frags[i, F_READERS]
        for t in range(sets[s, S_AT], sets[s, S_AT] + sets[s, S_LEN]):
            _emit(still_open, used, STILL_OPEN, nb, items[t, I_READER], items[t, I_START], OPEN,
                  items[t, I_INFERRED], 0,
                  frags[i, F_PAGE], frags[i + 1, F_PAGE] - 1)


# --- holds: per request, sorted disjoint ranges, copied on change into the pool ``held`` --------
# held_at rows per request: (offset, count, nb + 1 of the boot they belong to, 0 for none)


@njit(cache=True)
def _held_range(held_at: np.ndarray, nb: int, rid: int) -> tuple[int, int]:
    """Where ``rid``'s ranges on ``nb`` are in the pool: offset and count."""
    if held_at[rid, AT_NB] != nb + 1:
        return 0, 0
    return held_at[rid, AT_OFFSET], held_at[rid, AT_COUNT]


@njit(cache=True)
def _hold(held_at: np.ndarray, held: np.ndarray, used: np.ndarray, nb: int, rid: int, lo: int,
          hi: int) -> None:
    """``rid`` holds ``[lo, hi]`` too (room made for its ranges and one more)."""
    start, count = _held_range(held_at, nb, rid)
    out = used[HELD]
    placed = False
    for t in range(start, start + count):
        a, b = held[t, H_LO], held[t, H_HI]
        if b < lo - 1:
            held[out, H_LO], held[out, H_HI] = a, b
            out += 1
        elif a > hi + 1:
            if not placed:
                held[out, H_LO], held[out, H_HI] = lo, hi
                out += 1
                placed = True
            held[out, H_LO], held[out, H_HI] = a, b
            out += 1
        else:
            lo, hi = min(a, lo), max(b, hi)
    if not placed:
        held[out, H_LO], held[out, H_HI] = lo, hi
        out += 1
    _set_held(held_at, used, nb, rid, count, out)


@njit(cache=True)
def _release(held_at: np.ndarray, held: np.ndarray, used: np.ndarray, nb: int, rid: int, lo: int,
             hi: int) -> None:
    """``rid`` no longer holds ``[lo, hi]`` (room made for its ranges and one more)."""
    start, count = _held_range(held_at, nb, rid)
    out = used[HELD]
    for t in range(start, start + count):
        a, b = held[t, H_LO], held[t, H_HI]
        if b < lo or a > hi:
            held[out, H_LO], held[out, H_HI] = a, b
            out += 1
            continue
        if a < lo:
            held[out, H_LO], held[out, H_HI] = a, lo - 1
            out += 1
        if b > hi:
            held[out, H_LO], held[out, H_HI] = hi + 1, b
            out += 1
    _set_held(held_at, used, nb, rid, count, out)


@njit(cache=True)
def _set_held(held_at: np.ndarray, used: np.ndarray, nb: int, rid: int, before: int,
              end: int) -> None:
    """``rid``'s ranges are now the pool rows from ``used[HELD]`` to ``end``."""
    held_at[rid, AT_OFFSET], held_at[rid, AT_COUNT], held_at[rid, AT_NB] = used[HELD], end - used[HELD], nb + 1
    used[HELD_LIVE] += end - used[HELD] - before
    used[HELD] = end


@njit(cache=True)
def _compacted_holds(held_at: np.ndarray, held: np.ndarray, used: np.ndarray, nb: int) -> np.ndarray:
    """A new pool holding only the ranges of ``nb``'s requests."""
    pool = np.empty((2 * used[HELD_LIVE] + 1024, 2), np.int64)
    out = 0
    for rid in range(held_at.shape[0]):
        if held_at[rid, AT_NB] != nb + 1:
            continue
        start, count = held_at[rid, AT_OFFSET], held_at[rid, AT_COUNT]
        held_at[rid, AT_OFFSET] = out
        for t in range(start, start + count):
            pool[out, H_LO], pool[out, H_HI] = held[t, H_LO], held[t, H_HI]
            out += 1
    used[HELD] = out
    return pool


# --- the event loop -----------------------------------------------------------------------------


@njit(cache=True)
def _roomy(frags: np.ndarray, sets: np.ndarray, items: np.ndarray, exposed: np.ndarray,
           uninitialized: np.ndarray, ended: np.ndarray, used: np.ndarray) -> bool:
    """Whether the arrays have room for an op on one range: two splits, a new set per fragment,
    and a row per fragment and reader."""
    f = used[FRAGS] + 2
    rows = f * (used[LONGEST] + 1)
    return (used[FRAGS] + 2 <= len(frags) and used[SETS] + f <= len(sets)
            and used[ITEMS] + rows <= len(items) and used[EXPOSED] + rows <= len(exposed)
            and used[UNINITIALIZED] + rows <= len(uninitialized) and used[ENDED] + f <= len(ended))


@njit(cache=True)
def walk(nbs: np.ndarray, seqs: np.ndarray, rids: np.ndarray, ops: np.ndarray, los: np.ndarray,
         his: np.ndarray, n_requests: int, compact_after: int) -> tuple[np.ndarray, ...]:
    """Walk the events (in sweep order) through each (node, boot)'s map.

    Rows, all of width ``WIDTH``: exposures (nb, reader, victim, version, seq, inferred),
    uninitialized reads (nb, reader, seq, inferred), reading intervals ended (nb, reader, start
    seq, end seq, inferred) and still open (the same, end seq ``OPEN``), and shares (reader,
    version): the versions a reader took as its own. The set and hold pools drop what no longer
    counts once it exceeds ``compact_after`` rows.
    """
    used = np.zeros(N_USED, np.int64)
    frags, sets, items = np.empty((64, 3), np.int64), np.zeros((64, 2), np.int64), np.empty((256, 3), np.int64)
    writers = np.empty((1024, 1), np.int64)  # version -> the request that wrote it
    exposed, uninitialized = np.empty((1024, WIDTH), np.int64), np.empty((1024, WIDTH), np.int64)
    ended, still_open = np.empty((1024, WIDTH), np.int64), np.empty((1024, WIDTH), np.int64)
    shared = np.empty((1024, WIDTH), np.int64)
    held_at, held = np.zeros((n_requests, 3), np.int64), np.empty((1024, 2), np.int64)
    read_on = np.full(n_requests, -1, np.int64)  # the last nb each request read on
    k = n_versions = 0
    while k < len(nbs):
        nb, last_write = nbs[k], -1
        frags[0, F_PAGE], frags[0, F_VERSION], frags[0, F_READERS] = 0, NO_VERSION, 0  # one fragment: all pages
        used[FRAGS], used[SETS], used[ITEMS], used[LONGEST], used[HELD], used[HELD_LIVE] = 1, 1, 0, 0, 0, 0
        while k < len(nbs) and nbs[k] == nb:
            seq, rid, op, lo, hi = seqs[k], rids[k], ops[k], los[k], his[k]
            k += 1
            if op == ALLOC or op == SHARE or op == FREE:
                if used[HELD] > 2 * used[HELD_LIVE] + compact_after:
                    held = _compacted_holds(held_at, held, used, nb)
                held = _room(held, used[HELD], _held_range(held_at, nb, rid)[1] + 1)
                if op != FREE:
                    _hold(held_at, held, used, nb, rid, lo, hi)
                    if op == SHARE:
                        shared = _room(shared, used[SHARED], used[FRAGS] + 1)
                        _share(frags, shared, used, rid, lo, hi)
                    continue
                _release(held_at, held, used, nb, rid, lo, hi)
                if read_on[rid] != nb:
                    continue
            if used[SETS] > 2 * used[FRAGS] + compact_after:
                sets, items = _compacted(frags, sets, items, used)
            if op == WRITE and seq != last_write:  # one version per write record, whatever its ranges
                last_write = seq
                writers = _room(writers, n_versions, 1)
                writers[n_versions, WRITER] = rid
                n_versions += 1
            first, n_ranges = _held_range(held_at, nb, rid) if op == START else (0, 1)
            for r in range(first, first + n_ranges):
                if op == START:
                    lo, hi = held[r, H_LO], held[r, H_HI]
                if not _roomy(frags, sets, items, exposed, uninitialized, ended, used):
                    f = used[FRAGS] + 2
                    rows = f * (used[LONGEST] + 1)
                    frags, sets = _room(frags, used[FRAGS], 2), _room(sets, used[SETS], f)
                    items, exposed = _room(items, used[ITEMS], rows), _room(exposed, used[EXPOSED], rows)
                    uninitialized = _room(uninitialized, used[UNINITIALIZED], rows)
                    ended = _room(ended, used[ENDED], f)
                if op == WRITE:
                    _write(frags, sets, items, exposed, uninitialized, used, writers, nb,
                           n_versions - 1, lo, hi, seq)
                elif op == FREE:
                    _free(frags, sets, items, ended, used, nb, rid, lo, hi, seq)
                else:
                    read_on[rid] = nb
                    _read(frags, sets, items, exposed, uninitialized, used, writers, nb, rid, lo,
                          hi, seq, 1 if op == START else 0)
        still_open = _room(still_open, used[STILL_OPEN], used[FRAGS] * max(used[LONGEST], 1))
        _finish(frags, sets, items, still_open, used, nb)
    return (exposed[:used[EXPOSED]], uninitialized[:used[UNINITIALIZED]], ended[:used[ENDED]],
            still_open[:used[STILL_OPEN]], shared[:used[SHARED]])


# --- after the walk ----------------------------------------------------------------------------


@njit(cache=True)
def merged(rows: np.ndarray) -> np.ndarray:
    """``rows`` with each row extending the previous one merged into it."""
    out = np.empty((len(rows), WIDTH), np.int64)
    used = np.zeros(N_USED, np.int64)  # only its first slot counts the rows out
    for r in rows:
        _emit(out, used, 0, r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7])
    return out[:used[0]]


@njit(cache=True)
def _lower_bound(first: np.ndarray, second: np.ndarray, a: int, b: int) -> int:
    """The index of the first pair (``first[i]``, ``second[i]``), pairs sorted, at or after (a, b)."""
    lo, hi = 0, len(first)
    while lo < hi:
        mid = (lo + hi) >> 1
        if first[mid] < a or (first[mid] == a and second[mid] < b):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def without_shared(exposures: np.ndarray, shared: np.ndarray) -> np.ndarray:
    """Exposure rows without the pages whose version the reader took by share (at any time).

    ``shared`` rows are (reader, version, ..., lo, hi) as ``walk`` gives them, sorted.
    """
    readers, versions = np.ascontiguousarray(shared[:, SH_READER]), np.ascontiguousarray(shared[:, SH_VERSION])
    out = np.empty((len(exposures) + 64, WIDTH), np.int64)
    used = np.zeros(N_USED, np.int64)  # only its first slot counts the rows out
    for row in exposures:
        reader, version, lo, hi = row[EXP_READER], row[EXP_VERSION], row[LO], row[HI]
        t = _lower_bound(readers, versions, reader, version)
        cursor = lo  # the first page not yet placed
        while t < len(shared) and readers[t] == reader and versions[t] == version:
            a, b = shared[t, LO], shared[t, HI]
            t += 1
            if b < cursor:
                continue
            if a > hi:
                break
            if a > cursor:
                out = _room(out, used[0], 1)
                _emit(out, used, 0, row[0], row[1], row[2], row[3], row[4], row[5], cursor, a - 1)
            cursor = b + 1
        if cursor <= hi:
            out = _room(out, used[0], 1)
            _emit(out, used, 0, row[0], row[1], row[2], row[3], row[4], row[5], cursor, hi)
    return out[:used[0]]


@njit(cache=True)
def islands(exposures: np.ndarray) -> np.ndarray:
    """Per (nb, reader, victim), the exposure rows' pages as maximal ranges, each with the first
    seq the reader saw any of them and whether any read was inferred: rows (nb, reader, victim,
    seq, inferred, 0, lo, hi).

    ``exposures`` rows are (nb, reader, victim, version, seq, inferred, lo, hi), sorted by nb,
    reader, victim and lo.
    """
    out = np.empty((len(exposures), WIDTH), np.int64)
    n = -1
    for row in exposures:
        if (n >= 0 and out[n, ISL_NB] == row[EXP_NB] and out[n, ISL_READER] == row[EXP_READER]
                and out[n, ISL_VICTIM] == row[EXP_VICTIM] and row[LO] <= out[n, HI] + 1):
            out[n, ISL_SEQ] = min(out[n, ISL_SEQ], row[EXP_SEQ])
            out[n, ISL_INFERRED] = max(out[n, ISL_INFERRED], row[EXP_INFERRED])
            out[n, HI] = max(out[n, HI], row[HI])
            continue
        n += 1
        out[n, ISL_NB], out[n, ISL_READER], out[n, ISL_VICTIM] = row[EXP_NB], row[EXP_READER], row[EXP_VICTIM]
        out[n, ISL_SEQ], out[n, ISL_INFERRED], out[n, ISL_TS] = row[EXP_SEQ], row[EXP_INFERRED], 0
        out[n, LO], out[n, HI] = row[LO], row[HI]
    return out[:n + 1]


@njit(cache=True)
def event_at(nbs: np.ndarray, seqs: np.ndarray, at_nb: np.ndarray, at_seq: np.ndarray) -> np.ndarray:
    """The index of the first event at each (``at_nb``, ``at_seq``); events sorted by nb, seq."""
    found = np.empty(len(at_nb), np.int64)
    for q in range(len(at_nb)):
        found[q] = _lower_bound(nbs, seqs, at_nb[q], at_seq[q])
    return found
