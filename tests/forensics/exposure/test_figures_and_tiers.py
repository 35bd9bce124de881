"""The figures' definitions re-check the analysis; the evidence tiers are the declared ones."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import forensics
from forensics.exposure import tiers
from forensics.exposure.figures import DEFINITIONS, FIGURES, FiguresDisagree, checked
from forensics.store import connect, sql_text

EXAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "examples"


def test_every_figure_has_a_definition_and_a_query_in_the_spec_order() -> None:
    assert FIGURES == ("exposed_responses", "contained_requests", "victim_requests", "exposure_pairs",
                       "cross_tenant_pairs", "exposed_page_reads", "uninitialized_reads", "affected_tenants")
    assert all(f.definition and f.sql.startswith("SELECT") for f in DEFINITIONS)


def test_a_figure_changed_by_hand_is_refused_by_the_check(tmp_path: Path) -> None:
    db = tmp_path / "case.duckdb"
    found = forensics.investigate([EXAMPLES / "placeholder"], db)
    con = connect(db)
    try:
        assert checked(con) == found.exposure
        con.execute("UPDATE exposure_summary SET victim_requests = victim_requests + 1")
        with pytest.raises(FiguresDisagree, match="victim_requests: the analysis says"):
            checked(con)
    finally:
        con.close()


def test_the_analysis_and_the_fill_write_only_declared_tiers() -> None:
    written = set(re.findall(r"'(page records[^']*)'", sql_text("analysis.sql")))
    assert written == {tiers.PAGE_RECORDS, tiers.PAGE_RECORDS_INFERRED}
    assert "$transfer_tier" in sql_text("fill_from_replay.sql") and "$request_tier" in sql_text("fill_from_replay.sql")
    assert tiers.TIERS[:2] == (tiers.PAGE_RECORDS, tiers.PAGE_RECORDS_INFERRED)
