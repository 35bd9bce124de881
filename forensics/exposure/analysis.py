"""Exposure analysis of a case: the page sweep, then exposures and the summary figures in SQL."""

from __future__ import annotations

import duckdb

from forensics.exposure.figures import summary
from forensics.store import has_table, roll_back, sql_text


def analyse(con: duckdb.DuckDBPyConnection, *, fast: bool | None = None) -> dict[str, int]:
    """Rebuild the timelines and exposures of the case on ``con``, in one transaction; the figures.
    ``fast``: the compiled sweep, its interpreted twin, or by size (None)."""
    from forensics.exposure.sweep import sweep  # here, not above: numpy and Arrow load only to analyse

    con.execute("BEGIN TRANSACTION")
    try:
        if has_table(con, "page_writes"):  # a table in cases analysed before it became a view
            con.execute("DROP TABLE page_writes")
        sweep(con, fast=fast)
        con.execute(sql_text("analysis.sql"))
        con.execute(
            "INSERT INTO case_meta VALUES ('analysed_records', "
            "(SELECT count(*)::VARCHAR FROM records)) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )
        con.execute("COMMIT")
    except BaseException:
        roll_back(con)  # (after a COMMIT the disk refused, its error is the one raised)
        raise
    return summary(con)
