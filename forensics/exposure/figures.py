"""The eight summary figures of log-schema.md section 5: their names in the spec's order, what
each counts, and a query that recomputes each from the documented ``exposures`` and
``uninitialized_reads`` tables, page by page, independently of how the analysis computed it.

The analysis writes the figures into ``exposure_summary``; :func:`checked` re-derives every one
with its query and refuses to hand on a figure its definition does not give (the report prints
only checked figures, each beside its query).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from forensics.errors import CaseError
from forensics.store import one


@dataclass(frozen=True)
class Figure:
    """One summary figure: its name, what it counts, and the SQL that recomputes it from the case."""

    name: str
    definition: str
    sql: str


_DELIVERED_PAIRS = "SELECT DISTINCT reader_request, victim_request FROM exposures WHERE reader_delivered"

DEFINITIONS: tuple[Figure, ...] = (
    Figure("exposed_responses", "delivered requests R with at least one exposure",
           "SELECT count(DISTINCT reader_request) FROM exposures WHERE reader_delivered"),
    Figure("contained_requests", "requests with at least one exposure that were not delivered",
           "SELECT count(DISTINCT reader_request) FROM exposures WHERE NOT reader_delivered"),
    Figure("victim_requests", "distinct V over exposures of delivered requests",
           "SELECT count(DISTINCT victim_request) FROM exposures WHERE reader_delivered"),
    Figure("exposure_pairs", "distinct (R, V) over exposures of delivered requests",
           f"SELECT count(*) FROM ({_DELIVERED_PAIRS})"),
    Figure("cross_tenant_pairs", "those pairs where R's tenant differs from V's",
           "SELECT count(*) FROM (SELECT DISTINCT reader_request, victim_request FROM exposures "
           "WHERE reader_delivered AND reader_tenant <> victim_tenant)"),
    Figure("exposed_page_reads", "distinct (R, N, p) with an exposure, delivered R",
           "SELECT count(*) FROM (SELECT DISTINCT e.reader_request, e.node, p.page FROM exposures e, "
           "LATERAL (SELECT unnest(generate_series(CAST(split_part(r, '-', 1) AS BIGINT), "
           "CAST(split_part(r, '-', -1) AS BIGINT))) AS page FROM (SELECT unnest(string_split(e.pages, ',')) AS r)) p "
           "WHERE e.reader_delivered)"),
    Figure("uninitialized_reads", "distinct (R, N, p) with an uninitialized read, any R",
           "SELECT count(*) FROM (SELECT DISTINCT request_id, node, unnest(generate_series(lo, hi)) AS page "
           "FROM uninitialized_reads)"),
    Figure("affected_tenants", "distinct tenants of V over exposure pairs",
           "SELECT count(DISTINCT victim_tenant) FROM exposures WHERE reader_delivered"),
)

#: The figures' names, in the spec's order: every summary has exactly these keys.
FIGURES: tuple[str, ...] = tuple(f.name for f in DEFINITIONS)


class FiguresDisagree(CaseError):
    """A figure of the case is not what its definition's query gives: the case was changed by hand."""


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The summary figures as last analysed."""
    row = one(con, f"SELECT {', '.join(FIGURES)} FROM exposure_summary")
    if row is None:
        raise CaseError("the case has no exposure summary (run 'kvforensics investigate')")
    return {name: int(value) for name, value in zip(FIGURES, row, strict=True)}


def checked(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """The summary figures, each recomputed by its definition's query and found equal."""
    figures = summary(con)
    for figure in DEFINITIONS:
        row = one(con, figure.sql)
        value = int(row[0] or 0) if row else 0
        if value != figures[figure.name]:
            raise FiguresDisagree(f"{figure.name}: the analysis says {figures[figure.name]}, its definition's "
                                  f"query {value}; re-analyse the case ('kvforensics investigate')")
    return figures
