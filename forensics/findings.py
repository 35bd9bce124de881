"""Findings: root-cause signatures and evidence gaps, each with its evidence rows and its SQL.

The queries live in ``sql/findings.sql``, one per finding, each headed by ``-- name:``,
``-- severity:`` and ``-- title:`` lines (``{count}`` in the title is the number of rows).
They read only the documented tables and views, so each can be re-run by hand with
``kvforensics sql``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import duckdb
import polars as pl

from forensics.store import sql_blocks

SEVERITIES = ("critical", "high", "medium", "low")


@dataclass(frozen=True)
class FindingSpec:
    """A finding as ``sql/findings.sql`` declares it: id, severity, title and query."""

    id: str
    severity: str
    title: str
    sql: str


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
    return [FindingSpec(b.name, b.head["severity"], b.head["title"], b.sql) for b in sql_blocks("findings.sql")]


def findings(con: duckdb.DuckDBPyConnection) -> list[Finding]:
    """Every finding with at least one evidence row, most severe first, then in file order."""
    found = []
    for spec in specs():
        evidence = con.sql(spec.sql).pl()
        if evidence.height:
            found.append(Finding(spec.id, spec.severity, spec.title.format(count=f"{evidence.height:,}"),
                                 evidence.height, evidence, spec.sql))
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))
