"""The page sweep of log-schema.md section 5: each (node, boot) once, in seq order, on page ranges.

The state of a (node, boot) is an interval map over page ids: sorted fragments, and per
fragment the content version and the set of requests reading it. An op on a page range splits
the map at the range's ends, visits the fragments inside, and merges equal neighbours again, so
its cost follows the number of distinct histories it touches, never the number of pages.

Holds (``alloc``/``share`` to ``free``) are kept per request as ranges: they matter only for
inferred reads, which start on every page the request holds at its ``decode_started``.

Here the events come out of the case in sweep order, and the rows come back into it;
``kernel`` (compiled, or its interpreted twin for small cases) walks them. Three tables of
page ranges result, in integer ids: ``sweep_exposures`` (per reader, victim, node and boot, the
pages where the reader saw the victim's content, first at ``seq`` and ``ts``),
``sweep_uninitialized`` and ``sweep_reads`` (reading intervals); ``analysis.sql`` names them
into the documented tables.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa

from forensics import compiled
from forensics.exposure import rows as vocab
from forensics.exposure.rows import HI, LO
from forensics.store import scan

COMPACT_AFTER = 1 << 16  # rows of garbage the walk's pools carry before it drops them
#: Events from which the compiled kernel is used (with ``fast=None``): below, its interpreted twin
#: (about 25 us an event) is quicker than loading the machine code, let alone compiling it.
COMPILED_FROM = 50_000
#: Events walked at once: the (node, boot)s go through the walk in runs of about this many
#: events (one with more is a run of its own), so the sweep's memory follows its largest
#: (node, boot), never the case (56 bytes an event; bench/README.md).
RUN_EVENTS = 1 << 22

OPS = {
    "alloc": vocab.ALLOC, "share": vocab.SHARE, "write": vocab.WRITE,
    "read": vocab.READ, "free": vocab.FREE,
}

# The integer ids of the sweep, each (node, boot) with its number of page ranges, and the
# (node, request) pairs with a read record (on any boot): a decode_started of one starts no
# inferred read.
SETUP_SQL = """
CREATE OR REPLACE TEMP TABLE sweep_requests AS
SELECT request_id, (row_number() OVER (ORDER BY request_id) - 1)::INTEGER AS rid
FROM (SELECT DISTINCT request_id FROM records WHERE request_id IS NOT NULL);

CREATE OR REPLACE TEMP TABLE sweep_node_boots AS
SELECT node, boot, (row_number() OVER (ORDER BY node, boot) - 1)::INTEGER AS nb,
       dense_rank() OVER (ORDER BY node)::INTEGER AS node_id, ranges
FROM (SELECT node, boot, coalesce(sum(len(page_ranges)), 0)::BIGINT AS ranges
      FROM records WHERE seq IS NOT NULL AND kind = 'kv' GROUP BY node, boot);

