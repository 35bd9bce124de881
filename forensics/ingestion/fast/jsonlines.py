"""The compiled fast path of ingest: plain canonical JSON lines read into typed columns.

A line takes the fast path only when it is a flat JSON object of known fields whose values are
plain: strings of printable ASCII without escapes, integers within int64 in canonical
form, spaces or tabs between tokens, no key twice, and each value of its field's JSON type.
For such a line the canonical JSON is the fields in name order, their values as written, so
it is built here byte for byte. Every other line (and every line of CSV, Parquet and adapted
logs) goes to the SQL validator (:func:`forensics.ingestion.validate.stage_sql`), which is the
reference: the fast path must give the same stage rows, and tests hold it to that.

numba compiles this module on first use and caches the machine code beside it, like
:mod:`forensics.exposure.kernel`.
"""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
from numba import njit

from forensics.ingestion.fast import rechash
from forensics.ingestion.validate import PLAIN_SOURCE, PLAUSIBLE_TIMES
from forensics.schema import (
    DISCRIMINATOR,
    FIELD_ORDER,
    FIELDS,
    KINDS,
    VARIANTS,
    FieldType,
    fields_of,
    own_fields,
    required_unless,
)

#: How a field's value is written on a line of the fast path (``kinds`` array).
ABSENT, STRING, INTEGER = 0, 1, 2
#: The JSON shape a field admits (``shapes`` array): a string, an integer, or either (ts).
SHAPE_STR, SHAPE_INT, SHAPE_EITHER = 0, 1, 2
MAX_DIGITS = 19  # int64's; a 19-digit integer is compared with its bound
NO_MIN = -(2**63)  # a field without a minimum
NO_MAX = 2**63 - 1  # a field without a maximum
_INT64_MAX = np.frombuffer(b"9223372036854775807", np.uint8)
_INT64_MIN = np.frombuffer(b"9223372036854775808", np.uint8)  # its magnitude


@njit(cache=True, nogil=True, inline="always")
def _at(buf: np.ndarray, p: int) -> int:
    """``buf[p]`` for a ``p`` known not to be negative.

    Through an unsigned index numba leaves out its check for a negative one (which counts from
    the end): in the loops over a line's bytes that check kept LLVM from simplifying them. With
    the row and field indices of the (field, line) columns unsigned too, and MurmurHash3's words
    read the same way (:mod:`forensics.ingestion.fast.rechash`), :func:`plain_columns` of a block of 245,760
    lines went from 270-283 to 202-216 ms.
    """
    return buf[np.uint64(p)]


@njit(cache=True, nogil=True)
def _skip_space(buf: np.ndarray, p: int, end: int) -> int:
    while p < end and (_at(buf, p) == 32 or _at(buf, p) == 9):
        p += 1
    return p


@njit(cache=True, nogil=True)
def _plain_string_end(buf: np.ndarray, p: int, end: int) -> int:
    """Where the closing quote of a string whose content starts at ``p`` is; -1 if not plain."""
    while p < end:
        c = _at(buf, p)
        if c == 34:
            return p
        if c < 32 or c > 126 or c == 92:
            return -1
        p += 1
    return -1


@njit(cache=True, nogil=True)
def _field_of(buf: np.ndarray, start: int, stop: int, names: np.ndarray, name_at: np.ndarray,
              bucket: np.ndarray) -> int:
    """The index of the field named by ``buf[start:stop]``; -1 for a name the schema lacks.

    ``bucket[first byte, length]`` holds the fields with that first byte and length, -1 after.
    """
    n = stop - start
    if n == 0 or n >= bucket.shape[1] or buf[start] >= bucket.shape[0]:
        return -1
    for slot in range(bucket.shape[2]):
        f = bucket[buf[start], n, slot]
        if f < 0:
            return -1
        a = name_at[f]
        j = 1
        while j < n and _at(names, a + j) == _at(buf, start + j):
            j += 1
        if j == n:
            return f
    return -1


@njit(cache=True, nogil=True)
def _within(buf: np.ndarray, first: int, bound: np.ndarray) -> bool:
    """Whether the digits at ``first``, as many as ``bound`` has, are at most ``bound``."""
    for j in range(len(bound)):
        if buf[first + j] != bound[j]:
            return buf[first + j] < bound[j]
    return True


