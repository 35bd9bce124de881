"""The page sweep of log-schema.md section 5: each (node, boot) once, in seq order, on page ranges.

The state of a (node, boot) is an interval map over page ids: sorted fragment starts, and per
fragment the content version and the requests reading it. An op on a page range splits the
map at the range's ends, visits the fragments inside, and merges equal neighbours again, so
its cost follows the number of distinct histories it touches, never the number of pages.

Holds (``alloc``/``share`` to ``free``) are kept per request as ranges: they matter only for
inferred reads, which start on every page the request holds at its ``decode_started``.

The sweep writes three tables of page ranges, all in the case's node/boot/request names:
``sweep_exposures`` (reader saw victim's version), ``uninitialized_reads`` and ``page_reads``
(reading intervals); ``analysis.sql`` aggregates them into the documented tables.
"""

from __future__ import annotations

from bisect import bisect_right

import duckdb
import pyarrow as pa

OPS = {"alloc": 0, "share": 1, "write": 2, "read": 3, "free": 4}
START = 5  # an inferred read at decode_started
NO_VERSION = -1

# One row per page range of a kv record, plus one per decode_started that starts an inferred
# read (a request with no read record on that node, in any boot), in sweep order.
EVENTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE sweep_requests AS
SELECT request_id, (row_number() OVER (ORDER BY request_id) - 1)::INTEGER AS rid
FROM (SELECT DISTINCT request_id FROM records WHERE request_id IS NOT NULL);

CREATE OR REPLACE TEMP TABLE sweep_node_boots AS
SELECT node, boot, (row_number() OVER (ORDER BY node, boot) - 1)::INTEGER AS nb
FROM (SELECT DISTINCT node, boot FROM records WHERE seq IS NOT NULL AND kind = 'kv');

CREATE OR REPLACE TEMP VIEW sweep_events AS
WITH kv AS (
  SELECT node, boot, seq, request_id,
         CASE op {" ".join(f"WHEN '{k}' THEN {v}" for k, v in OPS.items())} END::TINYINT AS op,
         unnest(page_ranges) AS rg
  FROM records WHERE kind = 'kv' AND seq IS NOT NULL
), starts AS (
  SELECT node, boot, seq, request_id FROM records
  WHERE kind = 'request' AND event = 'decode_started' AND seq IS NOT NULL
    AND (node, request_id) NOT IN (
      SELECT DISTINCT node, request_id FROM records WHERE kind = 'kv' AND op = 'read')
)
SELECT nb.nb, e.seq, q.rid, e.op, e.lo, e.hi FROM (
  SELECT node, boot, seq, request_id, op, rg.lo AS lo, rg.hi AS hi FROM kv
  UNION ALL
  SELECT node, boot, seq, request_id, {START}::TINYINT, NULL, NULL FROM starts
) e
JOIN sweep_node_boots nb USING (node, boot)
JOIN sweep_requests q USING (request_id)
ORDER BY nb.nb, e.seq, e.lo, e.hi;
"""

_ROWS = 1 << 18


def _add_range(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``ranges`` (sorted, disjoint, inclusive) with ``[lo, hi]`` added, merged."""
    out: list[tuple[int, int]] = []
    placed = False
    for a, b in ranges:
        if b < lo - 1:
            out.append((a, b))
        elif a > hi + 1:
            if not placed:
                out.append((lo, hi))
                placed = True
            out.append((a, b))
        else:
            lo, hi = min(a, lo), max(b, hi)
    if not placed:
        out.append((lo, hi))
    return out


