"""A decode node's replay as compiled code: the node loop of :func:`replay.drive.replay_node` for
the decode role, with its step clock (:class:`replay.schedule.StepClock`), its engine
(:class:`replay.engine.NodeEngine`: the pool, the preallocations, the running batch and its
steps) and its writer (:class:`replay.logset.LogSet`: the records' lines), over the node's events
as columns and its state as arrays. The Python is its reference: it writes the same bytes, lists
the same disagreements in the same order and counts the same figures (tests/replay/test_decode_kernel.py
holds every case of the replay's tests to it). :mod:`replay.decode_fast` decides, before a node
starts, whether the node is one this kernel covers, reads its records into columns and the lines
of the records it writes as they are logged (templates, the seq left open), and calls :func:`run`
a batch of events at a time.

Its state between calls:

- ``S`` (int64) and ``F`` (float64): the clock's, the pool's and the writer's scalars, and the
  node's constants (indices below);
- ``R``: a row per request of the node (a *slot*), its plan (filled by the caller) and what the
  engine and the clock hold of it;
- the pool's free list (``free``: its head from ``S[HEAD]`` to ``S[FLEN]``, then the pages never
  handed out, ``S[FRESH]`` on) and release list (``rel``);
- ``arena``: each request's pages, its prompt's then those its steps took, in one segment a
  request (``R[.., OFF]``, room for every page its steps can take);
- ``chains``: the chains of the decode starts (:meth:`replay.schedule.Horizon.chains`) each running
  request was given at its join;
- the running batch in join order (``batch``), the requests with a known end (``ends``) and with a
  row in the step records' count (``rowsl``), the rows of those that left (``left``), and the step
  records not yet settled (``recs``).

Growing arrays are returned by the function that grows them. Every call's output is ``out`` (the
lines, UTF-8), ``splits`` (where the packed log set starts a new file) and ``logv`` (the
disagreements, the step records' disagreements and the readers without pages, as codes and
numbers the caller words as the Python does).
"""

from __future__ import annotations

import numpy as np

from forensics.compiled import jit_for
from replay import ceiling as _ceiling_module

njit = jit_for(__name__)  # numba's, or nothing in the interpreted twin (forensics.compiled)

_ceiling = _ceiling_module.ceiling

# -- the events' columns (EV) -----------------------------------------------------------------
K_REQUEST, K_TRANSFER, K_STEP, K_FORGET = 0, 1, 2, 3
E_OTHER, E_ADMITTED, E_REJECTED, E_DECODE_STARTED, E_FINISHED, E_COMPLETED = 0, 1, 2, 3, 4, 5
(EV_KIND, EV_EVENT, EV_SLOT, EV_TS, EV_CARRIED, EV_IMPLIED, EV_OK, EV_FINISH_AT, EV_AT, EV_HAS_SEQ, EV_SEQ,
 EV_STEPS, EV_RUNNING, EV_ADMIT, EV_SERVED, EV_TA, EV_TB, EV_TC, EV_WA, EV_WB, EV_WC, EV_WD) = range(22)
NEV = 22

# -- a request's row (R) ----------------------------------------------------------------------
(R_PLAN, R_SERVED, R_ROUTER_REJ, R_PREFILL_REJ, R_KV, R_PROMPT, R_OUTPUTS, R_HELD, R_HAS_PROMPT, R_OFF, R_PLEN,
 R_NSTEPS, R_CAP, R_TOKENS, R_LEFT, R_ALLOCS, R_FIRST_WRITE, R_ENDED, R_READING, R_RELEASED, R_IN_BATCH,
 R_HAS_FIRST, R_FIRST, R_HAS_END, R_END_STEPS, R_END_FINISH, R_HAS_CHAINS, R_CH_OFF, R_CH_LEN, R_HAS_ROW,
 R_ROW_FIRST, R_ROW_ALLOCS, R_DEAD, R_RID_OFF, R_RID_LEN, R_ENDS_POS, R_ROWS_POS, R_UNLOGGED) = range(38)
NR = 38

# -- the scalars (S) --------------------------------------------------------------------------
(S_STEPS, S_AMBIG, S_HAS_ANCHOR, S_ANCHOR_NS, S_ANCHOR_IDX, S_HAS_REPORTED, S_REPORTED, S_HAS_CHAIN, S_CH0, S_CH1,
 S_CH2, S_BLIND, S_SREC, S_SUNDEC, S_SUNCHK, S_JOIN_HAS, S_JOIN_OFF, S_JOIN_LEN, S_CLOCK, S_SEQ, S_PART, S_RECORDS,
 S_HEAD, S_FLEN, S_FRESH, S_NREL, S_MERGES, S_ARENA, S_NBATCH, S_NENDS, S_NROWS, S_NLEFT, S_NRECS, S_STARVED,
 S_OUT, S_NSPLIT, S_NLOG, S_CHAINS, S_ERROR, S_PS, S_POOL_PAGES, S_POOL_TOKENS, S_OVERLAP, S_CONFIRM, S_PICK,
 S_HAS_CADENCE, S_HAS_HORIZON, S_PACKED, S_PART_LIMIT, S_NSLOTS) = range(50)
NS = 64
F_STEP, F_FINISH, F_TOL, F_DRIFT = 0, 1, 2, 3
PICK_LOGGED, PICK_EARLY, PICK_LATE = 0, 1, 2
#: S[S_ERROR]: a page string of no pages (the Python's ValueError), a part of more files than ``splits`` holds
ERR_NO_PAGES, ERR_SPLITS = 1, 2

# -- the constant texts (ct, co: each fragment's offset and length) ------------------------------
(C_KV_HEAD, C_NODE_PRE, C_NODE, C_SEQ, C_BOOT, C_RID, C_ALLOC, C_WRITE, C_READ, C_FREE, C_END, C_SRC_TRANSFER,
 C_SRC_DECODE, C_REQ_HEAD, C_REJ_POOL, C_FIN_POOL, C_REJ_EXC, C_FIN_EXC) = range(18)
NC = 18

# -- the log (logv): entries [type, code, slot, n, v1 .. vn] ----------------------------------------
L_DISAGREE, L_STEP_DIFFERS, L_UNSUPPLIED = 0, 1, 2
D_SUPPLY_PROMPT, D_SUPPLY_PAGES, D_BEYOND_PROMPT, D_BEYOND_ROW, D_STARVED, D_STEPS_DIFFER = 0, 1, 2, 3, 4, 5
SD_PLACE, SD_PINNED, SD_RUNNING = 0, 1, 2
#: a step record's name: its seq, its time, or the name of one read again (replay.schedule._RESTART)
LABEL_SEQ, LABEL_AT, LABEL_RESTART = 0, 1, 2

# -- the step records not yet settled (recs): a row each ---------------------------------------------
(Q_REPORTED, Q_BEFORE, Q_RUNNING, Q_LABEL, Q_LSEQ, Q_LNS, Q_HAS_READY, Q_READY) = range(8)
NQ = 8

MAX_REQUEST_PAGES = 2**22  # (replay.engine's)
ROWS_CHECKED = 64  # (replay.schedule's)
DRIFT_SIGMAS = 3
EPS = 1e-6


# == text ======================================================================================

@njit(cache=True, inline='always')
def _room_for(out: np.ndarray, S: np.ndarray, n: int) -> np.ndarray:
    used = S[S_OUT]
    if used + n <= len(out):
        return out
    grown = np.empty(max(2 * len(out), used + n + 1024), np.uint8)
    grown[:used] = out[:used]
    return grown


@njit(cache=True, inline='always')
def _put(out: np.ndarray, S: np.ndarray, src: np.ndarray, a: int, b: int) -> np.ndarray:
    out = _room_for(out, S, b - a)
    u = S[S_OUT] - a
    for j in range(a, b):  # (a loop: a slice's copy costs more than these few bytes)
        out[u + j] = src[j]
    S[S_OUT] = u + b
    return out


@njit(cache=True, inline='always')
def _frag(out: np.ndarray, S: np.ndarray, ct: np.ndarray, co: np.ndarray, k: int) -> np.ndarray:
    return _put(out, S, ct, co[k, 0], co[k, 0] + co[k, 1])


