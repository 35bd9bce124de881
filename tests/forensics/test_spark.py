"""The analysis on Spark (local mode) gives exactly the DuckDB path's figures and rows: on the
sample incident, the spec's examples, and random log sets (held to the brute-force oracle too).

Needs the ``spark`` extra and Java; the test command installs both when it runs as root."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import example_dirs, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsets import log_sets, namespaced, ts_of

import forensics
from forensics.exposure import reference
from forensics.store import connect

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
if shutil.which("java") is None:
    pytest.skip("no Java here (Debian: openjdk-17-jre-headless)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from forensics.spark import analyse, records_of_case  # noqa: E402

_EXPOSURE_COLUMNS = ("reader_request", "victim_request", "node", "boot", "pages", "n_pages", "first_seq",
                     "inferred", "reader_tenant", "victim_tenant", "reader_delivered", "evidence")
_UNINITIALIZED_COLUMNS = ("node", "boot", "lo", "hi", "request_id", "seq", "inferred")


def _duckdb_rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    con = connect(db, read_only=True, create=False)
    try:
        exposures = con.execute(f"SELECT {', '.join(_EXPOSURE_COLUMNS)}, epoch_us(first_ts) FROM exposures").fetchall()
        uninitialized = con.execute(f"SELECT {', '.join(_UNINITIALIZED_COLUMNS)} FROM uninitialized_reads").fetchall()
    finally:
        con.close()
    return sorted(exposures), sorted(uninitialized)


def _spark_and_duckdb(spark: SparkSession, db: Path, tmp: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Analyse the case ``db`` on Spark; assert its rows equal the DuckDB case's; both figures."""
    result = analyse(records_of_case(spark, db, tmp))
    exposures = sorted(tuple(r) for r in result.exposures.select(
        *_EXPOSURE_COLUMNS, F.unix_micros("first_ts")).collect())
    uninitialized = sorted(tuple(r) for r in result.uninitialized_reads.select(*_UNINITIALIZED_COLUMNS).collect())
    want_exposures, want_uninitialized = _duckdb_rows(db)
    assert exposures == want_exposures
    assert uninitialized == want_uninitialized
    with forensics.Case(db) as case:
        return result.figures, dict(case.summary())


def test_the_sample_incident_on_spark_is_the_duckdb_case(spark: SparkSession, sample_case: Path,
                                                         tmp_path: Path) -> None:
    on_spark, on_duckdb = _spark_and_duckdb(spark, sample_case, tmp_path / "spark")
    assert on_spark["exposed_responses"] == 9  # (the sample's incident, as the README says)
    assert on_spark == on_duckdb


@pytest.mark.parametrize("example", example_dirs(), ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_each_spec_example_on_spark_gives_its_figures(spark: SparkSession, example: Path, tmp_path: Path) -> None:
    expected = json.loads((example / "expected.json").read_text())["exposure"]
    db = tmp_path / "case.duckdb"
    forensics.investigate([example / "events.jsonl"], db)
    on_spark, on_duckdb = _spark_and_duckdb(spark, db, tmp_path / "spark")
    assert on_spark == expected == on_duckdb


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sets=st.lists(log_sets(), min_size=8, max_size=16))
def test_random_log_sets_on_spark_equal_duckdb_and_the_oracle(spark: SparkSession, sets: list[list[dict[str, Any]]],
                                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """Many random log sets in one case (their names apart, so each set's figures add up): one
    Spark job covers them all."""
    tmp = tmp_path_factory.mktemp("spark-random")
    records = [r for i, one in enumerate(sets) for r in namespaced(i, one)]
    db = tmp / "case.duckdb"
    forensics.investigate([write_jsonl(tmp / "logs.jsonl", records)], db)
    on_spark, on_duckdb = _spark_and_duckdb(spark, db, tmp / "spark")
    assert on_spark == on_duckdb == reference.run(records).figures


def _across_boots() -> list[dict[str, Any]]:
    """Two boots of one node, each a task on Spark, and the two things that join across them:
    r1 read on decode-0 in boot 0, so its decode_started in boot 1 starts no inferred read (of
    r2's stale pages 0-3); r3 saw r4's pages 4-7 in boot 0 and r5's 4-5 in boot 1, four distinct
    pages of decode-0, not six."""
    out: list[dict[str, Any]] = []
    for rid, tenant in (("r1", "acme"), ("r2", "globex"), ("r3", "acme"), ("r4", "globex"), ("r5", "initech")):
        out.append({"kind": "request", "ts": ts_of(0, 0), "node": "router", "request_id": rid, "event": "received",
                    "tenant_id": tenant, "prompt_tokens": 8})
    boots: list[list[tuple[str, str, str]]] = [
        [("r1", "alloc", "0-3"), ("r1", "write", "0-3"), ("r1", "read", "0-1"), ("r1", "free", "0-3"),
         ("r4", "alloc", "4-7"), ("r4", "write", "4-7"), ("r4", "free", "4-7"),
         ("r3", "alloc", "4-7"), ("r3", "read", "4-7"), ("r3", "free", "4-7")],
        [("r2", "alloc", "0-3"), ("r2", "write", "0-3"), ("r2", "free", "0-3"),
         ("r1", "alloc", "0-3"), ("r1", "decode_started", ""), ("r1", "free", "0-3"),
         ("r5", "alloc", "4-5"), ("r5", "write", "4-5"), ("r5", "free", "4-5"),
         ("r3", "alloc", "4-5"), ("r3", "read", "4-5"), ("r3", "free", "4-5")],
    ]
    for boot, ops in enumerate(boots):
        out.append({"kind": "config", "ts": ts_of(boot, 0), "node": "decode-0", "seq": 0, "boot": boot,
                    "role": "decode", "engine": "sglang", "engine_version": "0.5.21", "model": "glm-5.3",
                    "context_length": 64, "page_size": 4, "pool_pages": 12})
        for seq, (rid, op, pages) in enumerate(ops, start=1):
            where = {"ts": ts_of(boot, seq), "node": "decode-0", "seq": seq, "boot": boot, "request_id": rid}
            out.append({"kind": "request", "event": op, **where} if op == "decode_started"
                       else {"kind": "kv", "op": op, "pages": pages, **where})
    for rid in ("r1", "r3"):
        out.append({"kind": "request", "ts": ts_of(1, 60), "node": "router", "request_id": rid, "event": "finished",
                    "status": 200})
    return out


def test_what_joins_across_boots_is_joined_on_spark(spark: SparkSession, tmp_path: Path) -> None:
    """A (node, boot) a task: a read in one boot still stops the inferred read of another, and a
    request's pages of a node are counted once over its boots."""
    records = _across_boots()
    db = tmp_path / "case.duckdb"
    forensics.investigate([write_jsonl(tmp_path / "logs.jsonl", records)], db)
    on_spark, on_duckdb = _spark_and_duckdb(spark, db, tmp_path / "spark")
    assert on_spark == on_duckdb == reference.run(records).figures
    assert on_spark["exposed_responses"] == 1  # r3 alone: r1 reads r2's pages by no inferred read
    assert on_spark["exposure_pairs"] == 2  # (r3, r4), (r3, r5)
    assert on_spark["exposed_page_reads"] == 4  # pages 4-7 of decode-0, once
