"""Exposure analysis: the page sweep, then exposures and the spec's summary figures in SQL."""

from __future__ import annotations

import duckdb

from forensics.store import has_table, one, sql_text

#: The summary figures of log-schema.md section 5, in the spec's order.
FIGURES = (
    "exposed_responses",
    "contained_requests",
    "victim_requests",
    "exposure_pairs",
    "cross_tenant_pairs",
    "exposed_page_reads",
    "uninitialized_reads",
    "affected_tenants",
)

#: Tables the analysis writes into the case (documented in docs/tables.md).
RESULT_TABLES = (
    "requests", "page_reads", "page_writes", "exposures",
    "uninitialized_reads", "exposure_summary",
)


def analyse(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Rebuild the timelines and exposures of the case on ``con``; the summary figures."""
    from forensics.sweep import sweep  # here, not above: numba loads only when a case is analysed

    con.execute("BEGIN TRANSACTION")
    try:
        if has_table(con, "page_writes"):  # a table in cases analysed before it became a view
            con.execute("DROP TABLE page_writes")
        sweep(con)
        con.execute(sql_text("analysis.sql"))
        con.execute(
            "INSERT INTO case_meta VALUES ('analysed_records', "
            "(SELECT count(*)::VARCHAR FROM records)) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return summary(con)


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The summary figures as last analysed."""
    row = one(con, f"SELECT {', '.join(FIGURES)} FROM exposure_summary")
    assert row is not None
    return {name: int(value) for name, value in zip(FIGURES, row, strict=True)}