@njit(cache=True, inline='always')
def _byte(out: np.ndarray, S: np.ndarray, c: int) -> np.ndarray:
    out = _room_for(out, S, 1)
    out[S[S_OUT]] = c
    S[S_OUT] += 1
    return out


@njit(cache=True, inline='always')
def _int(out: np.ndarray, S: np.ndarray, v: int) -> np.ndarray:
    """``v`` in decimal (as Python's ``str``)."""
    out = _room_for(out, S, 21)
    u = S[S_OUT]
    if v < 0:
        out[u] = 45
        u += 1
        v = -v
    n = 1
    rest = v // 10
    while rest:
        n += 1
        rest //= 10
    for k in range(n - 1, -1, -1):
        out[u + k] = 48 + v % 10
        v //= 10
    S[S_OUT] = u + n
    return out


@njit(cache=True, inline='always')
def _padded(out: np.ndarray, u: int, v: int, width: int) -> int:
    for k in range(width - 1, -1, -1):
        out[u + k] = 48 + v % 10
        v //= 10
    return u + width


@njit(cache=True, inline='always')
def _ts(out: np.ndarray, S: np.ndarray, ns: int) -> np.ndarray:
    """:func:`replay.logset.ts_text` of ``ns``: RFC 3339 UTC to the microsecond (the year as
    ``strftime("%Y")`` writes it: unpadded below 1000)."""
    out = _room_for(out, S, 40)
    us = ns // 1000
    second = us // 1_000_000
    micros = us - second * 1_000_000
    days = second // 86400
    rem = second - days * 86400
    z = days + 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    if m <= 2:
        y += 1
    if y >= 1000:
        u = _padded(out, S[S_OUT], y, 4)
        S[S_OUT] = u
    else:
        out = _int(out, S, y)
        u = S[S_OUT]
    out[u] = 45
    u = _padded(out, u + 1, m, 2)
    out[u] = 45
    u = _padded(out, u + 1, d, 2)
    out[u] = 84
    u = _padded(out, u + 1, rem // 3600, 2)
    out[u] = 58
    u = _padded(out, u + 1, (rem % 3600) // 60, 2)
    out[u] = 58
    u = _padded(out, u + 1, rem % 60, 2)
    out[u] = 46
    u = _padded(out, u + 1, micros, 6)
    out[u] = 90
    S[S_OUT] = u + 1
    return out


@njit(cache=True)
def _pages(out: np.ndarray, S: np.ndarray, src: np.ndarray, a: int, b: int) -> np.ndarray:
    """The page string of ``src[a:b]`` (:func:`forensics.emit.page_string`: sorted, repeats dropped, runs)."""
    if b <= a:
        S[S_ERROR] = ERR_NO_PAGES
        return out
    for k in range(a + 1, b):
        if src[k] <= src[k - 1]:  # (out of order: sorted, each once)
            p = np.unique(src[a:b])
            return _runs(out, S, p, 0, len(p))
    return _runs(out, S, src, a, b)


@njit(cache=True)
def _runs(out: np.ndarray, S: np.ndarray, p: np.ndarray, a: int, b: int) -> np.ndarray:
    """The runs of the ascending ids ``p[a:b]``: ``lo-hi`` or ``lo``, joined by commas."""
    lo = p[a]
    hi = p[a]
    for k in range(a + 1, b + 1):
        if k < b and p[k] == hi + 1:
            hi = p[k]
            continue
        if lo != p[a]:
            out = _byte(out, S, 44)
        out = _int(out, S, lo)
        if hi > lo:
            out = _byte(out, S, 45)
            out = _int(out, S, hi)
        if k < b:
            lo = p[k]
            hi = p[k]
    return out


@njit(cache=True, inline='always')
def _group(splits: np.ndarray, S: np.ndarray, records: int) -> None:
    """``records`` written by one call of the writer: a packed log set starts a new file once one
    holds its limit (replay.logset.PART_RECORDS), after the call that reaches it."""
    S[S_RECORDS] += records
    S[S_PART] += records
    if S[S_PACKED] and S[S_PART] >= S[S_PART_LIMIT]:
        if S[S_NSPLIT] >= len(splits):
            S[S_ERROR] = ERR_SPLITS
            return
        splits[S[S_NSPLIT]] = S[S_OUT]
        S[S_NSPLIT] += 1
        S[S_PART] = 0


@njit(cache=True, inline='always')
def _seq(out: np.ndarray, S: np.ndarray) -> np.ndarray:
    out = _int(out, S, S[S_SEQ])
    S[S_SEQ] += 1
    return out


@njit(cache=True, inline='always')
def _head(out: np.ndarray, S: np.ndarray, ct: np.ndarray, co: np.ndarray, R: np.ndarray, rid_text: np.ndarray,
          kind: int, ts: int, slot: int) -> np.ndarray:
    """A line the engine writes, up to its request's id: its kind (a fragment), time, node, seq and boot."""
    out = _frag(out, S, ct, co, kind)
    out = _ts(out, S, ts)
    out = _frag(out, S, ct, co, C_NODE_PRE)
    out = _frag(out, S, ct, co, C_NODE)
    out = _frag(out, S, ct, co, C_SEQ)
    out = _seq(out, S)
    out = _frag(out, S, ct, co, C_BOOT)
    out = _frag(out, S, ct, co, C_RID)
    return _put(out, S, rid_text, R[slot, R_RID_OFF], R[slot, R_RID_OFF] + R[slot, R_RID_LEN])


@njit(cache=True)
def _kv(out: np.ndarray, S: np.ndarray, ct: np.ndarray, co: np.ndarray, R: np.ndarray, rid_text: np.ndarray,
        ts: int, slot: int, op: int, src: np.ndarray, a: int, b: int, tail: int) -> np.ndarray:
    """A page record's line (LogSet.emit_kvs): ``op`` and ``tail`` are fragments, the pages ``src[a:b]``."""
    out = _head(out, S, ct, co, R, rid_text, C_KV_HEAD, ts, slot)
    out = _frag(out, S, ct, co, op)
    out = _pages(out, S, src, a, b)
    return _frag(out, S, ct, co, tail)


@njit(cache=True)
def _engine_record(out: np.ndarray, S: np.ndarray, ct: np.ndarray, co: np.ndarray, R: np.ndarray,
                   rid_text: np.ndarray, ts: int, slot: int, rest: int) -> np.ndarray:
    """A request record the engine makes itself (a rejection, a finish): ``rest`` its fields after the request."""
    out = _head(out, S, ct, co, R, rid_text, C_REQ_HEAD, ts, slot)
    return _frag(out, S, ct, co, rest)


@njit(cache=True)
def _logged(out: np.ndarray, splits: np.ndarray, S: np.ndarray, EV: np.ndarray, i: int, tb: np.ndarray
            ) -> np.ndarray:
    """Event ``i``'s record as it was logged (its template), numbered."""
    out = _put(out, S, tb, EV[i, EV_TA], EV[i, EV_TB])
    out = _seq(out, S)
    out = _put(out, S, tb, EV[i, EV_TB], EV[i, EV_TC])
    _group(splits, S, 1)
    return out


# == the log =====================================================================================

@njit(cache=True)
def _log(logv: np.ndarray, S: np.ndarray, kind: int, code: int, slot: int, values: np.ndarray) -> np.ndarray:
    n = len(values)
    used = S[S_NLOG]
    if used + 4 + n > len(logv):
        grown = np.empty(max(2 * len(logv), used + 4 + n + 64), np.int64)
        grown[:used] = logv[:used]
        logv = grown
    logv[used] = kind
    logv[used + 1] = code
    logv[used + 2] = slot
    logv[used + 3] = n
    logv[used + 4:used + 4 + n] = values
    S[S_NLOG] = used + 4 + n
    return logv


@njit(cache=True, inline='always')
def _two(a: int, b: int) -> np.ndarray:
    v = np.empty(2, np.int64)
    v[0] = a
    v[1] = b
    return v


# == the pool (replay.pool.PagePool) ============================================================

@njit(cache=True, inline='always')
def _free_count(S: np.ndarray) -> int:
    return S[S_FLEN] - S[S_HEAD] + S[S_POOL_PAGES] - S[S_FRESH]


@njit(cache=True, inline='always')
def _available(S: np.ndarray) -> int:
    return _free_count(S) + S[S_NREL]


@njit(cache=True)
def _merge(free: np.ndarray, rel: np.ndarray, S: np.ndarray) -> np.ndarray:
    """``merge_and_sort_free``: the release list joins the free list, all sorted."""
    if S[S_NREL] == 0:
        return free
    head = S[S_FLEN] - S[S_HEAD]
    n = head + S[S_NREL]
    merged = np.empty(max(n, 16), np.int64)
    fresh = S[S_FRESH]
    if fresh <= 8 * n:  # (dense: counted, in one pass over the pages handed out so far; every id is below fresh)
        counts = np.zeros(fresh, np.int32)
        for j in range(S[S_HEAD], S[S_FLEN]):
            counts[free[j]] += 1
        for j in range(S[S_NREL]):
            counts[rel[j]] += 1
        m = 0
        for page in range(fresh):
            for _ in range(counts[page]):
                merged[m] = page
                m += 1
    else:
        merged[:head] = free[S[S_HEAD]:S[S_FLEN]]
        merged[head:n] = rel[:S[S_NREL]]
        merged[:n].sort()
    S[S_HEAD] = 0
    S[S_FLEN] = n
    S[S_NREL] = 0
    S[S_MERGES] += 1
    return merged


@njit(cache=True)
def _take(free: np.ndarray, S: np.ndarray, n: int, dst: np.ndarray, pos: int) -> None:
    """``n`` pages from the free list's head (then the pages never handed out) into ``dst[pos:]``."""
    h = min(n, S[S_FLEN] - S[S_HEAD])
    dst[pos:pos + h] = free[S[S_HEAD]:S[S_HEAD] + h]
    S[S_HEAD] += h
    for k in range(n - h):
        dst[pos + h + k] = S[S_FRESH] + k
    S[S_FRESH] += n - h


@njit(cache=True)
def _release(rel: np.ndarray, S: np.ndarray, src: np.ndarray, a: int, b: int) -> np.ndarray:
    n = b - a
    if n <= 0:
        return rel
    used = S[S_NREL]
    if used + n > len(rel):
        grown = np.empty(max(2 * len(rel), used + n + 64), np.int64)
        grown[:used] = rel[:used]
        rel = grown
    rel[used:used + n] = src[a:b]
    S[S_NREL] = used + n
    return rel


# == each request's pages (the arena) ===========================================================

@njit(cache=True)
def _segment(arena: np.ndarray, R: np.ndarray, S: np.ndarray, slot: int, cap: int) -> np.ndarray:
    """Room for ``cap`` pages of ``slot``'s (its earlier segment, if any, let go): the arena compacted
    (the segments of the requests still known kept) and grown where it is full."""
    if S[S_ARENA] + cap > len(arena):
        live = 0
        for s in range(S[S_NSLOTS]):
            if s != slot and R[s, R_CAP] > 0 and not R[s, R_DEAD]:
                live += R[s, R_CAP]
        size = max(len(arena), 2 * (live + cap) + 1024)
        packed = np.empty(size, np.int64)
        used = 0
        for s in range(S[S_NSLOTS]):
            if s != slot and R[s, R_CAP] > 0 and not R[s, R_DEAD]:
                n = R[s, R_PLEN] + R[s, R_NSTEPS]
                off = R[s, R_OFF]
                packed[used:used + n] = arena[off:off + n]
                R[s, R_OFF] = used
                used += R[s, R_CAP]
        arena = packed
        S[S_ARENA] = used
        if used + cap > len(arena):  # (a segment keeps its room: grow again)
            grown = np.empty(2 * (used + cap) + 1024, np.int64)
            grown[:used] = arena[:used]
            arena = grown
    R[slot, R_OFF] = S[S_ARENA]
    R[slot, R_CAP] = cap
    S[S_ARENA] += cap
    return arena


# == the clock (replay.schedule.StepClock) =======================================================

@njit(cache=True, inline='always')
def _bisect_left(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline='always')
def _bisect_right(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit(cache=True, inline='always')
def _remaining(R: np.ndarray, S: np.ndarray, batch: np.ndarray, most: bool) -> int:
    """The least (``most``: the most) steps a running request still decoding has to take; 0 for none."""
    best = -1
    for k in range(S[S_NBATCH]):
        v = R[batch[k], R_LEFT]
        if v > 0 and (best < 0 or (v > best if most else v < best)):
            best = v
    return 0 if best < 0 else best


@njit(cache=True)
def _room(R: np.ndarray, S: np.ndarray, batch: np.ndarray, ends: np.ndarray, chains: np.ndarray, at: int) -> int:
    """StepClock.room: the most steps that may run before an event at ``at`` (-1: not known)."""
    room = _remaining(R, S, batch, False)
    for k in range(S[S_NENDS]):
        s = ends[k]
        later = 0
        if at >= 0 and R[s, R_HAS_CHAINS]:
            off = R[s, R_CH_OFF]
            m = R[s, R_CH_LEN]
            later = chains[off + m + _bisect_left(chains, off, off + m, at) - off]
        v = R[s, R_FIRST] + R[s, R_END_STEPS] - later - S[S_STEPS]
        if v < room:
            room = v
    return max(room, 0)


@njit(cache=True)
def _chains_room(chains: np.ndarray, R: np.ndarray, S: np.ndarray, n: int) -> np.ndarray:
    """Room for ``n`` more values of chains (the chains of the requests that hold one kept)."""
    if S[S_CHAINS] + n <= len(chains):
        return chains
    live = 0
    for s in range(S[S_NSLOTS]):
        if R[s, R_HAS_CHAINS]:
            live += 2 * R[s, R_CH_LEN] + 1
    packed = np.empty(max(len(chains), 2 * (live + n) + 256), np.int64)
    used = 0
    for s in range(S[S_NSLOTS]):
        if R[s, R_HAS_CHAINS]:
            k = 2 * R[s, R_CH_LEN] + 1
            off = R[s, R_CH_OFF]
            packed[used:used + k] = chains[off:off + k]
            R[s, R_CH_OFF] = used
            used += k
    S[S_CHAINS] = used
    return packed


@njit(cache=True)
def _join_chains(chains: np.ndarray, R: np.ndarray, S: np.ndarray, hz_s: np.ndarray, hz_f: np.ndarray,
                 hz_a: np.ndarray, after: int, finish_at: int) -> np.ndarray:
    """Horizon.chains(after, finish_at), kept as the start just placed (S_JOIN_*): the starts inside
    it, then the best chain from each (one more value)."""
    m = 0
    lo = 0
    hi = 0
    if S[S_HAS_HORIZON] and after >= 0:
        lo = _bisect_right(hz_s, 0, len(hz_s), after)
        hi = _bisect_left(hz_s, 0, len(hz_s), finish_at)
        for k in range(lo, hi):
            if hz_f[k] < finish_at:
                m += 1
    chains = _chains_room(chains, R, S, 2 * m + 1)
    off = S[S_CHAINS]
    fs = np.empty(m, np.int64)
    steps = np.empty(m, np.int64)
    j = 0
    for k in range(lo, hi):
        if hz_f[k] < finish_at:
            chains[off + j] = hz_s[k]
            fs[j] = hz_f[k]
            steps[j] = hz_a[k]
            j += 1
    best = off + m
    chains[best + m] = 0
    for k in range(m - 1, -1, -1):
        nxt = _bisect_right(chains, off + k, off + m, fs[k]) - off
        v = steps[k] + chains[best + nxt]
        chains[best + k] = max(chains[best + k + 1], v)
    S[S_CHAINS] = off + 2 * m + 1
    S[S_JOIN_HAS] = 1
    S[S_JOIN_OFF] = off
    S[S_JOIN_LEN] = m
    return chains


@njit(cache=True, inline='always')
def _count(position: float, starting: bool) -> int:
    if starting:
        return int(np.floor(position + 0.5))
    return int(np.ceil(position - EPS))


@njit(cache=True, inline='always')
def _round_half_even(x: float) -> int:
    """Python's ``round`` of a float to an integer."""
    f = np.floor(x)
    diff = x - f
    r = int(f)
    if diff > 0.5:
        return r + 1
    if diff < 0.5:
        return r
    return r + (r % 2)


@njit(cache=True)
def _before(R: np.ndarray, S: np.ndarray, F: np.ndarray, batch: np.ndarray, ends: np.ndarray, chains: np.ndarray,
            hz_s: np.ndarray, hz_f: np.ndarray, hz_a: np.ndarray, ts: int, fin_slot: int, fin_total: int,
            starting: bool, join_total: int, join_finish: int, at: int) -> tuple[int, bool, np.ndarray]:
    """StepClock.before: the steps that run before an event at ``ts`` (``fin_slot``: a running
    request's finish, -1 for none; ``join_total`` -1: no joining), whether they fit, and the chains."""
    room = _room(R, S, batch, ends, chains, at)
    least = 0
    if join_total >= 0:
        chains = _join_chains(chains, R, S, hz_s, hz_f, hz_a, at, join_finish)
        off = S[S_JOIN_OFF]
        m = S[S_JOIN_LEN]
        for k in range(S[S_NENDS]):
            s = ends[k]
            bound = R[s, R_FIRST] + R[s, R_END_STEPS] - join_total - S[S_STEPS]
            if R[s, R_END_FINISH] > join_finish:
                room = min(room, bound)
            else:
                j = _bisect_left(chains, off, off + m, R[s, R_END_FINISH]) - off
                least = max(least, bound + chains[off + m + j])
        room = max(room, least)
    if fin_slot >= 0 and R[fin_slot, R_HAS_FIRST]:
        due = R[fin_slot, R_FIRST] + fin_total - S[S_STEPS]
        S[S_STEPS] += max(due, 0)
        return max(due, 0), 0 <= due <= room, chains
    if room == 0 or not S[S_HAS_CADENCE] or not S[S_HAS_ANCHOR]:
        S[S_STEPS] += least
        return least, True, chains
    step_ns = F[F_STEP]
    position = (ts - S[S_ANCHOR_NS]) / step_ns
    slack = (F[F_TOL] + DRIFT_SIGMAS * F[F_DRIFT] * np.sqrt(abs(position))) / step_ns
    index = S[S_ANCHOR_IDX]
    steps = S[S_STEPS]
    c0 = min(max(index + _count(position - slack, starting) - steps, least), room)
    c1 = min(max(index + _count(position, starting) - steps, least), room)
    c2 = min(max(index + _count(position + slack, starting) - steps, least), room)
    if c0 != c2 and S[S_HAS_HORIZON] and at >= 0 and S[S_NENDS] > 0:
        n = S[S_NENDS]
        fixed_at = np.empty(n, np.int64)
        fixed_value = np.empty(n, np.int64)
        for k in range(n):
            s = ends[k]
            fixed_at[k] = R[s, R_END_FINISH]
            fixed_value[k] = R[s, R_FIRST] + R[s, R_END_STEPS]
        fits, value = _ceiling(at, fixed_at, fixed_value, hz_s, hz_f, hz_a)
        if fits and value - steps >= least:
            c0 = min(c0, value - steps)
            c1 = min(c1, value - steps)
            c2 = min(c2, value - steps)
    run = c1
    if c0 != c2:
        S[S_AMBIG] += 1
        if S[S_PICK] == PICK_EARLY:
            run = c0
        elif S[S_PICK] == PICK_LATE:
            run = c2
    S[S_STEPS] += run
    return run, True, chains


@njit(cache=True, inline='always')
def _time_of(S: np.ndarray, F: np.ndarray, step: int) -> tuple[bool, int]:
    if not S[S_HAS_CADENCE] or not S[S_HAS_ANCHOR]:
        return False, 0
    return True, S[S_ANCHOR_NS] + _round_half_even((step - S[S_ANCHOR_IDX]) * F[F_STEP])


@njit(cache=True, inline='always')
def _stamp(S: np.ndarray, F: np.ndarray, first: int, k: int, ts: int) -> int:
    """drive._stamps: the time of the k-th step of a run from the clock's step ``first``, never after ``ts``."""
    known, at = _time_of(S, F, first + k)
    return ts if not known or at > ts else at


@njit(cache=True)
def _unlist(members: np.ndarray, R: np.ndarray, S: np.ndarray, slot: int, count: int, place: int, flag: int) -> None:
    """``slot`` out of an unordered list (``members``, ``S[count]`` of them, each one's place in it
    ``R[.., place]``), its flag ``R[.., flag]`` cleared."""
    if not R[slot, flag]:
        return
    pos = R[slot, place]
    last = members[S[count] - 1]
    members[pos] = last
    R[last, place] = pos
    S[count] -= 1
    R[slot, flag] = 0


@njit(cache=True)
def _clock_leave(R: np.ndarray, S: np.ndarray, rowsl: np.ndarray, left: np.ndarray, recs: np.ndarray, slot: int
                 ) -> np.ndarray:
    """StepClock._leave: its row kept while a step record may still report one of its steps."""
    had = R[slot, R_HAS_ROW]
    if had:
        _unlist(rowsl, R, S, slot, S_NROWS, R_ROWS_POS, R_HAS_ROW)
    floor = S[S_STEPS]
    for k in range(S[S_NRECS]):
        if recs[k, Q_BEFORE] < floor:
            floor = recs[k, Q_BEFORE]
    floor -= 1
    if had and R[slot, R_ROW_FIRST] + R[slot, R_ROW_ALLOCS] >= floor:
        kept = 0
        for k in range(S[S_NLEFT]):
            if left[k, 0] + left[k, 1] >= floor:
                left[kept, 0] = left[k, 0]
                left[kept, 1] = left[k, 1]
                kept += 1
        if kept >= len(left):
            grown = np.empty((2 * len(left) + 16, 2), np.int64)
            grown[:kept] = left[:kept]
            left = grown
        left[kept, 0] = R[slot, R_ROW_FIRST]
        left[kept, 1] = R[slot, R_ROW_ALLOCS]
        S[S_NLEFT] = kept + 1
    return left


@njit(cache=True)
def _clock_forget(R: np.ndarray, S: np.ndarray, rowsl: np.ndarray, ends: np.ndarray, left: np.ndarray,
                  recs: np.ndarray, slot: int) -> np.ndarray:
    left = _clock_leave(R, S, rowsl, left, recs, slot)
    R[slot, R_HAS_FIRST] = 0
    _unlist(ends, R, S, slot, S_NENDS, R_ENDS_POS, R_HAS_END)
    R[slot, R_HAS_CHAINS] = 0
    return left


@njit(cache=True)
def _batches(R: np.ndarray, S: np.ndarray, rowsl: np.ndarray, left: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """StepClock._batches: the rows of each step from ``lo`` to ``hi``."""
    diff = np.zeros(hi - lo + 2, np.int64)
    for k in range(S[S_NROWS]):
        s = rowsl[k]
        first = max(R[s, R_ROW_FIRST] + 1, lo)
        last = min(R[s, R_ROW_FIRST] + R[s, R_ROW_ALLOCS], hi)
        if first <= last:
            diff[first - lo] += 1
            diff[last - lo + 1] -= 1
    for k in range(S[S_NLEFT]):
        first = max(left[k, 0] + 1, lo)
        last = min(left[k, 0] + left[k, 1], hi)
        if first <= last:
            diff[first - lo] += 1
            diff[last - lo + 1] -= 1
    out = np.empty(hi - lo + 1, np.int64)
    running = 0
    for k in range(hi - lo + 1):
        running += diff[k]
        out[k] = running
    return out


@njit(cache=True)
def _differs(logv: np.ndarray, S: np.ndarray, label: np.ndarray, code: int, values: np.ndarray) -> np.ndarray:
    """StepClock._differs: listed where no step count before was left open, else counted undecided.
    ``label``: the record's name (kind, seq, time)."""
    if S[S_AMBIG]:
        S[S_SUNDEC] += 1
        return logv
    v = np.empty(3 + len(values), np.int64)
    v[:3] = label
    v[3:] = values
    return _log(logv, S, L_STEP_DIFFERS, code, -1, v)


@njit(cache=True)
def _judge(logv: np.ndarray, S: np.ndarray, rows: int, running: int, label: np.ndarray, every: np.ndarray
           ) -> np.ndarray:
    if running == rows:
        S[S_SREC] += 1
        return logv
    v = np.empty(1 + len(every), np.int64)
    v[0] = running
    v[1:] = every
    return _differs(logv, S, label, SD_RUNNING, v)


@njit(cache=True)
def _settle_one(R: np.ndarray, S: np.ndarray, rowsl: np.ndarray, left: np.ndarray, logv: np.ndarray,
                reported: int, before: int, running: int, label: np.ndarray, after: int) -> np.ndarray:
    """StepClock._settle_one."""
    if S[S_BLIND]:
        S[S_SUNCHK] += 1
        return logv
    counted = label[0] != LABEL_RESTART
    wide = after - before > ROWS_CHECKED
    if wide:
        reports = _two(before - 1, after)
    else:
        nexts = _batches(R, S, rowsl, left, before + 1, after + 1)
        cand = np.empty(2 * (after - before + 1), np.int64)
        n = 0
        for c in range(before, after + 1):
            if not S[S_OVERLAP]:
                cand[n] = c
                n += 1
            elif nexts[c - before] > 0:
                cand[n] = c - 1
                n += 1
            else:
                cand[n] = c - 1
                cand[n + 1] = c
                n += 2
        reports = np.unique(cand[:n])
    if S[S_HAS_CHAIN]:
        lo = S[S_CH1] + reported - S[S_CH0]
        hi = S[S_CH2] + reported - S[S_CH0]
        if wide:
            a = max(lo, reports[0])
            b = min(hi, reports[1])
            fits = _two(a, b) if a <= b else np.empty(0, np.int64)
        else:
            keep = np.empty(len(reports), np.int64)
            n = 0
            for p in reports:
                if lo <= p <= hi:
                    keep[n] = p
                    n += 1
            fits = keep[:n]
        if len(fits) == 0:
            v = np.empty(5, np.int64)
            v[0] = reported - S[S_CH0]
            v[1] = lo
            v[2] = hi
            v[3] = reports[0]
            v[4] = reports[len(reports) - 1]
            logv = _differs(logv, S, label, SD_PLACE, v)
            S[S_HAS_CHAIN] = 1
            S[S_CH0] = reported
            S[S_CH1] = reports[0]
            S[S_CH2] = reports[len(reports) - 1]
            return logv
    else:
        fits = reports
    S[S_HAS_CHAIN] = 1
    S[S_CH0] = reported
    S[S_CH1] = fits[0]
    S[S_CH2] = fits[len(fits) - 1]
    if wide:
        first = fits[0]
        count = fits[len(fits) - 1] - fits[0] + 1
    else:
        first = fits[0]
        count = len(fits)
    if not counted:
        return logv
    if count > ROWS_CHECKED:
        S[S_SREC] += 1
        return logv
    last = fits[len(fits) - 1]
    span = _batches(R, S, rowsl, left, first, last)
    if wide:
        rows = np.unique(span)
    else:
        picked = np.empty(len(fits), np.int64)
        for k in range(len(fits)):
            picked[k] = span[fits[k] - first]
        rows = np.unique(picked)
    for r in rows:
        if r == running:
            S[S_SREC] += 1
            return logv
    return _judge(logv, S, rows[0], running, label, rows)


@njit(cache=True)
def _settle(R: np.ndarray, S: np.ndarray, rowsl: np.ndarray, left: np.ndarray, recs: np.ndarray, logv: np.ndarray,
            has_ts: bool, ts: int, finish: bool, beyond: int) -> np.ndarray:
    """StepClock.settle."""
    after = S[S_STEPS] + beyond
    done = 0
    for k in range(S[S_NRECS]):
        if recs[k, Q_HAS_READY] and has_ts and (finish or ts < recs[k, Q_READY]):
            break
        done += 1
        label = np.empty(3, np.int64)
        label[0] = recs[k, Q_LABEL]
        label[1] = recs[k, Q_LSEQ]
        label[2] = recs[k, Q_LNS]
        logv = _settle_one(R, S, rowsl, left, logv, recs[k, Q_REPORTED], recs[k, Q_BEFORE], recs[k, Q_RUNNING],
                           label, after)
    if done:
        n = S[S_NRECS] - done
        for k in range(n):
            recs[k, :] = recs[k + done, :]
        S[S_NRECS] = n
    return logv


@njit(cache=True)
def _rec_push(recs: np.ndarray, S: np.ndarray, reported: int, before: int, running: int, label: np.ndarray,
              has_ready: bool, ready: int) -> np.ndarray:
    n = S[S_NRECS]
    if n >= len(recs):
        grown = np.empty((2 * len(recs) + 8, NQ), np.int64)
        grown[:n] = recs[:n]
        recs = grown
    recs[n, Q_REPORTED] = reported
    recs[n, Q_BEFORE] = before
    recs[n, Q_RUNNING] = running
    recs[n, Q_LABEL] = label[0]
    recs[n, Q_LSEQ] = label[1]
    recs[n, Q_LNS] = label[2]
    recs[n, Q_HAS_READY] = 1 if has_ready else 0
    recs[n, Q_READY] = ready
    S[S_NRECS] = n + 1
    return recs


@njit(cache=True, inline='always')
def _resolution(ts: int) -> int:
    if ts % 1_000_000_000 == 0:
        return 1_000_000_000
    if ts % 1_000_000 == 0:
        return 1_000_000
    return 1_000


@njit(cache=True, inline='always')
def _has_step(reports_launched: int, going_on: bool, overlap: bool, step: int) -> bool:
    """Whether ``step`` is one StepClock._reports(launched, going_on) gives."""
    if not overlap:
        return step == reports_launched
    if going_on:
        return step == reports_launched - 1
    return step == reports_launched - 1 or step == reports_launched


# == the engine's decode steps (NodeEngine.advance) ===============================================

@njit(cache=True, inline='always')
def _step_page(arena: np.ndarray, R: np.ndarray, slot: int) -> int:
    """Where ``slot``'s next step page goes in the arena."""
    at = R[slot, R_OFF] + R[slot, R_PLEN] + R[slot, R_NSTEPS]
    R[slot, R_NSTEPS] += 1
    return at


@njit(cache=True, inline='always')
def _decoding(R: np.ndarray, batch: np.ndarray, nb: int, ps: int) -> tuple[int, int, int]:
    """The running requests still decoding (NodeEngine.decoding): how many, the fewest steps one still
    takes, and the fewest steps before one's next token starts a page (-1 for none)."""
    active = 0
    least = -1
    gap = -1
    for k in range(nb):
        s = batch[k]
        v = R[s, R_LEFT]
        if v > 0:
            active += 1
            if least < 0 or v < least:
                least = v
            g = (-R[s, R_TOKENS]) % ps
            if gap < 0 or g < gap:
                gap = g
    return active, least, gap


@njit(cache=True, inline='always')
def _quiet(R: np.ndarray, batch: np.ndarray, nb: int, steps: int) -> None:
    """``steps`` steps in which no running request starts a page: slots only."""
    for k in range(nb):
        s = batch[k]
        if R[s, R_LEFT] > 0:
            R[s, R_TOKENS] += steps
            R[s, R_LEFT] -= steps


@njit(cache=True)
def _advance(out: np.ndarray, splits: np.ndarray, logv: np.ndarray, free: np.ndarray, rel: np.ndarray,
             arena: np.ndarray, R: np.ndarray, S: np.ndarray, F: np.ndarray, batch: np.ndarray, ct: np.ndarray,
             co: np.ndarray, rid_text: np.ndarray, nsteps: int, first: int, ts: int
             ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """NodeEngine.advance of ``nsteps`` steps stamped as drive._stamps(clock, first, ts): the steps run,
    and the (maybe grown) output, log and free list."""
    ps = S[S_PS]
    nb = S[S_NBATCH]
    if nsteps > 0:  # a first step into a prompt page the transfer left unwritten writes it
        for k in range(nb):
            s = batch[k]
            if R[s, R_LEFT] > 0 and R[s, R_FIRST_WRITE] >= 0 and R[s, R_LEFT] == R[s, R_ALLOCS]:
                page = np.empty(1, np.int64)
                page[0] = R[s, R_FIRST_WRITE]
                out = _kv(out, S, ct, co, R, rid_text, _stamp(S, F, first, 0, ts), s, C_WRITE, page, 0, 1,
                          C_SRC_DECODE)
                _group(splits, S, 1)
                R[s, R_FIRST_WRITE] = -1
    ran = 0
    while ran < nsteps:
        active, least, gap = _decoding(R, batch, nb, ps)
        if active == 0:
            break
        if ps > 1 and (active <= _free_count(S) or S[S_NREL] == 0):
            quiet = min(nsteps - ran, min(least, gap))
            if quiet == nsteps - ran:
                _quiet(R, batch, nb, quiet)
                ran += quiet
                continue
        # -- replay.steps.run and NodeEngine._run: the steps that take pages from the free list alone
        done = 0
        taken = 0
        blocked = False
        free_n = _free_count(S)
        released = S[S_NREL]
        todo = nsteps - ran
        while done < todo:
            act = 0
            lst = todo - done
            gp = todo
            for k in range(nb):
                s = batch[k]
                v = R[s, R_LEFT]
                if v > 0:
                    act += 1
                    if v < lst:
                        lst = v
                    if ps > 1:
                        g = (ps - R[s, R_TOKENS] % ps) % ps
                        if g < gp:
                            gp = g
            if act == 0:
                break
            quiet = 0 if ps == 1 else min(lst, gp)
            if quiet > 0:
                if act > free_n and released > 0:
                    blocked = True
                    break
                _quiet(R, batch, nb, quiet)
                done += quiet
                continue
            need = 0
            for k in range(nb):
                s = batch[k]
                if R[s, R_LEFT] > 0 and R[s, R_TOKENS] % ps == 0:
                    need += 1
            merges = (need > free_n) if ps == 1 else (act > free_n)
            if (merges and released > 0) or need > free_n:
                blocked = True
                break
            stamp = _stamp(S, F, first, ran + done, ts) if need else 0
            for k in range(nb):
                s = batch[k]
                if R[s, R_LEFT] > 0:
                    if R[s, R_TOKENS] % ps == 0:
                        at = _step_page(arena, R, s)
                        _take(free, S, 1, arena, at)
                        for op, tail in ((C_ALLOC, C_END), (C_WRITE, C_SRC_DECODE), (C_READ, C_END)):
                            out = _kv(out, S, ct, co, R, rid_text, stamp, s, op, arena, at, at + 1, tail)
                        taken += 1
                    R[s, R_TOKENS] += 1
                    R[s, R_LEFT] -= 1
            free_n -= need
            done += 1
        if taken:
            _group(splits, S, 3 * taken)
        ran += done
        if not blocked:
            continue
        # -- the pool must do more than hand out free pages (merge, too few): a step here
        active, least, gap = _decoding(R, batch, nb, ps)
        quiet = min(nsteps - ran, min(least, gap if ps > 1 else 0))
        if quiet:
            if active > _free_count(S):  # (alloc_decode(0, batch): a step without a new page still may merge)
                free = _merge(free, rel, S)
            _quiet(R, batch, nb, quiet)
            ran += quiet
            continue
        # NodeEngine._step: one step with at least one new page
        stamp = _stamp(S, F, first, ran, ts)
        need = 0
        first_row = -1
        for k in range(nb):
            s = batch[k]
            if R[s, R_LEFT] > 0:
                if first_row < 0:
                    first_row = s
                if R[s, R_TOKENS] % ps == 0:
                    need += 1
        if ps == 1:  # try_alloc
            if _free_count(S) < need:
                free = _merge(free, rel, S)
            got = need <= _free_count(S)
        else:  # alloc_decode
            if active > _free_count(S):
                free = _merge(free, rel, S)
            got = need <= _free_count(S)
        if not got:
            S[S_STARVED] += 1
            if S[S_CONFIRM] and R[first_row, R_SERVED]:
                logv = _log(logv, S, L_DISAGREE, D_STARVED, first_row, _two(need, _available(S)))
        for k in range(nb):
            s = batch[k]
            if R[s, R_LEFT] > 0:
                if got and R[s, R_TOKENS] % ps == 0:
                    at = _step_page(arena, R, s)
                    _take(free, S, 1, arena, at)
                    for op, tail in ((C_ALLOC, C_END), (C_WRITE, C_SRC_DECODE), (C_READ, C_END)):
                        out = _kv(out, S, ct, co, R, rid_text, stamp, s, op, arena, at, at + 1, tail)
                        _group(splits, S, 1)
                R[s, R_TOKENS] += 1
                R[s, R_LEFT] -= 1
        ran += 1
    return ran, out, logv, free


# == the engine's events (NodeEngine._decode) ======================================================

@njit(cache=True, inline='always')
def _decode_steps(outputs: int, overlap: bool) -> int:
    return 0 if outputs < 2 else outputs - 1 + (1 if overlap else 0)


@njit(cache=True, inline='always')
def _pages_for(tokens: int, ps: int) -> int:
    return -(-tokens // ps)


@njit(cache=True)
def _batch_remove(batch: np.ndarray, R: np.ndarray, S: np.ndarray, slot: int) -> None:
    """NodeEngine._leave: out of the running batch, the others' order kept."""
    if not R[slot, R_IN_BATCH]:
        return
    n = S[S_NBATCH]
    j = 0
    for k in range(n):
        if batch[k] == slot:
            continue
        batch[j] = batch[k]
        j += 1
    S[S_NBATCH] = j
    R[slot, R_IN_BATCH] = 0


@njit(cache=True)
def _free_request(out: np.ndarray, splits: np.ndarray, rel: np.ndarray, arena: np.ndarray, R: np.ndarray,
                  S: np.ndarray, batch: np.ndarray, ct: np.ndarray, co: np.ndarray, rid_text: np.ndarray,
                  ts: int, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """NodeEngine._free (no prefix cache on decode): every page it holds freed, in one record."""
    if not R[slot, R_HELD] or R[slot, R_RELEASED]:
        return out, rel
    R[slot, R_RELEASED] = 1
    if R[slot, R_ALLOCS]:
        _batch_remove(batch, R, S, slot)
    n = (R[slot, R_PLEN] if R[slot, R_HAS_PROMPT] else 0) + R[slot, R_NSTEPS]
    if n:
        off = R[slot, R_OFF]
        out = _kv(out, S, ct, co, R, rid_text, ts, slot, C_FREE, arena, off, off + n, C_END)
        _group(splits, S, 1)
        rel = _release(rel, S, arena, off, off + n)
    return out, rel


@njit(cache=True)
def _handle(out: np.ndarray, splits: np.ndarray, logv: np.ndarray, free: np.ndarray, rel: np.ndarray,
            arena: np.ndarray, R: np.ndarray, S: np.ndarray, EV: np.ndarray, i: int, tb: np.ndarray,
            batch: np.ndarray, ct: np.ndarray, co: np.ndarray, rid_text: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """NodeEngine.handle of event ``i`` on a decode node."""
    kind = EV[i, EV_KIND]
    slot = EV[i, EV_SLOT]
    implied = EV[i, EV_IMPLIED]
    if slot < 0 or kind == K_STEP or not R[slot, R_PLAN]:
        if not implied:
            out = _logged(out, splits, S, EV, i, tb)
        return out, logv, free, rel, arena
    if R[slot, R_ROUTER_REJ] or R[slot, R_PREFILL_REJ]:
        return out, logv, free, rel, arena
    R[slot, R_HELD] = 1
    ts = EV[i, EV_TS]
    event = EV[i, EV_EVENT]
    ps = S[S_PS]
    if kind == K_TRANSFER:
        if event != E_COMPLETED or not R[slot, R_HAS_PROMPT]:
            if not R[slot, R_ENDED] and not implied:
                out = _logged(out, splits, S, EV, i, tb)
            return out, logv, free, rel, arena
        n = min(_pages_for(R[slot, R_KV], ps), R[slot, R_PLEN])
        off = R[slot, R_OFF]
        if not implied:
            out = _put(out, S, tb, EV[i, EV_WA], EV[i, EV_WB])
            out = _seq(out, S)
            out = _put(out, S, tb, EV[i, EV_WB], EV[i, EV_WC])
            out = _pages(out, S, arena, off, off + n)
            out = _put(out, S, tb, EV[i, EV_WC], EV[i, EV_WD])
            _group(splits, S, 1)
        out = _kv(out, S, ct, co, R, rid_text, ts, slot, C_WRITE, arena, off, off + n, C_SRC_TRANSFER)
        _group(splits, S, 1)
        return out, logv, free, rel, arena
    if R[slot, R_ENDED]:
        return out, logv, free, rel, arena
    if event == E_ADMITTED:  # NodeEngine._take_prompt_pages, its rejection logged
        tokens = R[slot, R_PROMPT]
        need = _pages_for(tokens, ps)
        if need > MAX_REQUEST_PAGES:
            logv = _log(logv, S, L_DISAGREE, D_BEYOND_PROMPT, slot, _two(tokens, need))
            out = _logged(out, splits, S, EV, i, tb)
            return out, logv, free, rel, arena
        # larger than the whole pool (400), or more pages than it has free (503): ended, its rejection
        # logged; confirming a request the logs show served, the logs followed, the disagreement listed
        short = tokens > S[S_POOL_TOKENS] or need > _available(S)
        if short:
            whole = tokens > S[S_POOL_TOKENS]
            if S[S_CONFIRM] and R[slot, R_SERVED]:
                logv = _log(logv, S, L_DISAGREE, D_SUPPLY_PROMPT if whole else D_SUPPLY_PAGES, slot,
                            _two(tokens, S[S_POOL_TOKENS]) if whole else _two(need, _available(S)))
                out = _logged(out, splits, S, EV, i, tb)
                return out, logv, free, rel, arena
            R[slot, R_ENDED] = 1
            out = _engine_record(out, S, ct, co, R, rid_text, ts, slot, C_REJ_EXC if whole else C_REJ_POOL)
            _group(splits, S, 1)
            out = _engine_record(out, S, ct, co, R, rid_text, ts, slot, C_FIN_EXC if whole else C_FIN_POOL)
            _group(splits, S, 1)
            return out, logv, free, rel, arena
        if ps == 1:  # PagePool.alloc
            if _free_count(S) < need:
                free = _merge(free, rel, S)
        elif tokens // ps + 2 > _free_count(S):  # PagePool.alloc_extend of one request
            free = _merge(free, rel, S)
        allocs = _decode_steps(R[slot, R_OUTPUTS], S[S_OVERLAP] != 0)
        extra = 0
        if allocs > 0 and _pages_for(tokens + allocs, ps) <= MAX_REQUEST_PAGES:
            extra = allocs // ps + 1
        arena = _segment(arena, R, S, slot, need + extra)
        _take(free, S, need, arena, R[slot, R_OFF])
        R[slot, R_PLEN] = need
        R[slot, R_NSTEPS] = 0
        out = _logged(out, splits, S, EV, i, tb)
        R[slot, R_HAS_PROMPT] = 1
        off = R[slot, R_OFF]
        out = _kv(out, S, ct, co, R, rid_text, ts, slot, C_ALLOC, arena, off, off + need, C_END)
        _group(splits, S, 1)
        return out, logv, free, rel, arena
    if event == E_DECODE_STARTED and R[slot, R_HAS_PROMPT]:  # NodeEngine._decode_start
        out = _logged(out, splits, S, EV, i, tb)
        R[slot, R_READING] = 1
        off = R[slot, R_OFF]
        plen = R[slot, R_PLEN]
        out = _kv(out, S, ct, co, R, rid_text, ts, slot, C_READ, arena, off, off + plen, C_END)
        _group(splits, S, 1)
        tokens = R[slot, R_PROMPT]
        R[slot, R_TOKENS] = tokens
        allocs = _decode_steps(R[slot, R_OUTPUTS], S[S_OVERLAP] != 0)
        R[slot, R_ALLOCS] = allocs
        R[slot, R_LEFT] = allocs
        last = tokens // ps
        if allocs and tokens % ps and _pages_for(R[slot, R_KV], ps) <= last < plen:
            R[slot, R_FIRST_WRITE] = arena[off + last]
        row = _pages_for(tokens + allocs, ps)
        if row > MAX_REQUEST_PAGES:
            logv = _log(logv, S, L_DISAGREE, D_BEYOND_ROW, slot, _two(R[slot, R_OUTPUTS], row))
            R[slot, R_ALLOCS] = 0
            R[slot, R_LEFT] = 0
        if R[slot, R_ALLOCS]:
            batch[S[S_NBATCH]] = slot
            S[S_NBATCH] += 1
            R[slot, R_IN_BATCH] = 1
        return out, logv, free, rel, arena
    if event == E_DECODE_STARTED and S[S_CONFIRM] and R[slot, R_SERVED] and \
            _pages_for(R[slot, R_KV], ps) < _pages_for(R[slot, R_PROMPT], ps):
        logv = _log(logv, S, L_UNSUPPLIED, 0, slot, np.empty(0, np.int64))
    out = _logged(out, splits, S, EV, i, tb)
    if event == E_FINISHED or event == E_REJECTED:
        out, rel = _free_request(out, splits, rel, arena, R, S, batch, ct, co, rid_text, ts, slot)
    return out, logv, free, rel, arena


# == the node's loop (drive.replay_node, decode) =====================================================

@njit(cache=True)
def run(EV: np.ndarray, n_events: int, tb: np.ndarray, R: np.ndarray, rid_text: np.ndarray, S: np.ndarray,
        F: np.ndarray, hz_s: np.ndarray, hz_f: np.ndarray, hz_a: np.ndarray, ct: np.ndarray, co: np.ndarray,
        free: np.ndarray, rel: np.ndarray, arena: np.ndarray, chains: np.ndarray, batch: np.ndarray,
        ends: np.ndarray, rowsl: np.ndarray, left: np.ndarray, recs: np.ndarray, out: np.ndarray,
        splits: np.ndarray, logv: np.ndarray
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Replay events ``0 .. n_events - 1`` of ``EV``; returns the state's arrays that may have grown:
    free, rel, arena, chains, left, recs, out, logv. ``S[S_ERROR]`` set: stopped where the Python
    raises."""
    overlap = S[S_OVERLAP] != 0
    for i in range(n_events):
        if S[S_ERROR]:
            break
        kind = EV[i, EV_KIND]
        slot = EV[i, EV_SLOT]
        if kind == K_FORGET:  # drive's forget: a request still in the batch decodes on (deferred)
            if not R[slot, R_IN_BATCH]:
                R[slot, R_DEAD] = 1
            continue
        if EV[i, EV_ADMIT]:  # drive's admit: its plan, read with its first record
            R[slot, R_PLAN] = 1
            R[slot, R_SERVED] = EV[i, EV_SERVED]
        ts = EV[i, EV_TS]
        at = EV[i, EV_AT]
        if kind == K_STEP and S[S_CONFIRM]:  # drive's step_record
            S[S_CLOCK] = 1
            first = S[S_STEPS]
            label = np.empty(3, np.int64)
            label[0] = LABEL_SEQ if EV[i, EV_HAS_SEQ] else LABEL_AT
            label[1] = EV[i, EV_SEQ]
            label[2] = ts
            running = EV[i, EV_RUNNING]
            # StepClock.reported
            if not S[S_HAS_REPORTED] or EV[i, EV_STEPS] < 0:
                S[S_HAS_REPORTED] = 1
                S[S_REPORTED] = 0
                S[S_HAS_CHAIN] = 0
            else:
                S[S_REPORTED] += EV[i, EV_STEPS]
            has_step = False
            step = 0
            if EV[i, EV_HAS_SEQ] and S[S_NRECS] == 0 and not S[S_BLIND] and S[S_HAS_CHAIN] and S[S_CH1] == S[S_CH2]:
                has_step = True
                step = S[S_CH1] + S[S_REPORTED] - S[S_CH0]
            else:
                has_ready = not EV[i, EV_HAS_SEQ]
                recs = _rec_push(recs, S, S[S_REPORTED], S[S_STEPS], running, label, has_ready,
                                 ts + _resolution(ts) if has_ready else 0)
            pinned = False
            if has_step:
                room = _room(R, S, batch, ends, chains, at)
                gap = step - S[S_STEPS]
                if 0 <= gap <= room:
                    ran, out, logv, free = _advance(out, splits, logv, free, rel, arena, R, S, F, batch, ct, co,
                                                    rid_text, gap + 1 if overlap and gap < room else gap, first, ts)
                    S[S_STEPS] += ran
                # StepClock.pinned
                going_on = _batches(R, S, rowsl, left, S[S_STEPS] + 1, S[S_STEPS] + 1)[0] > 0
                if _has_step(S[S_STEPS], going_on, overlap, step):
                    rows = _batches(R, S, rowsl, left, step, step)[0]
                    logv = _judge(logv, S, rows, running, label, _two(rows, 0)[:1])
                    S[S_HAS_CHAIN] = 1
                    S[S_CH0] = S[S_REPORTED]
                    S[S_CH1] = step
                    S[S_CH2] = step
                    pinned = True
                else:
                    since = S[S_REPORTED] - (S[S_CH0] if S[S_HAS_CHAIN] else 0)
                    v = np.empty(3, np.int64)
                    v[0] = since
                    v[1] = step
                    v[2] = S[S_STEPS]
                    logv = _differs(logv, S, label, SD_PINNED, v)
                    S[S_HAS_CHAIN] = 0
                    restart = np.empty(3, np.int64)
                    restart[0] = LABEL_RESTART
                    restart[1] = 0
                    restart[2] = 0
                    recs = _rec_push(recs, S, S[S_REPORTED], S[S_STEPS], running, restart, False, 0)
            if not pinned and EV[i, EV_HAS_SEQ]:
                doubts = S[S_AMBIG]
                run_, _, chains = _before(R, S, F, batch, ends, chains, hz_s, hz_f, hz_a, ts, -1, 0, False, -1, 0,
                                          at)
                _, out, logv, free = _advance(out, splits, logv, free, rel, arena, R, S, F, batch, ct, co, rid_text,
                                              run_, first, ts)
                # StepClock.placed
                exact = S[S_AMBIG] == doubts and S[S_HAS_CADENCE]
                n = S[S_NRECS] - 1
                reported = recs[n, Q_REPORTED]
                rec_running = recs[n, Q_RUNNING]
                rec_label = np.empty(3, np.int64)
                rec_label[0] = recs[n, Q_LABEL]
                rec_label[1] = recs[n, Q_LSEQ]
                rec_label[2] = recs[n, Q_LNS]
                if exact and n == 0:
                    S[S_NRECS] = 0
                    logv = _settle_one(R, S, rowsl, left, logv, reported, S[S_STEPS], rec_running, rec_label,
                                       S[S_STEPS])
                else:
                    recs[n, Q_BEFORE] = S[S_STEPS]
            out = _logged(out, splits, S, EV, i, tb)
            continue
        carried = EV[i, EV_CARRIED]
        if carried:  # a transfer end another node logged: it places no step
            out, logv, free, rel, arena = _handle(out, splits, logv, free, rel, arena, R, S, EV, i, tb, batch, ct,
                                                  co, rid_text)
            continue
        # drive's feed
        S[S_CLOCK] = 1
        event = EV[i, EV_EVENT]
        finishing = False
        fin_total = 0
        if slot >= 0 and kind == K_REQUEST and event == E_FINISHED and EV[i, EV_OK] and R[slot, R_HELD] \
                and R[slot, R_ALLOCS] and R[slot, R_IN_BATCH]:
            finishing = True
            fin_total = R[slot, R_ALLOCS]
        first = S[S_STEPS]
        starting = kind == K_REQUEST and event == E_DECODE_STARTED
        join_total = -1
        join_finish = 0
        if starting and slot >= 0 and R[slot, R_PLAN] and EV[i, EV_FINISH_AT] >= 0:
            join_total = _decode_steps(R[slot, R_OUTPUTS], overlap)
            join_finish = EV[i, EV_FINISH_AT]
        run_, fits, chains = _before(R, S, F, batch, ends, chains, hz_s, hz_f, hz_a, ts,
                                     slot if finishing else -1, fin_total, starting, join_total, join_finish, at)
        if not fits and finishing and S[S_CONFIRM] and R[slot, R_SERVED]:
            one = np.empty(1, np.int64)
            one[0] = fin_total
            logv = _log(logv, S, L_DISAGREE, D_STEPS_DIFFER, slot, one)
        _, out, logv, free = _advance(out, splits, logv, free, rel, arena, R, S, F, batch, ct, co, rid_text, run_,
                                      first, ts)
        logv = _settle(R, S, rowsl, left, recs, logv, True, ts, kind == K_REQUEST and event == E_FINISHED, 0)
        out, logv, free, rel, arena = _handle(out, splits, logv, free, rel, arena, R, S, EV, i, tb, batch, ct, co,
                                              rid_text)
        if slot < 0:
            continue
        if finishing:  # StepClock.finished
            had_first = R[slot, R_HAS_FIRST]
            first_step = R[slot, R_FIRST]
            R[slot, R_HAS_FIRST] = 0
            _unlist(ends, R, S, slot, S_NENDS, R_ENDS_POS, R_HAS_END)
            R[slot, R_HAS_CHAINS] = 0
            left = _clock_leave(R, S, rowsl, left, recs, slot)
            if had_first and fin_total >= 1 and S[S_HAS_CADENCE]:
                S[S_HAS_ANCHOR] = 1
                S[S_ANCHOR_NS] = ts - _round_half_even(F[F_FINISH])
                S[S_ANCHOR_IDX] = first_step + fin_total - 1
        elif starting and R[slot, R_IN_BATCH]:  # StepClock.started
            R[slot, R_HAS_FIRST] = 1
            R[slot, R_FIRST] = S[S_STEPS]
            if not R[slot, R_HAS_ROW]:
                rowsl[S[S_NROWS]] = slot
                R[slot, R_ROWS_POS] = S[S_NROWS]
                S[S_NROWS] += 1
                R[slot, R_HAS_ROW] = 1
            R[slot, R_ROW_FIRST] = S[S_STEPS]
            R[slot, R_ROW_ALLOCS] = R[slot, R_ALLOCS]
            if join_total >= 0:
                if not R[slot, R_HAS_END]:
                    ends[S[S_NENDS]] = slot
                    R[slot, R_ENDS_POS] = S[S_NENDS]
                    S[S_NENDS] += 1
                    R[slot, R_HAS_END] = 1
                R[slot, R_END_STEPS] = join_total
                R[slot, R_END_FINISH] = join_finish
                if S[S_JOIN_HAS]:
                    R[slot, R_HAS_CHAINS] = 1
                    R[slot, R_CH_OFF] = S[S_JOIN_OFF]
                    R[slot, R_CH_LEN] = S[S_JOIN_LEN]
            S[S_JOIN_HAS] = 0
            S[S_HAS_ANCHOR] = 1
            S[S_ANCHOR_NS] = ts
            S[S_ANCHOR_IDX] = S[S_STEPS]
        elif starting and (not R[slot, R_PLAN] or _decode_steps(R[slot, R_OUTPUTS], overlap) > 0):
            S[S_BLIND] = 1
            left = _clock_forget(R, S, rowsl, ends, left, recs, slot)
        elif not R[slot, R_IN_BATCH]:
            left = _clock_forget(R, S, rowsl, ends, left, recs, slot)
    return free, rel, arena, chains, left, recs, out, logv


@njit(cache=True)
def finish(R: np.ndarray, S: np.ndarray, batch: np.ndarray, rowsl: np.ndarray, left: np.ndarray, recs: np.ndarray,
           logv: np.ndarray) -> np.ndarray:
    """The node's records all read: its clock's step records settled, up to the batch's end."""
    if S[S_CLOCK]:
        return _settle(R, S, rowsl, left, recs, logv, False, 0, False, _remaining(R, S, batch, True))
    return logv
