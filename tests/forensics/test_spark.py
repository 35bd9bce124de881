"""The analysis on Spark (local mode) gives exactly the DuckDB path's figures and rows: on the
sample incident, the spec's examples, and random log sets (held to the brute-force oracle too).

Needs the ``spark`` extra and Java; the test command installs both when it runs as root."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import example_dirs, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsets import log_sets, namespaced

import forensics
from forensics.exposure import reference
from forensics.store import connect

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
if shutil.which("java") is None:
    pytest.skip("no Java here (Debian: openjdk-17-jre-headless)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from forensics.spark import analyse, records_of_case, spark_session  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

_EXPOSURE_COLUMNS = ("reader_request", "victim_request", "node", "boot", "pages", "n_pages", "first_seq",
                     "inferred", "reader_tenant", "victim_tenant", "reader_delivered", "evidence")
_UNINITIALIZED_COLUMNS = ("node", "boot", "lo", "hi", "request_id", "seq", "inferred")


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", partitions=2)
    yield session
    session.stop()


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


def test_the_sample_incident_on_spark_is_the_duckdb_case(spark: SparkSession, tmp_path: Path) -> None:
    db = tmp_path / "case.duckdb"
    forensics.investigate([ROOT / "sample_logs" / "glm53-incident"], db)
    on_spark, on_duckdb = _spark_and_duckdb(spark, db, tmp_path / "spark")
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
