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

COMPACT_AFTER = 1 << 16  # rows of garbage the walk's pools carry before it drops them
#: Events from which the compiled kernel is used (with ``fast=None``): below, its interpreted twin
#: (about 25 us an event) is quicker than loading the machine code, let alone compiling it.
COMPILED_FROM = 50_000

OPS = {
    "alloc": vocab.ALLOC, "share": vocab.SHARE, "write": vocab.WRITE,
    "read": vocab.READ, "free": vocab.FREE,
}

# One row per page range of a kv record, plus one per decode_started (``sweep`` keeps those that
# start an inferred read), in sweep order.
EVENTS_SQL = f"""
CREATE OR REPLACE TEMP TABLE sweep_requests AS
SELECT request_id, (row_number() OVER (ORDER BY request_id) - 1)::INTEGER AS rid
FROM (SELECT DISTINCT request_id FROM records WHERE request_id IS NOT NULL);

CREATE OR REPLACE TEMP TABLE sweep_node_boots AS
SELECT node, boot, (row_number() OVER (ORDER BY node, boot) - 1)::INTEGER AS nb,
       dense_rank() OVER (ORDER BY node)::INTEGER AS node_id
FROM (SELECT DISTINCT node, boot FROM records WHERE seq IS NOT NULL AND kind = 'kv');

CREATE OR REPLACE TEMP VIEW sweep_events AS
WITH kv AS (
  SELECT nb.nb::BIGINT AS nb, r.seq::BIGINT AS seq, q.rid::BIGINT AS rid,
         CASE r.op {" ".join(f"WHEN '{k}' THEN {v}" for k, v in OPS.items())} END::BIGINT AS op,
         r.ts, unnest(r.page_ranges) AS rg
  FROM records r JOIN sweep_node_boots nb USING (node, boot) JOIN sweep_requests q USING (request_id)
  WHERE r.kind = 'kv' AND r.seq IS NOT NULL
), starts AS (
  SELECT nb.nb::BIGINT AS nb, r.seq::BIGINT AS seq, q.rid::BIGINT AS rid,
         {vocab.START}::BIGINT AS op, r.ts
  FROM records r JOIN sweep_node_boots nb USING (node, boot) JOIN sweep_requests q USING (request_id)
  WHERE r.kind = 'request' AND r.event = 'decode_started' AND r.seq IS NOT NULL
)
SELECT nb, seq, rid, op, rg.lo::BIGINT AS lo, rg.hi::BIGINT AS hi, ts FROM kv
UNION ALL
SELECT nb, seq, rid, op, -1::BIGINT, -1::BIGINT, ts FROM starts
ORDER BY nb, seq, lo, hi;
"""

# The columns kept of the kernel's rows (booleans are 0/1), by name and column, the range last.
EXPOSURE_COLUMNS = (("nb", vocab.ISL_NB), ("reader", vocab.ISL_READER), ("victim", vocab.ISL_VICTIM),
                    ("seq", vocab.ISL_SEQ), ("inferred", vocab.ISL_INFERRED), ("ts", vocab.ISL_TS))
UNINITIALIZED_COLUMNS = (("nb", vocab.UNI_NB), ("reader", vocab.UNI_READER), ("seq", vocab.UNI_SEQ),
                         ("inferred", vocab.UNI_INFERRED))
READ_COLUMNS = (("nb", vocab.RD_NB), ("reader", vocab.RD_READER), ("start_seq", vocab.RD_START),
                ("end_seq", vocab.RD_END), ("inferred", vocab.RD_INFERRED))


def walker(n_events: int, fast: bool | None = None) -> ModuleType:
    """The kernel to walk ``n_events`` with: compiled (``fast``), its interpreted twin (not
    ``fast``), or by size (None). Both are the same source and give the same rows."""
    if fast if fast is not None else n_events >= COMPILED_FROM:
        compiled.announce("sweep")
        return importlib.import_module("forensics.exposure.kernel")
    return compiled.interpreted("forensics.exposure.kernel")


def sweep(con: duckdb.DuckDBPyConnection, *, fast: bool | None = None) -> None:
    """Run the sweep over the case's kv records into the ``sweep_*`` tables of ``con``
    (``fast``: the compiled kernel, its interpreted twin, or by size: :func:`walker`)."""
    con.execute(EVENTS_SQL)
    n_requests = con.execute("SELECT count(*) FROM sweep_requests").fetchall()[0][0]
    nbs, seqs, rids, ops, los, his, micros = _events(con, n_requests)
    kernel = walker(len(nbs), fast)
    exposures, uninitialized, reads, still_open, shared = kernel.walk(
        nbs, seqs, rids, ops, los, his, n_requests, COMPACT_AFTER
    )
    exposures = kernel.without_shared(exposures, _sorted(shared))
    by_reader_victim_page = [HI, LO, vocab.EXP_VICTIM, vocab.EXP_READER, vocab.EXP_NB]  # last key first
    exposures = kernel.islands(exposures[np.lexsort(exposures[:, by_reader_victim_page].T)])
    at = kernel.event_at(nbs, seqs, exposures[:, vocab.ISL_NB], exposures[:, vocab.ISL_SEQ])
    exposures[:, vocab.ISL_TS] = micros[at]
    reads = np.concatenate((reads, kernel.merged(_sorted(still_open))))
    for name, rows, names in (
        ("exposures", exposures, EXPOSURE_COLUMNS),
        ("uninitialized", uninitialized, UNINITIALIZED_COLUMNS),
        ("reads", reads, READ_COLUMNS),
    ):
        con.register("sweep_rows", _table(rows, names))
        con.execute(f"CREATE OR REPLACE TEMP TABLE sweep_{name} AS SELECT * FROM sweep_rows")
        con.unregister("sweep_rows")


def _events(con: duckdb.DuckDBPyConnection, n_requests: int) -> list[np.ndarray]:
    """The columns of ``sweep_events`` (ts in microseconds), less the decode_starts that start
    no inferred read."""
    events = con.sql("SELECT * FROM sweep_events").to_arrow_table()
    node_of = con.sql("SELECT node_id FROM sweep_node_boots ORDER BY nb").to_arrow_table()
    # writable copies: numba compiles read-only arrays (Arrow's) as another type
    columns = [np.array(events.column(i).to_numpy(), dtype=np.int64) for i in range(6)]
    columns.append(np.array(events.column(6).cast(pa.int64()).to_numpy(), dtype=np.int64))
    return _inferring(columns, node_of.column(0).to_numpy(), n_requests)


def _inferring(events: list[np.ndarray], node_of: np.ndarray, n_requests: int) -> list[np.ndarray]:
    """The events without the decode_starts of requests with a read record on that node (in
    any boot): only the others start an inferred read."""
    nbs, rids, ops = events[0], events[2], events[3]
    key = node_of[nbs].astype(np.int64) * n_requests + rids
    starts = ops == vocab.START
    has_read = np.isin(key[starts], key[ops == vocab.READ])
    if not has_read.any():
        return events
    keep = np.ones(len(ops), dtype=bool)
    keep[np.flatnonzero(starts)[has_read]] = False
    return [col[keep] for col in events]


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