CREATE OR REPLACE TEMP TABLE sweep_readers AS
SELECT DISTINCT node, request_id FROM records
WHERE kind = 'kv' AND op = 'read' AND seq IS NOT NULL AND len(page_ranges) > 0;
"""

# One row per page range of a kv record, plus one per decode_started that starts an inferred
# read, of the (node, boot)s ``nb`` $lo to $hi, in sweep order; times in microseconds.
EVENTS_SQL = f"""
WITH run AS (SELECT node, boot, nb FROM sweep_node_boots WHERE nb BETWEEN $lo AND $hi),
kv AS (
  SELECT nb.nb::BIGINT AS nb, r.seq::BIGINT AS seq, q.rid::BIGINT AS rid,
         CASE r.op {" ".join(f"WHEN '{k}' THEN {v}" for k, v in OPS.items())} END::BIGINT AS op,
         epoch_us(r.ts)::BIGINT AS ts, unnest(r.page_ranges) AS rg
  FROM records r JOIN run nb USING (node, boot) JOIN sweep_requests q USING (request_id)
  WHERE r.kind = 'kv' AND r.seq IS NOT NULL
), starts AS (
  SELECT nb.nb::BIGINT AS nb, r.seq::BIGINT AS seq, q.rid::BIGINT AS rid,
         {vocab.START}::BIGINT AS op, epoch_us(r.ts)::BIGINT AS ts
  FROM records r JOIN run nb USING (node, boot) JOIN sweep_requests q USING (request_id)
  WHERE r.kind = 'request' AND r.event = 'decode_started' AND r.seq IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM sweep_readers s WHERE s.node = r.node AND s.request_id = r.request_id)
)
SELECT nb, seq, rid, op, rg.lo::BIGINT AS lo, rg.hi::BIGINT AS hi, ts FROM kv
UNION ALL
SELECT nb, seq, rid, op, -1::BIGINT, -1::BIGINT, ts FROM starts
ORDER BY nb, seq, lo, hi
"""

# The columns kept of the kernel's rows (booleans are 0/1), by name and column, the range last.
EXPOSURE_COLUMNS = (("nb", vocab.ISL_NB), ("reader", vocab.ISL_READER), ("victim", vocab.ISL_VICTIM),
                    ("seq", vocab.ISL_SEQ), ("inferred", vocab.ISL_INFERRED), ("ts", vocab.ISL_TS))
UNINITIALIZED_COLUMNS = (("nb", vocab.UNI_NB), ("reader", vocab.UNI_READER), ("seq", vocab.UNI_SEQ),
                         ("inferred", vocab.UNI_INFERRED))
READ_COLUMNS = (("nb", vocab.RD_NB), ("reader", vocab.RD_READER), ("start_seq", vocab.RD_START),
                ("end_seq", vocab.RD_END), ("inferred", vocab.RD_INFERRED))
#: The tables the sweep leaves, with their columns.
TABLES: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = (
    ("exposures", EXPOSURE_COLUMNS), ("uninitialized", UNINITIALIZED_COLUMNS), ("reads", READ_COLUMNS))


def walker(n_events: int, fast: bool | None = None) -> ModuleType:
    """The kernel to walk ``n_events`` with: compiled (``fast``), its interpreted twin (not
    ``fast``), or by size (None). Both are the same source and give the same rows."""
    if fast if fast is not None else n_events >= COMPILED_FROM:
        compiled.announce("sweep")
        return importlib.import_module("forensics.exposure.kernel")
    return compiled.interpreted("forensics.exposure.kernel")


def sweep(con: duckdb.DuckDBPyConnection, *, fast: bool | None = None) -> None:
    """Run the sweep over the case's kv records into the ``sweep_*`` tables of ``con``
    (``fast``: the compiled kernel, its interpreted twin, or by size: :func:`walker`), a run of
    (node, boot)s at a time (:data:`RUN_EVENTS`)."""
    con.execute(SETUP_SQL)
    n_requests = con.execute("SELECT count(*) FROM sweep_requests").fetchall()[0][0]
    counts = con.execute("SELECT nb, ranges FROM sweep_node_boots ORDER BY nb").fetchall()
    kernel = walker(sum(n for _, n in counts), fast)
    empty = np.empty((0, vocab.WIDTH), np.int64)
    for name, names in TABLES:
        scan(con, _table(empty, names), "sweep_rows", f"CREATE OR REPLACE TEMP TABLE sweep_{name} AS FROM sweep_rows")
    for lo, hi in runs(counts, RUN_EVENTS):
        found = walk(kernel, events(con, lo, hi), n_requests)
        for (name, names), found_rows in zip(TABLES, found, strict=True):
            if len(found_rows):
                scan(con, _table(found_rows, names), "sweep_rows", f"INSERT INTO sweep_{name} FROM sweep_rows")


def runs(counts: list[tuple[int, int]], size: int) -> list[tuple[int, int]]:
    """The (node, boot)s ``nb`` (with their event counts, in order) as runs ``(first, last)`` of
    consecutive ones, each of at most ``size`` events unless it is a single (node, boot)."""
    out: list[tuple[int, int]] = []
    total = 0
    for nb, n in counts:
        if out and total + n <= size:
            out[-1] = (out[-1][0], nb)
            total += n
        else:
            out.append((nb, nb))
            total = n
    return out


def events(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> list[np.ndarray]:
    """The events of the (node, boot)s ``lo`` to ``hi`` (:data:`EVENTS_SQL`), column by column:
    nb, seq, rid, op, lo, hi and ts, each a writable int64 array (numba compiles read-only
    arrays, as Arrow's are, as another type)."""
    got = con.execute(EVENTS_SQL, {"lo": lo, "hi": hi}).fetchnumpy()
    return [np.require(got[c], dtype=np.int64, requirements=["C", "W"])
            for c in ("nb", "seq", "rid", "op", "lo", "hi", "ts")]


def walk(kernel: ModuleType, columns: list[np.ndarray], n_requests: int) -> tuple[np.ndarray, ...]:
    """The rows of the :data:`TABLES` that the events ``columns`` (:func:`events`) give."""
    nbs, seqs, rids, ops, los, his, micros = columns
    exposures, uninitialized, reads, still_open, shared = kernel.walk(
        nbs, seqs, rids, ops, los, his, n_requests, COMPACT_AFTER
    )
    exposures = kernel.without_shared(exposures, _sorted(shared))
    by_reader_victim_page = [HI, LO, vocab.EXP_VICTIM, vocab.EXP_READER, vocab.EXP_NB]  # last key first
    exposures = kernel.islands(exposures[np.lexsort(exposures[:, by_reader_victim_page].T)])
    at = kernel.event_at(nbs, seqs, exposures[:, vocab.ISL_NB], exposures[:, vocab.ISL_SEQ])
    exposures[:, vocab.ISL_TS] = micros[at]
    reads = np.concatenate((reads, kernel.merged(_sorted(still_open))))
    return exposures, uninitialized, reads


def _sorted(rows: np.ndarray) -> np.ndarray:
    """``rows`` ordered by their columns, first to last."""
    return rows[np.lexsort(rows.T[::-1])] if len(rows) else rows


def _table(rows: np.ndarray, columns: tuple[tuple[str, int], ...]) -> pa.Table:
    """The kernel's ``rows`` as an Arrow table of the named ``columns`` and the page range."""
    arrays: dict[str, Any] = {}
    for name, col in (*columns, ("lo", LO), ("hi", HI)):
        values = np.ascontiguousarray(rows[:, col])
        if name == "inferred":
            arrays[name] = pa.array(values.astype(bool))
        elif name in ("nb", "reader", "victim"):
            arrays[name] = pa.array(values.astype(np.int32))
        elif name == "ts":
            arrays[name] = pa.array(values).cast(pa.timestamp("us", tz="UTC"))
        elif name == "end_seq":
            arrays[name] = pa.array(values, mask=values == vocab.OPEN)
        else:
            arrays[name] = pa.array(values)
    return pa.table(arrays)
