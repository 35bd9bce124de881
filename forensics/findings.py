"""Findings: root-cause signatures and evidence gaps, each with its evidence rows and its SQL.

The queries live in ``sql/findings.sql``, one per finding, each headed by ``-- name:``,
``-- severity:``, ``-- partition:`` and ``-- title:`` lines (``{count}`` in the title is the
number of rows; the partition is what the Spark path splits the query's work by). They read only
the documented tables and views, so each can be re-run by hand with ``kvforensics sql``.

A finding's rows come in its query's order, ties broken by every column in turn, so the same case
lists them alike every time. A Parquet case written on Spark holds each finding's rows (a view
``finding:ID`` over its files, :data:`STORED`), computed there by the same query; they are read
from it, in the same order.
"""

from __future__ import annotations

import dataclasses
import html
import re
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from forensics.store import STORED_FINDING, sql_blocks

SEVERITIES = ("critical", "high", "medium", "low")


@dataclass(frozen=True)
class FindingSpec:
    """A finding as ``sql/findings.sql`` declares it: id, severity, title and query."""

    id: str
    severity: str
    title: str
    sql: str  # the whole query (with its parts, where it has them)
    partition: str = "case"  # boot (a node's), request, transfer, case, or parts: what each evidence row depends on
    #: a finding of partition ``parts``: each part's partition and query, and the query that sums
    #: their rows (a table ``parts``)
    parts: tuple[tuple[str, str], ...] = ()
    merge: str = ""

    @property
    def parts_sql(self) -> str:
        """The rows of its parts as one query (the table ``parts`` its merge reads)."""
        return "\nUNION ALL\n".join(f"({sql})" for _, sql in self.parts)


#: The name of the view of a finding's rows where a case holds them (a Parquet case from Spark).
STORED = STORED_FINDING


@dataclass(frozen=True)
class Finding:
    """One finding: a stable id, severity, one-line title, count, evidence rows and their SQL."""

    id: str
    severity: str
    title: str
    count: int
    evidence: pl.DataFrame
    sql: str

    def as_dict(self, *, rows: int | None = 20) -> dict[str, Any]:
        """The finding as JSON-ready data, with its first ``rows`` evidence rows (all for None)."""
        shown = self.evidence if rows is None else self.evidence.head(rows)
        return {
            "id": self.id, "severity": self.severity, "title": self.title, "count": self.count,
            "evidence": [{k: _plain(v) for k, v in r.items()} for r in shown.to_dicts()],
            "sql": self.sql,
        }


    def _repr_html_(self) -> str:
        return Findings([self])._repr_html_() + self.evidence.head(10)._repr_html_()


class Findings(list[Finding]):
    """A list of findings that shows itself as a compact table in a notebook."""

    def _repr_html_(self) -> str:
        if not self:
            return "<p>no findings</p>"
        rows = "".join(
            f"<tr><td>{html.escape(f.severity)}</td><td><code>{html.escape(f.id)}</code></td>"
            f"<td style='text-align:right'>{f.count:,}</td><td>{html.escape(f.title)}</td></tr>"
            for f in self
        )
        return ("<table><thead><tr><th>severity</th><th>id</th><th>count</th><th>finding</th></tr></thead>"
                f"<tbody>{rows}</tbody></table>")


def _plain(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


def specs() -> list[FindingSpec]:
    """The findings defined in ``sql/findings.sql``, in file order."""
    blocks = sql_blocks("findings.sql")
    out = []
    for b in blocks:
        if b.name.endswith(PART):
            continue
        parts = tuple((p.head["partition"], p.sql) for p in blocks if p.name == b.name + PART)
        assert (b.head["partition"] == "parts") == bool(parts), f"{b.name}: partition parts, and its parts"
        spec = FindingSpec(b.name, b.head["severity"], b.head["title"], b.sql, b.head["partition"],
                           parts, b.sql if parts else "")
        out.append(dataclasses.replace(spec, sql=f"WITH parts AS ({spec.parts_sql})\n{b.sql}") if parts else spec)
    return out


#: The name of a finding's part in ``sql/findings.sql`` (after the finding's id).
PART = "/part"


def order_by(sql: str) -> str:
    """The final ``ORDER BY`` of a finding's query, as names of its result's columns."""
    m = re.search(r"\bORDER BY ([^()]*)$", sql.strip())
    assert m is not None, "every finding's query ends with its ORDER BY"
    return re.sub(r"\b[a-z]\w*\.", "", m.group(1))


def ordered(con: duckdb.DuckDBPyConnection, source: str, spec: FindingSpec) -> str:
    """A query of ``source`` (a query or a view of the finding's rows) in the finding's order,
    ties broken by every column."""
    columns = con.sql(f"SELECT * FROM {source} LIMIT 0").columns
    every = ", ".join('"' + c.replace('"', '""') + '"' for c in columns)
    return f"SELECT * FROM {source} ORDER BY {order_by(spec.sql)}, {every}"


def findings(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """Every finding with at least one evidence row, most severe first, then in file order."""
    stored = {name for (name,) in con.execute(
        "SELECT view_name FROM duckdb_views() WHERE view_name LIKE 'finding:%'").fetchall()}
    found = []
    for spec in specs():
        view = STORED.format(id=spec.id)
        source = f'"{view}"' if view in stored else f"({spec.sql})"
        evidence = con.sql(ordered(con, source, spec)).pl()
        if evidence.height:
            found.append(Finding(spec.id, spec.severity, spec.title.format(count=f"{evidence.height:,}"),
                                 evidence.height, evidence, spec.sql))
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))
