"""The scratch DuckDB a replay reads its case through, and the case's times as log text."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb

from forensics.store import session
from replay.logset import ts_ns, ts_text

#: Rows read from the case at a time (the requests' facts, a node's records).
BATCH = 8192
#: The scratch DuckDB's memory limit: past it, it spills to disk.
SCRATCH_MEMORY = "512MiB"


def scratch(db: Path, spill: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the case ``db`` attached read-only as its default catalog; the
    replay's own tables go in ``memory`` (spilled to ``spill`` past :data:`SCRATCH_MEMORY`)."""
    con = duckdb.connect()
    session(con)
    con.execute(f"SET memory_limit = '{SCRATCH_MEMORY}'")
    con.execute(f"SET temp_directory = '{sql_path(spill)}'")
    con.execute(f"ATTACH '{sql_path(db)}' AS case_db (READ_ONLY)")
    con.execute("USE case_db")
    return con


def reader(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A second connection to the scratch DuckDB, for a query read in batches while ``con``
    writes (registered tables are per connection; ``memory`` is shared)."""
    cur = con.cursor()
    cur.execute("USE case_db")
    return cur


def batches(cur: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None
            ) -> Iterator[tuple[Any, ...]]:
    """The rows of ``sql``, read :data:`BATCH` at a time."""
    for batch in cur.sql(sql, params=params or {}).to_arrow_reader(BATCH):
        yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)


def sql_path(path: Path) -> str:
    """``path`` inside a quoted SQL string."""
    return str(path).replace("'", "''")


def log_ts(value: Any) -> str:
    """A case timestamp (aware datetime, microseconds) as the log text the engine writes."""
    return ts_text(ts_ns(value))


def log_ns(text: str) -> int:
    """A log's timestamp text in nanoseconds since the epoch."""
    return ts_ns(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))
