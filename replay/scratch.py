"""The scratch catalog a replay keeps its own tables in beside the case it reads, and the case's
times as log text."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.errors import CaseError
from forensics.store import case_path, one, restored, session
from replay.logset import ts_ns, ts_text

#: Rows read from the case at a time (the requests' facts, a node's records).
BATCH = 8192
#: The memory limit of the case's database while a replay reads it: past it, the replay's tables
#: and the case's reads spill to disk (to the case's temporary folder, ``CASE.tmp``).
SCRATCH_MEMORY = "512MiB"
#: The in-memory catalog the replay's own tables go in (``kvf_scratch.main`` in ``sql/replay.sql``):
#: a name no case file is likely to have (a case's catalog is named for its file).
SCRATCH = "kvf_scratch"


@contextmanager
def scratch(case: duckdb.DuckDBPyConnection) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the case open on ``case``, for a replay to read it through, with an
    in-memory catalog :data:`SCRATCH` attached for the replay's own tables, and the database under
    :data:`SCRATCH_MEMORY` while the block runs; the catalog and the limit are undone after.

    (The case's temporary folder stays as it is: DuckDB cannot switch it once a query has spilled
    there, nor back after the replay's have.)"""
    if (one(case, "SELECT current_database()") or ("",))[0] == SCRATCH:
        raise CaseError(f"{case_path(case)}: a case file named {SCRATCH}.duckdb cannot be replayed (the replay "
                        "keeps its own tables in a catalog of that name); rename it")
    with restored(case, "memory_limit"):
        case.execute(f"SET memory_limit = '{SCRATCH_MEMORY}'")
        case.execute(f"ATTACH ':memory:' AS {SCRATCH}")
        con = case.cursor()
        try:
            session(con)
            yield con
        finally:
            con.close()
            case.execute(f"DETACH {SCRATCH}")


def reader(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A second connection to the case the replay reads, for a query read in batches while ``con``
    writes (registered tables are per connection; the scratch catalog is shared)."""
    cur = con.cursor()
    session(cur)
    return cur



def flags(values: pa.Array) -> np.ndarray:
    """A boolean column as a numpy one, null as false."""
    return pc.fill_null(values, False).to_numpy(zero_copy_only=False)


def ints(values: pa.Array, null: int) -> np.ndarray:
    """An integer column as int64, ``null`` where it is null."""
    return pc.fill_null(values, null).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def sql_path(path: Path) -> str:
    """``path`` inside a quoted SQL string."""
    return str(path).replace("'", "''")


def log_ts(value: Any) -> str:
    """A case timestamp (aware datetime, microseconds) as the log text the engine writes."""
    return ts_text(ts_ns(value))


def log_ns(text: str) -> int:
    """A log's timestamp text in nanoseconds since the epoch."""
    return ts_ns(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