def _cut_range(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``ranges`` without the pages of ``[lo, hi]``."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if b < lo or a > hi:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo - 1))
        if b > hi:
            out.append((hi + 1, b))
    return out


class _Out:
    """Rows of one output table, columnar; a row extending the previous one merges into it."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.cols: list[list[object]] = [[] for _ in names]
        self.last: tuple[object, ...] | None = None  # key of the last row (all but lo, hi)

    def add(self, key: tuple[object, ...], lo: int, hi: int) -> None:
        lo_col, hi_col = self.cols[-2], self.cols[-1]
        if key == self.last and hi_col[-1] == lo - 1:
            hi_col[-1] = hi
            return
        for col, value in zip(self.cols, key, strict=False):
            col.append(value)
        lo_col.append(lo)
        hi_col.append(hi)
        self.last = key

    def table(self, types: dict[str, pa.DataType]) -> pa.Table:
        return pa.table({n: pa.array(c, type=types[n]) for n, c in zip(self.names, self.cols, strict=True)})


def sweep(con: duckdb.DuckDBPyConnection) -> None:
    """Run the sweep over the case's kv records into the ``sweep_*`` tables of ``con``."""
    con.execute(EVENTS_SQL)
    # key columns first, then lo, hi
    exposures = _Out(("nb", "reader", "victim", "version", "seq", "inferred", "lo", "hi"))
    uninitialized = _Out(("nb", "reader", "seq", "inferred", "lo", "hi"))
    reads = _Out(("nb", "reader", "start_seq", "end_seq", "inferred", "lo", "hi"))

    writer_of: list[int] = []  # version id -> writing request
    clean: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (rid, version) -> ranges shared
    state: _NodeBoot | None = None
    last_write = (-1, -1)
    batches = con.sql("SELECT * FROM sweep_events").to_arrow_reader(_ROWS)
    for batch in batches:
        cols = [batch.column(i).to_pylist() for i in range(6)]
        for nb, seq, rid, op, lo, hi in zip(*cols, strict=True):
            if state is None or state.nb != nb:
                if state is not None:
                    state.finish(reads)
                state = _NodeBoot(nb, writer_of, clean, exposures, uninitialized)
            if op == START:
                for a, b in state.holds.get(rid, ()):
                    state.read(rid, a, b, seq, True)
            elif op == 3:
                state.read(rid, lo, hi, seq, False)
            elif op == 2:
                if (nb, seq) != last_write:  # one version per write record, whatever its ranges
                    last_write = (nb, seq)
                    writer_of.append(rid)
                state.write(len(writer_of) - 1, lo, hi, seq)
            elif op == 4:
                state.free(rid, lo, hi, seq, reads)
            else:
                held = state.holds.get(rid)
                state.holds[rid] = _add_range(held, lo, hi) if held else [(lo, hi)]
                if op == 1:
                    state.share(rid, lo, hi)
    if state is not None:
        state.finish(reads)

    exposures = _without_shared(exposures, clean)
    i64, i32 = pa.int64(), pa.int32()
    types = {"nb": i32, "reader": i32, "victim": i32, "seq": i64, "inferred": pa.bool_(),
             "lo": i64, "hi": i64, "start_seq": i64, "end_seq": i64, "version": i64}
    for name, out in (("exposures", exposures), ("uninitialized", uninitialized), ("reads", reads)):
        con.register("sweep_rows", out.table(types))
        con.execute(f"CREATE OR REPLACE TEMP TABLE sweep_{name} AS SELECT * FROM sweep_rows")
        con.unregister("sweep_rows")


def _without_shared(seen: _Out, clean: dict[tuple[int, int], list[tuple[int, int]]]) -> _Out:
    """Exposure rows without the pages whose version the reader took by share (at any time)."""
    out = _Out(seen.names)
    for row in zip(*seen.cols, strict=True):
        pieces = [(row[-2], row[-1])]
        for a, b in clean.get((row[1], row[3]), ()):
            pieces = _cut_range(pieces, a, b)
        for a, b in pieces:
            out.add(row[:-2], a, b)
    return out


class _NodeBoot:
    """The interval map of one (node, boot) and the ops that change it."""

    def __init__(
        self,
        nb: int,
        writer_of: list[int],
        clean: dict[tuple[int, int], list[tuple[int, int]]],
        exposures: _Out,
        uninitialized: _Out,
    ) -> None:
        self.nb = nb
        self.writer_of = writer_of
        self.clean = clean
        self.exposures = exposures
        self.uninitialized = uninitialized
        # fragment i covers [starts[i], starts[i+1]) (the last one to infinity)
        self.starts: list[int] = [0]
        self.versions: list[int] = [NO_VERSION]
        self.readers: list[tuple[tuple[int, int, bool], ...]] = [()]  # (rid, start seq, inferred)
        self.holds: dict[int, list[tuple[int, int]]] = {}
        self.has_read: set[int] = set()

    def _split(self, x: int) -> int:
        """The index of the fragment starting at ``x``, splitting the one containing it."""
        starts = self.starts
        i = bisect_right(starts, x) - 1
        if starts[i] != x:
            i += 1
            starts.insert(i, x)
            self.versions.insert(i, self.versions[i - 1])
            self.readers.insert(i, self.readers[i - 1])
        return i

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        return self._split(lo), self._split(hi + 1)

    def _merge(self, a: int, b: int) -> None:
        """Merge equal neighbours among fragments ``a`` to ``b``."""
        starts, versions, readers = self.starts, self.versions, self.readers
        a, b = max(a, 0), min(b, len(starts) - 1)
        keep = [a]
        for j in range(a + 1, b + 1):
            k = keep[-1]
            if versions[j] != versions[k] or readers[j] != readers[k]:
                keep.append(j)
        if len(keep) != b - a + 1:
            starts[a:b + 1] = [starts[j] for j in keep]
            versions[a:b + 1] = [versions[j] for j in keep]
            readers[a:b + 1] = [readers[j] for j in keep]

    def _seen(self, rid: int, version: int, lo: int, hi: int, seq: int, inferred: bool) -> None:
        """``rid`` sees ``version`` on pages ``[lo, hi]`` at ``seq``."""
        if version == NO_VERSION:
            self.uninitialized.add((self.nb, rid, seq, inferred), lo, hi)
            return
        writer = self.writer_of[version]
        if writer != rid:
            self.exposures.add((self.nb, rid, writer, version, seq, inferred), lo, hi)

    def share(self, rid: int, lo: int, hi: int) -> None:
        """The versions on ``[lo, hi]`` now are ``rid``'s own, seen before or after."""
        starts, versions = self.starts, self.versions
        i = bisect_right(starts, lo) - 1
        n = len(starts)
        while i < n and starts[i] <= hi:
            version = versions[i]
            if version != NO_VERSION:
                a = max(starts[i], lo)
                b = min(starts[i + 1] - 1, hi) if i + 1 < n else hi
                self.clean.setdefault((rid, version), []).append((a, b))
            i += 1

    def write(self, version: int, lo: int, hi: int, seq: int) -> None:
        ia, ib = self._span(lo, hi)
        starts, readers = self.starts, self.readers
        for i in range(ia, ib):
            for reader, _, inferred in readers[i]:
                self._seen(reader, version, starts[i], starts[i + 1] - 1, seq, inferred)
        self.versions[ia:ib] = [version] * (ib - ia)
        self._merge(ia - 1, ib)

    def read(self, rid: int, lo: int, hi: int, seq: int, inferred: bool) -> None:
        self.has_read.add(rid)
        ia, ib = self._span(lo, hi)
        starts, versions, readers = self.starts, self.versions, self.readers
        for i in range(ia, ib):
            current = readers[i]
            if any(r[0] == rid for r in current):
                continue
            readers[i] = tuple(sorted((*current, (rid, seq, inferred))))
            self._seen(rid, versions[i], starts[i], starts[i + 1] - 1, seq, inferred)
        self._merge(ia - 1, ib)

    def free(self, rid: int, lo: int, hi: int, seq: int, reads: _Out) -> None:
        held = self.holds.get(rid)
        if held:
            self.holds[rid] = _cut_range(held, lo, hi)
        if rid not in self.has_read:
            return
        ia, ib = self._span(lo, hi)
        starts, readers = self.starts, self.readers
        for i in range(ia, ib):
            current = readers[i]
            for r in current:
                if r[0] == rid:
                    readers[i] = tuple(x for x in current if x is not r)
                    reads.add((self.nb, rid, r[1], seq, r[2]), starts[i], starts[i + 1] - 1)
                    break
        self._merge(ia - 1, ib)

    def finish(self, reads: _Out) -> None:
        """Reading intervals still open at the end of the boot, per reader in page order."""
        starts = self.starts
        open_reads = sorted(
            (rid, start, inferred, starts[i], starts[i + 1] - 1)
            for i, current in enumerate(self.readers)
            for rid, start, inferred in current
        )
        for rid, start, inferred, lo, hi in open_reads:
            reads.add((self.nb, rid, start, None, inferred), lo, hi)
