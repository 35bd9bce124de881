"""Exposure analysis equals the spec's examples and a brute-force oracle on random logs."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from conftest import example_dirs, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsets import log_sets, namespaced, scale_pages, ts_of

import forensics
from forensics.exposure import reference, sweep
from forensics.exposure.figures import FIGURES
from forensics.exposure.reference import expand


@pytest.mark.parametrize(
    "example", example_dirs(), ids=lambda p: f"{p.parent.parent.name}/{p.name}"
)
@pytest.mark.parametrize("fast", [True, False], ids=["compiled", "interpreted"])
def test_spec_example_gives_its_figures(example: Path, fast: bool, tmp_path: Path) -> None:
    expected = json.loads((example / "expected.json").read_text())["exposure"]
    found = forensics.investigate([example / "events.jsonl"], tmp_path / "case.duckdb", fast=fast)
    assert found.ingest.records.quarantined == 0
    assert found.exposure == expected
    assert list(found.exposure) == list(FIGURES)


def _sql_exposures(
    case: forensics.Case,
) -> dict[tuple[str, str, str, int], tuple[frozenset[int], int, bool]]:
    rows = case.exposures().to_dicts()
    return {
        (r["reader_request"], r["victim_request"], r["node"], r["boot"]): (
            frozenset(expand(r["pages"])),
            r["first_seq"],
            r["inferred"],
        )
        for r in rows
    }


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=st.lists(log_sets(), min_size=3, max_size=3), data=st.data())
def test_sql_equals_the_oracle_on_random_logs(
    sets: list[list[dict[str, Any]]], data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Figures and exposure rows equal the oracle's, whatever the split into files and order,
    whether the compiled accelerators or their interpreted twins and the SQL validator ran, and
    however the sweep groups the (node, boot)s into runs (each its own, a few, all in one).
    Three random log sets make one case, their names apart (so each set's rows are its own and
    the figures their sum): 20 examples investigate 60 log sets, each split and shuffled itself."""
    tmp = tmp_path_factory.mktemp("rand")
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    fast = data.draw(st.booleans())
    run_events = data.draw(st.sampled_from([1, 40, sweep.RUN_EVENTS]))
    records = [r for i, one in enumerate(sets) for r in namespaced(i, one)]
    files = []
    for i, one in enumerate(sets):
        shuffled = namespaced(i, one)
        rng.shuffle(shuffled)
        n_files = rng.randint(1, 3)
        files += [write_jsonl(tmp / f"set{i}-part{j}.jsonl", shuffled[j::n_files]) for j in range(n_files)]
    rng.shuffle(files)
    with mock.patch.object(sweep, "RUN_EVENTS", run_events):
        found = forensics.investigate(files, tmp / "case.duckdb", fast=fast)
    assert found.ingest.records.quarantined == 0
    expected = reference.run(records)
    assert found.exposure == expected.figures
    with forensics.Case(tmp / "case.duckdb") as case:
        assert _sql_exposures(case) == expected.exposures
        _check_rows_read_right(case)


def _check_rows_read_right(case: forensics.Case) -> None:
    """Each exposure's pages are maximal ranges in page order, and first_ts is the time of the
    record at its node, boot and first_seq."""
    for r in case.exposures().to_dicts():
        pages = sorted(set(expand(r["pages"])))
        ranges: list[list[int]] = []
        for p in pages:
            if ranges and p == ranges[-1][1] + 1:
                ranges[-1][1] = p
            else:
                ranges.append([p, p])
        assert r["pages"] == ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
        assert r["n_pages"] == len(pages)
        assert r["first_ts"].strftime("%Y-%m-%dT%H:%M:%SZ") == ts_of(r["boot"], r["first_seq"])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sets=st.lists(log_sets(), min_size=3, max_size=3))
def test_finer_pages_give_the_same_exposed_responses(
    sets: list[list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Page size 64 vs 1: same responses, victims, pairs; page counts scale by the factor. Three
    random log sets make one case, their names apart (5 examples: 15 log sets), and each exposure
    row is its fine twin's with n_pages scaled, so no set's error hides behind another's."""
    tmp = tmp_path_factory.mktemp("scale")
    records = [r for i, one in enumerate(sets) for r in namespaced(i, one)]
    coarse = forensics.investigate([write_jsonl(tmp / "a.jsonl", records)], tmp / "a.duckdb")
    fine = forensics.investigate(
        [write_jsonl(tmp / "b.jsonl", scale_pages(records, 64))], tmp / "b.duckdb"
    )
    for name in FIGURES:
        factor = 64 if name in ("exposed_page_reads", "uninitialized_reads") else 1
        assert fine.exposure[name] == coarse.exposure[name] * factor, name
    rows = {}
    for db, factor in (("a", 64), ("b", 1)):
        with forensics.Case(tmp / f"{db}.duckdb", read_only=True) as case:
            rows[db] = {(r["reader_request"], r["victim_request"], r["node"], r["boot"], r["first_seq"],
                         r["inferred"]): r["n_pages"] * factor for r in case.exposures().to_dicts()}
    assert rows["a"] == rows["b"]