@njit(cache=True, nogil=True)
def _scan_line(buf: np.ndarray, p: int, end: int, names: np.ndarray, name_at: np.ndarray, bucket: np.ndarray,
               shapes: np.ndarray, i: np.uint64, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
               order: np.ndarray) -> int:
    """Read line ``i`` into column ``i`` of ``kinds``/``vstart``/``vstop``, its fields in line order
    into ``order``: how many fields it has, or -1 if it is not plain."""
    if end - p < 2 or _at(buf, p) != 123 or _at(buf, end - 1) != 125:
        return -1
    p = _skip_space(buf, p + 1, end)
    count = 0
    while True:
        if p >= end or _at(buf, p) != 34:
            return -1
        key_end = _plain_string_end(buf, p + 1, end)
        if key_end < 0:
            return -1
        f = _field_of(buf, p + 1, key_end, names, name_at, bucket)
        if f < 0 or kinds[f, i] != ABSENT:
            return -1
        order[count] = f
        count += 1
        p = _skip_space(buf, key_end + 1, end)
        if p >= end or _at(buf, p) != 58:
            return -1
        p = _skip_space(buf, p + 1, end)
        if p >= end:
            return -1
        c = _at(buf, p)
        if c == 34:
            stop = _plain_string_end(buf, p + 1, end)
            if stop < 0 or shapes[f] == SHAPE_INT:
                return -1
            kinds[f, i], vstart[f, i], vstop[f, i] = STRING, p + 1, stop
            p = stop + 1
        elif c == 45 or 48 <= c <= 57:
            q = p + 1 if c == 45 else p
            first = q
            while q < end and 48 <= _at(buf, q) <= 57:
                q += 1
            digits = q - first
            if digits == 0 or digits > MAX_DIGITS or (buf[first] == 48 and (digits > 1 or c == 45)):
                return -1  # no digits, too long, a leading zero, or -0
            if digits == MAX_DIGITS and not _within(buf, first, _INT64_MIN if c == 45 else _INT64_MAX):
                return -1  # beyond int64: the SQL path says out of range
            if shapes[f] == SHAPE_STR:
                return -1
            kinds[f, i], vstart[f, i], vstop[f, i] = INTEGER, p, q
            p = q
        else:
            return -1
        p = _skip_space(buf, p, end)
        if p >= end:
            return -1
        if _at(buf, p) == 44:
            p = _skip_space(buf, p + 1, end)
            continue
        return count if _at(buf, p) == 125 and p + 1 == end else -1


