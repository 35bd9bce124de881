"""The compiled page map: what it finds does not depend on when its pools are compacted, and on
the sample incident (pools grown many times over) it finds what the oracle finds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import forensics
from forensics.exposure import reference, sweep
from forensics.exposure.reference import expand
from forensics.store import connect

SAMPLE = Path(__file__).resolve().parents[3] / "sample_logs" / "glm53-incident"


@pytest.fixture(scope="module")
def sample_case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("sample") / "case.duckdb"
    forensics.investigate([SAMPLE], db)
    return db


def _sample_events(sample_case: Path) -> tuple[list[np.ndarray], int]:
    con = connect(sample_case)
    try:
        con.execute(sweep.EVENTS_SQL)
        n_requests = con.execute("SELECT count(*) FROM sweep_requests").fetchall()[0][0]
        return sweep._events(con, n_requests)[:6], n_requests
    finally:
        con.close()


@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "interpreted"])
def test_compacting_the_pools_at_every_event_changes_nothing(sample_case: Path, fast: bool) -> None:
    events, n_requests = _sample_events(sample_case)
    walk = sweep.walker(len(events[0]), fast)
    usual = walk.walk(*events, n_requests, sweep.COMPACT_AFTER)
    compacting = walk.walk(*events, n_requests, 0)
    assert sum(len(rows) for rows in usual) > 1000  # the walk found something to compare
    for a, b in zip(usual, compacting, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_interpreted_twin_walks_as_the_compiled_kernel(sample_case: Path) -> None:
    events, n_requests = _sample_events(sample_case)
    twin, compiled = sweep.walker(len(events[0]), False), sweep.walker(len(events[0]), True)
    assert twin is not compiled and twin.walk is not compiled.walk
    for a, b in zip(twin.walk(*events, n_requests, 64), compiled.walk(*events, n_requests, 64), strict=True):
        np.testing.assert_array_equal(a, b)
    assert sweep.walker(sweep.COMPILED_FROM - 1) is twin and sweep.walker(sweep.COMPILED_FROM) is compiled


def test_the_sample_incident_gives_the_oracles_figures_and_exposures(sample_case: Path) -> None:
    records = [json.loads(line) for f in sorted(SAMPLE.glob("*.jsonl")) for line in f.read_text().splitlines()]
    expected = reference.run(records)
    with forensics.Case(sample_case) as case:
        assert case.summary() == expected.figures
        found = {
            (r["reader_request"], r["victim_request"], r["node"], r["boot"]): (
                frozenset(expand(r["pages"])),
                r["first_seq"],
                r["inferred"],
            )
            for r in case.exposures(page_records_only=True).to_dicts()
        }
    assert found == expected.exposures
    assert expected.figures["exposed_responses"] > 0
