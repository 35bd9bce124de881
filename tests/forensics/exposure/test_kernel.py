"""The compiled page map: what it finds does not depend on when its pools are compacted, and on
the sample incident (pools grown many times over) it finds what the oracle finds."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import forensics
from forensics.exposure import reference, sweep
from forensics.exposure.reference import expand
from forensics.store import connect

SAMPLE = Path(__file__).resolve().parents[3] / "sample_logs" / "glm53-incident"


def _sample_events(sample_case: Path) -> tuple[list[np.ndarray], int]:
    con = connect(sample_case)
    try:
        con.execute(sweep.SETUP_SQL)
        n_requests = con.execute("SELECT count(*) FROM sweep_requests").fetchall()[0][0]
        last = con.execute("SELECT max(nb) FROM sweep_node_boots").fetchall()[0][0]
        return sweep.events(con, 0, last)[:6], n_requests
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


def test_runs_group_consecutive_node_boots_up_to_the_size() -> None:
    counts = [(0, 3), (1, 3), (2, 10), (3, 0), (4, 1), (5, 2)]
    assert sweep.runs(counts, 6) == [(0, 1), (2, 2), (3, 5)]  # one over the size is a run of its own
    assert sweep.runs(counts, 100) == [(0, 5)]
    assert sweep.runs(counts, 0) == [(i, i) for i in range(6)]
    assert sweep.runs([], 6) == []


def test_the_sweep_in_runs_of_one_node_boot_leaves_the_same_tables(sample_case: Path, tmp_path: Path) -> None:
    def tables(run_events: int) -> list[list[tuple[object, ...]]]:
        db = tmp_path / f"case-{run_events}.duckdb"
        db.write_bytes(sample_case.read_bytes())
        con = connect(db)
        try:
            with mock.patch.object(sweep, "RUN_EVENTS", run_events):
                sweep.sweep(con, fast=True)
            return [con.execute(f"FROM sweep_{name} ORDER BY ALL").fetchall() for name, _ in sweep.TABLES]
        finally:
            con.close()

    con = connect(sample_case)
    try:
        node_boots = con.execute("SELECT count(DISTINCT (node, boot)) FROM kv_ops").fetchall()[0][0]
    finally:
        con.close()
    assert node_boots > 1  # so that runs of one differ from a run of all
    whole, each = tables(sweep.RUN_EVENTS), tables(1)
    assert all(len(rows) for rows in whole)
    assert each == whole