@njit(cache=True, nogil=True, inline="always")
def _field_line_columns(work: tuple[np.ndarray, np.ndarray, np.ndarray], width: int,
                        n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (field, line) columns as views of ``work``: how each value is written (all ABSENT to
    begin with), and where it starts and stops."""
    kinds = work[0][: width * n].reshape((width, n))
    kinds[:] = ABSENT
    return kinds, work[1][: width * n].reshape((width, n)), work[2][: width * n].reshape((width, n))


@njit(cache=True, nogil=True)
def scan(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, names: np.ndarray, name_at: np.ndarray,
         bucket: np.ndarray, shapes: np.ndarray, keys: np.ndarray, key_at: np.ndarray, longest: int,
         work: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[
             np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every line's fields: ``plain`` per line; per (field, line) how the value is written and
    where; and the hash of each plain line's canonical JSON (``keys`` holds ``"name":`` per field).

    Each canonical JSON is built in a scratch buffer of ``longest`` bytes (the longest line: a
    plain line's canonical JSON is never longer) and hashed there (:func:`canonical_json` gives
    them). The (field, line) columns are laid out in ``work`` (:func:`_work`: int8, int32, int32,
    each of at least fields x lines cells) and are views of it. Columns of lines that are not
    plain are left partly filled and must not be read.
    Returns (plain, kinds, vstart, vstop, hash high words, hash low words).
    """
    n = len(starts)
    width = len(shapes)
    plain = np.zeros(n, np.bool_)
    kinds, vstart, vstop = _field_line_columns(work, width, n)
    hash_hi = np.zeros(n, np.uint64)
    hash_lo = np.zeros(n, np.uint64)
    order = np.empty(width, np.int64)
    canon = np.empty(longest, np.uint8)
    for i in range(n):
        line = np.uint64(i)  # unsigned: no check for a negative index (see _at)
        count = _scan_line(buf, starts[i], stops[i], names, name_at, bucket, shapes, line, kinds, vstart, vstop,
                           order)
        if count > 0:
            plain[i] = True
            end = _canonical(canon, 0, buf, keys, key_at, order, count, kinds, vstart, vstop, line)
            hash_hi[i], hash_lo[i] = rechash.murmur3_one(canon, 0, end)
    return plain, kinds, vstart, vstop, hash_hi, hash_lo


@njit(cache=True)
def _canonicals(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray, names: np.ndarray, name_at: np.ndarray,
                bucket: np.ndarray, shapes: np.ndarray, keys: np.ndarray, key_at: np.ndarray,
                work: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The canonical JSON :func:`scan` builds and hashes for each plain line, end to end, and its
    offsets (a line that is not plain has none): to show and check, never on the ingest's path."""
    n, width = len(starts), len(shapes)
    kinds, vstart, vstop = _field_line_columns(work, width, n)
    order = np.empty(width, np.int64)
    canon = np.empty(len(buf), np.uint8)
    canon_at = np.zeros(n + 1, np.int64)
    c = 0
    for i in range(n):
        canon_at[i] = c
        line = np.uint64(i)
        count = _scan_line(buf, starts[i], stops[i], names, name_at, bucket, shapes, line, kinds, vstart, vstop,
                           order)
        if count > 0:
            c = _canonical(canon, c, buf, keys, key_at, order, count, kinds, vstart, vstop, line)
    canon_at[n] = c
    return canon_at, canon[:c]


@njit(cache=True, nogil=True)
def _canonical(out: np.ndarray, c: int, buf: np.ndarray, keys: np.ndarray, key_at: np.ndarray,
               order: np.ndarray, count: int, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
               i: np.uint64) -> int:
    """Write line ``i``'s canonical JSON at ``out[c]``: its fields sorted by name, values as written."""
    for a in range(1, count):  # insertion sort: a line has a handful of fields
        f = order[a]
        b = a - 1
        while b >= 0 and order[b] > f:
            order[b + 1] = order[b]
            b -= 1
        order[b + 1] = f
    out[c] = 123
    c += 1
    for a in range(count):
        f = order[a]
        if a:
            out[c] = 44
            c += 1
        c = _copy(out, c, keys, key_at[f], key_at[f + 1])
        quoted = kinds[f, i] == STRING
        if quoted:
            out[c] = 34
            c += 1
        c = _copy(out, c, buf, vstart[f, i], vstop[f, i])
        if quoted:
            out[c] = 34
            c += 1
    out[c] = 125
    return c + 1


@njit(cache=True, nogil=True, inline="always")
def _copy(dst: np.ndarray, at: int, src: np.ndarray, start: int, stop: int) -> int:
    """``src[start:stop]`` to ``dst[at:]``: where the copy ends in ``dst``.

    Unsigned indices (see :func:`_at`): the loop is a plain copy for LLVM.
    """
    n = max(stop - start, 0)
    d, s = np.uint64(at), np.uint64(start)
    for j in range(n):
        dst[d + np.uint64(j)] = src[s + np.uint64(j)]
    return at + n


@njit(cache=True, nogil=True)
def newlines(buf: np.ndarray, offset: int) -> np.ndarray:
    """Where the newlines of ``buf`` are, plus ``offset``. Counted first, then written: numpy's
    ``flatnonzero(buf == 10)`` takes a mask the size of ``buf``, fresh memory the kernel must zero
    (64 MB a read: 0.059 s, 0.041 s of it the kernel's; this, 0.027 s)."""
    n = 0
    for b in buf:
        if b == 10:
            n += 1
    out = np.empty(n, np.int64)
    k = 0
    for i in range(len(buf)):
        if buf[i] == 10:
            out[k] = i + offset
            k += 1
    return out


@njit(cache=True, nogil=True)
def gather(buf: np.ndarray, rows: np.ndarray, starts: np.ndarray,
           stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges ``starts[r]:stops[r]`` of ``rows``, end to end: (offsets, data)."""
    offsets = np.empty(len(rows) + 1, np.int64)
    total = 0
    for k in range(len(rows)):
        offsets[k] = total
        total += stops[rows[k]] - starts[rows[k]]
    offsets[len(rows)] = total
    data = np.empty(total, np.uint8)
    for k in range(len(rows)):
        _copy(data, offsets[k], buf, starts[rows[k]], stops[rows[k]])
    return offsets, data


@njit(cache=True, nogil=True)
def field_views(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
                fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrow string views of the string values of each of ``fields`` for ``rows``, in one pass
    over the rows (a pass per field read each line again: 0.077 -> 0.051 s for a block's dozen
    fields). Returns (views, valid), field by row.

    A view is 16 bytes: the length, then the text itself up to 12 bytes, or else its first 4
    bytes, buffer 0 and the offset (Arrow's StringView layout, little-endian). No text is copied.
    """
    m = len(rows)
    out = np.zeros((len(fields), m, 16), np.uint8)
    valid = np.zeros((len(fields), m), np.bool_)
    for k in range(m):
        i = np.uint64(rows[k])  # unsigned: no check for a negative index (see _at)
        for j in range(len(fields)):
            f = np.uint64(fields[j])
            if kinds[f, i] != STRING:
                continue
            valid[j, k] = True
            a = vstart[f, i]
            n = vstop[f, i] - a
            view = out[j, k]
            _put_int32(view, 0, n)
            if n <= 12:
                for q in range(n):
                    view[4 + q] = _at(buf, a + q)
            else:
                for q in range(4):
                    view[4 + q] = _at(buf, a + q)
                _put_int32(view, 12, a)
    return out, valid


def line_views(buf: np.ndarray, rows: np.ndarray, starts: np.ndarray,
               stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Arrow string views of the whole lines ``buf[starts[i]:stops[i]]`` of ``rows``: the lines as
    the one field of :func:`field_views`, a string on every line."""
    every = np.full((1, len(starts)), STRING, np.int8)
    out, valid = field_views(buf, rows, every, starts[None, :], stops[None, :], np.zeros(1, np.int64))
    return out[0], valid[0]


def _lines_where(buf: np.ndarray, rows: np.ndarray, where: np.ndarray, starts: np.ndarray,
                 stops: np.ndarray) -> pa.Array:
    """The lines of ``rows`` where ``where`` holds, the others null: a string-view array."""
    if not where.any():  # (nearly every block: nothing to build)
        return pa.nulls(len(rows), pa.string_view())
    if where.all():
        return text_views(buf, line_views(buf, rows, starts, stops))
    out = np.zeros((len(rows), 16), np.uint8)
    out[where] = line_views(buf, rows[where], starts, stops)[0]
    return text_views(buf, (out, where))


@njit(cache=True, nogil=True)
def field_integers(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
                   fields: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The integer values of each of ``fields`` for ``rows``, in one pass: (values, valid), field by row."""
    m = len(rows)
    values = np.zeros((len(fields), m), np.int64)
    valid = np.zeros((len(fields), m), np.bool_)
    for k in range(m):
        i = np.uint64(rows[k])  # unsigned: no check for a negative index (see _at)
        for j in range(len(fields)):
            f = np.uint64(fields[j])
            if kinds[f, i] == INTEGER:
                values[j, k] = _integer(buf, vstart[f, i], vstop[f, i])
                valid[j, k] = True
    return values, valid


@njit(cache=True, nogil=True)
def written(rows: np.ndarray, kinds: np.ndarray) -> np.ndarray:
    """Per field, whether any of ``rows`` has it."""
    present = np.zeros(kinds.shape[0], np.bool_)
    for f in range(kinds.shape[0]):
        for k in range(len(rows)):
            if kinds[f, np.uint64(rows[k])] != ABSENT:
                present[f] = True
                break
    return present


@njit(cache=True, nogil=True)
def _put_int32(row: np.ndarray, at: int, value: int) -> None:
    for j in range(4):
        row[at + j] = (value >> (8 * j)) & 255


@njit(cache=True, nogil=True)
def _integer(buf: np.ndarray, a: int, b: int) -> int:
    """The integer written at ``buf[a:b]`` (scan has checked it fits int64)."""
    negative = _at(buf, a) == 45
    v = 0
    for q in range(a + 1 if negative else a, b):  # negatives count down: -2**63 has no positive
        v = v * 10 - (_at(buf, q) - 48) if negative else v * 10 + (_at(buf, q) - 48)
    return v


@njit(cache=True, nogil=True)
def _digits(buf: np.ndarray, p: int, n: int) -> bool:
    for q in range(p, p + n):
        if not 48 <= _at(buf, q) <= 57:
            return False
    return True


@njit(cache=True, nogil=True)
def _number(buf: np.ndarray, p: int, n: int) -> int:
    """The value of the ``n`` digits at ``_at(buf, p)``."""
    v = 0
    for q in range(p, p + n):
        v = v * 10 + (_at(buf, q) - 48)
    return v


@njit(cache=True, nogil=True)
def _days_since_epoch(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a date of the proleptic Gregorian calendar (H. Hinnant's days_from_civil)."""
    y = year - 1 if month <= 2 else year
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


@njit(cache=True, nogil=True)
def _month_days(year: int, month: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month == 4 or month == 6 or month == 9 or month == 11 else 31


@njit(cache=True, nogil=True)
def _rfc3339_end(buf: np.ndarray, p: int, end: int) -> int:
    """Where the offset of the time text ``buf[p:end]`` starts, if it has the shape of an RFC 3339
    time with offset (``validate._RFC3339``): date, ``T``/``t``/space, time, up to 9 fraction
    digits, then ``Z``/``z`` or ``+hh:mm``/``-hh:mm``; -1 if not."""
    if end - p < 20:
        return -1
    if not (_digits(buf, p, 4) and _at(buf, p + 4) == 45 and _digits(buf, p + 5, 2) and _at(buf, p + 7) == 45
            and _digits(buf, p + 8, 2) and (_at(buf, p + 10) == 84 or _at(buf, p + 10) == 116 or _at(buf, p + 10) == 32)
            and _digits(buf, p + 11, 2) and _at(buf, p + 13) == 58 and _digits(buf, p + 14, 2)
            and _at(buf, p + 16) == 58 and _digits(buf, p + 17, 2)):
        return -1
    q = p + 19
    if _at(buf, q) == 46:
        r = q + 1
        while r < end and 48 <= _at(buf, r) <= 57:
            r += 1
        if r - q - 1 < 1 or r - q - 1 > 9:
            return -1
        q = r
    if end - q == 1:
        return q if _at(buf, q) == 90 or _at(buf, q) == 122 else -1
    if end - q == 6 and (_at(buf, q) == 43 or _at(buf, q) == 45) and _digits(buf, q + 1, 2) and _at(buf, q + 3) == 58 \
            and _digits(buf, q + 4, 2):
        return q
    return -1


_SCALE = np.array([1, 100_000, 10_000, 1_000, 100, 10, 1], np.int64)  # fraction digits -> microseconds
#: validate.PLAUSIBLE_TIMES in microseconds: a time outside [0, this) is left invalid here, for the
#: SQL checks to quarantine with the line kept (the fast path keeps the text of lines it leaves)
_LATE_US = int(np.datetime64(PLAUSIBLE_TIMES[1].removesuffix("+00"), "us").astype(np.int64))


@njit(cache=True, nogil=True)
def times(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
          f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Field ``f`` of ``rows`` as a time: (microseconds since the epoch UTC, valid, RFC 3339 shape).

    The microseconds are read where the time is written in the forms logs use: integer
    nanoseconds >= 0, or ``YYYY-MM-DDThh:mm:ss`` (``T`` or a space) with up to 6 fraction digits
    and ``Z`` or ``+hh:mm``/``-hh:mm``, every part in range, from 1970 to 2200. Any other time (lowercase, a leap
    second, nanoseconds, a date that does not exist) is left invalid, for SQL to cast as the
    validator does, where the text has the shape: this gives only what that cast gives.
    """
    m = len(rows)
    values = np.zeros(m, np.int64)
    valid = np.zeros(m, np.bool_)
    shape = np.zeros(m, np.bool_)
    for k in range(m):
        i = np.uint64(rows[k])  # unsigned: no check for a negative index (see _at)
        p = vstart[f, i]
        end = vstop[f, i]
        if kinds[f, i] == INTEGER:
            v = _integer(buf, p, end)
            if 0 <= v // 1000 < _LATE_US:
                values[k] = v // 1000
                valid[k] = True
            continue
        if kinds[f, i] != STRING:
            continue
        q = _rfc3339_end(buf, p, end)
        if q < 0:
            continue
        shape[k] = True
        year, month, day = _number(buf, p, 4), _number(buf, p + 5, 2), _number(buf, p + 8, 2)
        hour, minute, second = _number(buf, p + 11, 2), _number(buf, p + 14, 2), _number(buf, p + 17, 2)
        digits = q - p - 20 if q > p + 19 else 0
        if (_at(buf, p + 10) == 116 or year < 1 or month < 1 or month > 12 or day < 1 or day > _month_days(year, month)
                or hour > 23 or minute > 59 or second > 59 or digits > 6):
            continue
        if _at(buf, q) == 90:
            offset = 0
        elif _at(buf, q) == 43 or _at(buf, q) == 45:
            oh, om = _number(buf, q + 1, 2), _number(buf, q + 4, 2)
            if oh > 23 or om > 59:
                continue
            offset = oh * 3600 + om * 60 if _at(buf, q) == 43 else -(oh * 3600 + om * 60)
        else:
            continue
        seconds = _days_since_epoch(year, month, day) * 86400 + hour * 3600 + minute * 60 + second - offset
        us = seconds * 1_000_000 + (_number(buf, p + 20, digits) * _SCALE[digits] if digits else 0)
        if 0 <= us < _LATE_US:
            values[k] = us
            valid[k] = True
    return values, valid, shape


@njit(cache=True, nogil=True)
def page_ranges(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
                f: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Field ``f`` (a page list) parsed as ranges where it has the shape of ``validate._PAGES``.

    Returns (list offsets, lo, hi, valid, highest hi); a list of another shape is not valid.
    """
    m = len(rows)
    offsets = np.zeros(m + 1, np.int32)
    valid = np.zeros(m, np.bool_)
    top = np.zeros(m, np.int64)
    cap = 16
    lo = np.empty(cap, np.int64)
    hi = np.empty(cap, np.int64)
    n = 0
    for k in range(m):
        offsets[k] = n
        i = np.uint64(rows[k])  # unsigned: no check for a negative index (see _at)
        if kinds[f, i] != STRING:
            continue
        p = vstart[f, i]
        end = vstop[f, i]
        first = n
        good = p < end
        while good and p < end:
            a, b, p, good = _range_at(buf, p, end)
            if not good:
                break
            if n == cap:
                cap *= 2
                lo2 = np.empty(cap, np.int64)
                hi2 = np.empty(cap, np.int64)
                lo2[:n] = lo[:n]
                hi2[:n] = hi[:n]
                lo, hi = lo2, hi2
            lo[n], hi[n] = a, b
            n += 1
        if good:
            valid[k] = True
            t = hi[first]
            for r in range(first + 1, n):
                t = max(t, hi[r])
            top[k] = t
        else:
            n = first
    offsets[m] = n
    return offsets, lo[:n].copy(), hi[:n].copy(), valid, top


@njit(cache=True, nogil=True)
def _range_at(buf: np.ndarray, p: int, end: int) -> tuple[int, int, int, bool]:
    """The page range ``a`` or ``a-b`` at ``p`` of a list: (lo, hi, where the next range starts,
    whether the list is well formed so far: a range, then the end or a comma and more)."""
    a, p, good = _page_id(buf, p, end)
    b = a
    if good and p < end and _at(buf, p) == 45:
        b, p, good = _page_id(buf, p + 1, end)
    if not good or p == end:
        return a, b, p, good
    if _at(buf, p) != 44 or p + 1 >= end:  # not a comma, or a trailing one
        return a, b, p, False
    return a, b, p + 1, True


@njit(cache=True, nogil=True)
def _page_id(buf: np.ndarray, p: int, end: int) -> tuple[int, int, bool]:
    """A page id of 1 to 13 digits at ``p`` (a pool has at most 2^40 pages, the last one's id
    13 digits): (value, where it ends, whether there was one)."""
    v = 0
    q = p
    while q < end and q - p < 14 and 48 <= _at(buf, q) <= 57:
        v = v * 10 + (_at(buf, q) - 48)
        q += 1
    return v, q, 1 <= q - p <= 13


# --- the schema's rules, for lines that are plain ----------------------------------------------


@njit(cache=True, nogil=True)
def _same(buf: np.ndarray, a: int, b: int, pool: np.ndarray, pool_at: np.ndarray, t: int) -> bool:
    """Whether ``buf[a:b]`` is text ``t`` of the pool."""
    p = pool_at[t]
    if pool_at[t + 1] - p != b - a:
        return False
    for j in range(b - a):
        if _at(buf, a + j) != _at(pool, p + j):
            return False
    return True


@njit(cache=True, nogil=True)
def _pages_ok(buf: np.ndarray, p: int, end: int) -> bool:
    """Whether ``buf[p:end]`` is a page list of the shape ``validate._PAGES`` with every lo <= hi."""
    if p >= end:
        return False
    while p < end:
        a, b, p, good = _range_at(buf, p, end)
        if not good or a > b:
            return False
    return True


@njit(cache=True, nogil=True)
def rules(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray, vstop: np.ndarray,
          pool: np.ndarray, pool_at: np.ndarray, kind_text: np.ndarray, kind_disc: np.ndarray,
          var_kind: np.ndarray, var_text: np.ndarray, req_at: np.ndarray, req: np.ndarray,
          own_at: np.ndarray, own: np.ndarray, choice_at: np.ndarray, choice_text: np.ndarray,
          mins: np.ndarray, maxs: np.ndarray, is_pages: np.ndarray,
          common: np.ndarray, unless_at: np.ndarray, unless: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whether each row meets every rule of the schema but the time's (see :data:`RULES`), and
    its kind: an index of ``schema.KINDS``, or ``len(KINDS)`` for a kind that is none of them.

    ``common`` holds the indices of kind, seq and boot; ``unless`` (by variant, from ``unless_at``)
    pairs of field indices, the first required where the second is absent.
    """
    f_kind, f_seq, f_boot = common[0], common[1], common[2]
    ok = np.zeros(len(rows), np.bool_)
    codes = np.full(len(rows), len(kind_text), np.int8)
    for k in range(len(rows)):
        i = np.uint64(rows[k])  # unsigned: no check for a negative index (see _at)
        if kinds[f_kind, i] != STRING:
            continue
        kind = -1
        for c in range(len(kind_text)):
            if _same(buf, vstart[f_kind, i], vstop[f_kind, i], pool, pool_at, kind_text[c]):
                kind = c
                break
        if kind < 0:
            continue
        codes[k] = kind
        if kinds[f_seq, i] != ABSENT and _integer(buf, vstart[f_seq, i], vstop[f_seq, i]) < 0:
            continue
        if kinds[f_boot, i] != ABSENT and _integer(buf, vstart[f_boot, i], vstop[f_boot, i]) < 0:
            continue
        disc = kind_disc[kind]
        var = -1
        for v in range(len(var_kind)):
            if var_kind[v] == kind and (disc < 0 or (
                    kinds[disc, i] == STRING and _same(buf, vstart[disc, i], vstop[disc, i], pool, pool_at,
                                                       var_text[v]))):
                var = v
                break
        if var < 0:
            continue
        good = True
        for r in range(req_at[var], req_at[var + 1]):
            if kinds[req[r], i] == ABSENT:
                good = False
        for r in range(unless_at[var], unless_at[var + 1]):
            if kinds[unless[2 * r], i] == ABSENT and kinds[unless[2 * r + 1], i] == ABSENT:
                good = False
        for r in range(own_at[var], own_at[var + 1]):
            f = own[r]
            if not good:
                break
            if kinds[f, i] == ABSENT:
                continue
            a, b = vstart[f, i], vstop[f, i]
            if is_pages[f]:
                good = _pages_ok(buf, a, b)
            elif choice_at[f + 1] > choice_at[f]:
                good = False
                for c in range(choice_at[f], choice_at[f + 1]):
                    if _same(buf, a, b, pool, pool_at, choice_text[c]):
                        good = True
                        break
            elif mins[f] != NO_MIN or maxs[f] != NO_MAX:
                v = _integer(buf, a, b)
                good = mins[f] <= v <= maxs[f]
        ok[k] = good
    return ok, codes


# --- the two tables of a block ------------------------------------------------------------------

_NAMES = [n.encode() for n in FIELD_ORDER]
_NAME_BYTES = np.frombuffer(b"".join(_NAMES), np.uint8)
_NAME_AT = np.cumsum([0] + [len(n) for n in _NAMES]).astype(np.int64)
_KEYS = [b'"' + n + b'":' for n in _NAMES]
_KEY_BYTES = np.frombuffer(b"".join(_KEYS), np.uint8)
_KEY_AT = np.cumsum([0] + [len(k) for k in _KEYS]).astype(np.int64)
_SHAPE = {FieldType.STR: SHAPE_STR, FieldType.PAGES: SHAPE_STR, FieldType.INT: SHAPE_INT,
          FieldType.TS: SHAPE_EITHER}
_BUCKET = np.full((128, 32, 2), -1, np.int64)
for _f, _n in enumerate(_NAMES):
    _slot = int((_BUCKET[_n[0], len(_n)] >= 0).sum())
    assert _n[0] < 128 and len(_n) < 32 and _slot < 2, "more fields share a first letter and length"
    _BUCKET[_n[0], len(_n), _slot] = _f
_SHAPES = np.array([_SHAPE[FIELDS[n].type] for n in FIELD_ORDER], np.int8)
_INDEX = {n: i for i, n in enumerate(FIELD_ORDER)}


class _Texts:
    """Names and values the rules compare with, end to end in one pool."""

    def __init__(self) -> None:
        self.items: list[bytes] = []

    def add(self, text: str) -> int:
        self.items.append(text.encode())
        return len(self.items) - 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        pool = np.frombuffer(b"".join(self.items) or b"\0", np.uint8)
        at = np.cumsum([0] + [len(t) for t in self.items]).astype(np.int64)
        return pool, at


def _csr(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    at = np.cumsum([0] + [len(x) for x in lists]).astype(np.int64)
    return at, np.array([v for x in lists for v in x], np.int64)


def _rule_tables() -> tuple[np.ndarray, ...]:
    """The schema's declaration (forensics.schema) as the arrays :func:`rules` reads."""
    texts = _Texts()
    kind_text = np.array([texts.add(k) for k in KINDS], np.int64)
    discs = [DISCRIMINATOR[k] for k in KINDS]
    kind_disc = np.array([-1 if d is None else _INDEX[d] for d in discs], np.int64)
    var_kind, var_text, required, owned, unless = [], [], [], [], []
    for ki, kind in enumerate(KINDS):
        variants: list[str | None] = [*VARIANTS[kind]] or [None]
        for variant in variants:
            var_kind.append(ki)
            var_text.append(texts.add(variant) if variant is not None else -1)
            required.append([_INDEX[n] for n in fields_of(kind, variant)[0]])
            owned.append([_INDEX[n] for n in own_fields(kind, variant)])
            unless.append([_INDEX[n] for pair in required_unless(kind, variant) for n in pair])
    choices = [[texts.add(c) for c in FIELDS[n].choices] for n in FIELD_ORDER]
    mins = np.array([NO_MIN if FIELDS[n].min_value is None else FIELDS[n].min_value for n in FIELD_ORDER],
                    np.int64)
    maxs = np.array([NO_MAX if FIELDS[n].max_value is None else FIELDS[n].max_value for n in FIELD_ORDER],
                    np.int64)
    is_pages = np.array([FIELDS[n].type is FieldType.PAGES for n in FIELD_ORDER], np.bool_)
    pool, pool_at = texts.arrays()
    common = np.array([_INDEX["kind"], _INDEX["seq"], _INDEX["boot"]], np.int64)
    choice_at, choice_text = _csr(choices)
    unless_at, unless_fields = _csr(unless)
    return (pool, pool_at, kind_text, kind_disc, np.array(var_kind, np.int64), np.array(var_text, np.int64),
            *_csr(required), *_csr(owned), choice_at, choice_text, mins, maxs, is_pages, common,
            unless_at // 2, unless_fields)


#: The rules of log-schema.md section 4 that a plain line can break, but the time's: a known
#: kind and event/op, the fields they require, page lists, enumerations, minimums, seq and
#: boot not negative. The SQL chain is their reference; lines that break one go through it.
RULES = _rule_tables()
PAGE_RANGE = pa.struct([("lo", pa.int64()), ("hi", pa.int64())])


def _bitmap(valid: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def text_views(buf: np.ndarray, views_valid: tuple[np.ndarray, np.ndarray]) -> pa.Array:
    """A string-view array over ``buf`` (kept alive by the array) from :func:`field_views` or
    :func:`line_views`: (views, valid)."""
    out, valid = views_valid
    n = len(valid)
    if not valid.any():
        return pa.nulls(n, pa.string_view())
    bitmap = None if valid.all() else _bitmap(valid)
    return pa.Array.from_buffers(pa.string_view(), n, [bitmap, pa.py_buffer(out), pa.py_buffer(buf)])


def _text(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))


_UTC_MICROS = pa.timestamp("us", tz="UTC")


def _times(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    """Microseconds since the epoch as an Arrow time in UTC, which DuckDB reads as TIMESTAMPTZ."""
    n = len(values)
    return pa.Array.from_buffers(_UTC_MICROS, n, [_bitmap(valid), pa.py_buffer(values)], int(n - valid.sum()))


def _ints(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    n = len(values)
    return pa.Array.from_buffers(pa.int64(), n, [_bitmap(valid), pa.py_buffer(values)], int(n - valid.sum()))


def _field_columns(buf: np.ndarray, rows: np.ndarray, kinds: np.ndarray, vstart: np.ndarray,
                   vstop: np.ndarray) -> dict[str, pa.Array]:
    """The typed field columns of ``rows`` (page lists also as ranges); a field none of them has
    gets one shared column of nulls."""
    present = written(rows, kinds)
    no_text, no_int = pa.nulls(len(rows), pa.string_view()), pa.nulls(len(rows), pa.int64())
    # every present field's values at once, a pass over the rows for the texts and one for the integers
    texts = [_INDEX[n] for n in FIELD_ORDER if FIELDS[n].type is not FieldType.INT and present[_INDEX[n]]]
    numbers = [_INDEX[n] for n in FIELD_ORDER if FIELDS[n].type in (FieldType.INT, FieldType.TS)
               and present[_INDEX[n]]]
    views_of, views_valid = field_views(buf, rows, kinds, vstart, vstop, np.array(texts, np.int64))
    values_of, values_valid = field_integers(buf, rows, kinds, vstart, vstop, np.array(numbers, np.int64))
    text_at = {f: j for j, f in enumerate(texts)}
    int_at = {f: j for j, f in enumerate(numbers)}

    def text(f: int) -> pa.Array:
        j = text_at.get(f)
        return no_text if j is None else text_views(buf, (views_of[j], views_valid[j]))

    def ints(f: int) -> pa.Array:
        j = int_at.get(f)
        return no_int if j is None else _ints(values_of[j], values_valid[j])

    cols: dict[str, pa.Array] = {}
    for name in FIELD_ORDER:
        f = _INDEX[name]
        ftype = FIELDS[name].type
        if ftype is FieldType.INT:
            cols[name] = ints(f)
        elif ftype is FieldType.TS:
            cols["ts_text"] = text(f)
            cols["ts_int"] = ints(f)
            micros, valid, shape = times(buf, rows, kinds, vstart, vstop, f)
            cols["ts_shape"] = pa.array(shape)
            cols["ts_us"] = _times(micros, valid)
        else:
            cols[PLAIN_SOURCE.get(name, name)] = text(f)
    offsets, lo, hi, valid, top = page_ranges(buf, rows, kinds, vstart, vstop, _INDEX["pages"])
    ranges = pa.StructArray.from_arrays([pa.array(lo), pa.array(hi)], fields=list(PAGE_RANGE))
    cols["page_ranges"] = pa.ListArray.from_arrays(pa.array(offsets), ranges, mask=pa.array(~valid))
    cols["max_hi"] = _ints(top, valid)
    return cols


_thread = threading.local()


def _work(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """This thread's work arrays for :func:`scan`, of at least ``size`` cells, made once per thread.

    The (field, line) columns of a block of 245,760 lines take 77 MB; fresh for each block, the
    kernel mapped and zeroed them page by page. Nothing :func:`plain_columns` gives back points
    into them, so the thread's next block can use them again.
    """
    work: tuple[np.ndarray, np.ndarray, np.ndarray] | None = getattr(_thread, "work", None)
    if work is None or len(work[0]) < size:
        work = (np.empty(size, np.int8), np.empty(size, np.int32), np.empty(size, np.int32))
        _thread.work = work
    return work


def canonical_json(buf: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> pa.Array:
    """The canonical JSON of each line ``buf[starts[i]:stops[i]]`` as the fast path builds it
    (an empty string for a line it does not take)."""
    canon_at, canon = _canonicals(buf, starts, stops, _NAME_BYTES, _NAME_AT, _BUCKET, _SHAPES, _KEY_BYTES,
                                  _KEY_AT, _work(len(_SHAPES) * len(starts)))
    return _text(canon_at, canon)


def plain_columns(
    buf: np.ndarray, starts: np.ndarray, stops: np.ndarray,
) -> tuple[np.ndarray, list[tuple[str | None, np.ndarray, dict[str, pa.Array]]]]:
    """Which lines are plain, and per kind the plain lines' indices in the block and their
    columns for :func:`validate.plain_stage_sql` (``raw``, the text, for the lines a check may
    quarantine).

    ``starts``/``stops`` delimit each line in ``buf`` (without its terminator). The kinds come
    in the order of ``schema.KINDS``, then None for lines of a kind that is none of them; each
    kind's rows in file order. A kind's columns are built from its own rows, so a field no line
    of the kind has costs nothing.
    """
    longest = int((stops - starts).max()) if len(starts) else 0
    plain, kinds, vstart, vstop, hash_hi, hash_lo = scan(
        buf, starts, stops, _NAME_BYTES, _NAME_AT, _BUCKET, _SHAPES, _KEY_BYTES, _KEY_AT, longest,
        _work(len(_SHAPES) * len(starts)))
    every_row = np.flatnonzero(plain)
    hash_hi, hash_lo = hash_hi[every_row], hash_lo[every_row]
    rules_ok, codes = rules(buf, every_row, kinds, vstart, vstop, *RULES)
    out: list[tuple[str | None, np.ndarray, dict[str, pa.Array]]] = []
    for code, kind in enumerate((*KINDS, None)):
        pick = np.flatnonzero(codes == code)
        if not len(pick):
            continue
        rows = every_row[pick]
        cols = _field_columns(buf, rows, kinds, vstart, vstop)
        # the verbatim line, for the lines a check may quarantine: those that break a rule, and
        # those whose time is left to DuckDB's cast (0.11 s of the 2.08 M-record set's split)
        checked = ~(rules_ok[pick] & cols["ts_us"].is_valid().to_numpy(zero_copy_only=False))
        cols = {"raw": _lines_where(buf, rows, checked, starts, stops), **cols}
        cols["hash_hi"], cols["hash_lo"] = pa.array(hash_hi[pick]), pa.array(hash_lo[pick])
        cols["rules_ok"] = pa.array(rules_ok[pick])
        out.append((kind, rows, cols))
    return plain, out
