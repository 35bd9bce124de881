"""The analysis on Apache Spark: the same page sweep and analysis, one node per task.

The page sweep of log-schema.md section 5 works node by node (each boot on its own, and the
inferred reads of a node looking across its boots), and only naming requests (tenant, delivered)
and the figures join across nodes. So Spark groups a case's records by node, and each group runs
the DuckDB path's own analysis (``exposure.sweep`` and ``analysis.sql``, unchanged) on that
node's records in a DuckDB of its own; what it leaves that depends on that node alone (the
exposure rows but for their requests' tenant and delivery, the uninitialized reads, and each
reader's distinct pages per node) comes back to Spark, which joins the requests' facts (the
statement of ``analysis.sql`` that makes the ``requests`` table, run by Spark SQL) and counts
the eight figures. Not a second implementation: the rules are stated once.

Needs the ``spark`` extra (``pip install 'kvforensics[spark]'``) and Java 17 or later. Local mode
(``local[N]``) runs on this machine; a cluster is named by its master URL.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from forensics.exposure.figures import FIGURES
from forensics.store import connect, scan, session, sql_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The record columns the analysis reads.
COLUMNS = ("kind", "ts", "node", "boot", "seq", "request_id", "event", "op", "page_ranges", "tenant_id",
           "prompt_tokens", "status")

#: What a node's task hands back: rows of four kinds (``part``), each with the columns it uses.
#: ``exposure``: an exposure row without its requests' tenants and delivery; ``uninitialized``: an
#: uninitialized read; ``page_read``: a row of ``page_reads`` (``seq`` its start); ``exposed_pages``/
#: ``uninitialized_pages``: a request's distinct pages of that kind on the node (its ranges merged
#: over the node's boots), as ``n_pages``.
NODE_ROWS = pa.schema([
    ("part", pa.string()), ("node", pa.string()), ("boot", pa.int64()), ("reader", pa.string()),
    ("victim", pa.string()), ("pages", pa.string()), ("n_pages", pa.int64()), ("seq", pa.int64()),
    ("ts", pa.timestamp("us", tz="UTC")), ("inferred", pa.bool_()), ("lo", pa.int64()), ("hi", pa.int64()),
    ("end_seq", pa.int64()),
])

#: The node's own rows, from the tables the DuckDB analysis left (``sweep_exposures`` holds each
#: reader's exposed ranges, merged per node and boot).
_NODE_SQL = """
WITH merged AS (  -- a request's ranges on the node, over its boots, as maximal ranges
  SELECT part, reader, min(lo) AS lo, max(hi) AS hi FROM (
    SELECT *, sum(new_island) OVER (PARTITION BY part, reader ORDER BY lo, hi) AS island FROM (
      SELECT *, CASE WHEN lo > max(hi) OVER (PARTITION BY part, reader ORDER BY lo, hi
                     ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 1 ELSE 0 END AS new_island
      FROM (SELECT 'exposed_pages' AS part, reader, lo, hi FROM sweep_exposures
            UNION ALL SELECT 'uninitialized_pages', reader, lo, hi FROM sweep_uninitialized)))
  GROUP BY part, reader, island)
SELECT 'exposure' AS part, node, boot::BIGINT AS boot, reader_request AS reader, victim_request AS victim, pages,
       n_pages, first_seq::BIGINT AS seq, first_ts AS ts, inferred, NULL::BIGINT AS lo, NULL::BIGINT AS hi,
       NULL::BIGINT AS end_seq
FROM exposures
UNION ALL
SELECT 'uninitialized', node, boot, request_id, NULL, NULL, NULL, seq, NULL, inferred, lo, hi, NULL
FROM uninitialized_reads
UNION ALL
SELECT 'page_read', node, boot, request_id, NULL, NULL, NULL, start_seq, NULL, inferred, lo, hi, end_seq FROM page_reads
UNION ALL
SELECT m.part, $node, NULL, q.request_id, NULL, NULL, sum(m.hi - m.lo + 1)::BIGINT, NULL, NULL, NULL, NULL, NULL, NULL
FROM merged m JOIN sweep_requests q ON q.rid = m.reader GROUP BY m.part, q.request_id
"""


def analyse_node(records: pa.Table) -> pa.Table:
    """One node's records (:data:`COLUMNS`) through the DuckDB path's analysis: its rows
    (:data:`NODE_ROWS`)."""
    from forensics.exposure.sweep import sweep  # (numpy and numba load only to analyse)

    con = duckdb.connect()
    try:
        session(con)
        scan(con, records, "node_records", "CREATE TABLE records AS FROM node_records")
        node = records["node"][0].as_py() if records.num_rows else ""
        sweep(con, fast=True)  # (a worker lives on past its task: the machine code loads once)
        con.execute(sql_text("analysis.sql"))
        return con.sql(_NODE_SQL, params={"node": node}).to_arrow_table().cast(NODE_ROWS)
    finally:
        con.close()


def _requests_sql() -> str:
    """The statement of ``analysis.sql`` that makes the ``requests`` table, as a query."""
    text = sql_text("analysis.sql")
    m = re.search(r"CREATE OR REPLACE TABLE requests AS\s+(SELECT .*?);", text, re.S)
    assert m is not None, "analysis.sql makes the requests table"
    return re.sub(r"\bFROM records\b", "FROM kvforensics_records", m.group(1))


@dataclass(frozen=True)
class SparkResult:
    """The Spark analysis of a case: its figures, counted, and its tables as a DuckDB case holds
    them (the same columns), as Spark DataFrames."""

    figures: dict[str, int]
    exposures: DataFrame
    uninitialized_reads: DataFrame
    page_reads: DataFrame
    requests: DataFrame


def spark_session(master: str = "local[2]", *, partitions: int = 8, app: str = "kvforensics",
                  progress: bool = False) -> SparkSession:
    """A Spark session for the investigation: workers run this Python, times in UTC (and written to
    Parquet as microseconds, as DuckDB reads them), no web UI; ``progress``: Spark's console bar."""
    import shutil

    from forensics.errors import EngineMissing

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise EngineMissing("Spark needs Java 17 or later, and there is none here (Debian: apt-get install "
                            "openjdk-17-jre-headless)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise EngineMissing("the Spark engine needs the spark extra: pip install 'kvforensics[spark]'") from exc

    return (SparkSession.builder.master(master).appName(app)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.sql.shuffle.partitions", str(partitions))
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
            .config("spark.ui.showConsoleProgress", "true" if progress else "false")
            .getOrCreate())  # (Spark says what it fails with; its warnings are for its operators)


def records_of_case(spark: SparkSession, db: Path | str, folder: Path | str) -> DataFrame:
    """The records of the DuckDB case ``db`` (:data:`COLUMNS`) as Parquet in ``folder``, read by Spark."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "records.parquet"
    con = connect(db, read_only=True, create=False)
    try:
        target = str(path).replace("'", "''")
        con.execute(f"COPY (SELECT {', '.join(COLUMNS)} FROM records ORDER BY node, boot, seq, ts) "
                    f"TO '{target}' (FORMAT parquet)")
    finally:
        con.close()
    return spark.read.parquet(str(path))


def analyse(records: DataFrame) -> SparkResult:
    """The analysis of ``records`` (a DataFrame of :data:`COLUMNS`): per node in a task, then joined."""
    from pyspark.sql import functions as F

    spark = records.sparkSession
    node_rows = records.select(*COLUMNS).groupBy("node").applyInArrow(analyse_node, spark_schema(NODE_ROWS))
    node_rows = node_rows.cache()
    records.createOrReplaceTempView("kvforensics_records")
    all_requests = spark.sql(_requests_sql())
    requests = all_requests.select("request_id", "tenant_id", "delivered")
    involved = (node_rows.select(F.col("reader").alias("request_id"))
                .union(node_rows.select(F.col("victim").alias("request_id"))).distinct())
    facts = requests.join(involved, "request_id", "left_semi").select(
        F.col("request_id"), F.col("tenant_id"), F.coalesce(F.col("delivered"), F.lit(False)).alias("delivered")
    ).cache()  # (only the requests the node rows name: the exposures' and pages' facts)
    r = facts.select(F.col("request_id").alias("reader"), F.col("tenant_id").alias("reader_tenant"),
                     F.col("delivered").alias("reader_delivered"))
    v = facts.select(F.col("request_id").alias("victim"), F.col("tenant_id").alias("victim_tenant"))
    rows = node_rows.filter(F.col("part") == "exposure")
    exposures = (rows.join(r, "reader", "left").join(v, "victim", "left")
                 .select(F.col("reader").alias("reader_request"), F.col("victim").alias("victim_request"),
                         "node", "boot", "pages", "n_pages", F.col("seq").alias("first_seq"),
                         F.col("ts").alias("first_ts"), "inferred", "reader_tenant", "victim_tenant",
                         F.coalesce(F.col("reader_delivered"), F.lit(False)).alias("reader_delivered"),
                         F.when(F.col("inferred"), F.lit("page records, read inferred"))
                         .otherwise(F.lit("page records")).alias("evidence")))
    uninitialized = (node_rows.filter(F.col("part") == "uninitialized")
                     .select("node", "boot", "lo", "hi", F.col("reader").alias("request_id"), "seq", "inferred"))
    page_reads = (node_rows.filter(F.col("part") == "page_read")
                  .select("node", "boot", "lo", "hi", F.col("reader").alias("request_id"),
                          F.col("seq").alias("start_seq"), "end_seq", "inferred"))
    pages = (node_rows.filter(F.col("part").isin("exposed_pages", "uninitialized_pages"))
             .join(r, "reader", "left").cache())
    exposures = exposures.cache()
    exposures.createOrReplaceTempView("spark_exposures")
    pages.createOrReplaceTempView("spark_pages")
    row = spark.sql(_FIGURES_SQL).collect()[0]
    pages.unpersist()  # (the node rows and the exposures stay cached: the result's frames read them)
    return SparkResult({name: int(row[name] or 0) for name in FIGURES}, exposures, uninitialized, page_reads,
                       all_requests)


#: The eight figures (figures.DEFINITIONS) from the joined rows, by Spark SQL.
_FIGURES_SQL = """
WITH d AS (SELECT * FROM spark_exposures WHERE reader_delivered)
SELECT
  (SELECT count(DISTINCT reader_request) FROM d) AS exposed_responses,
  (SELECT count(DISTINCT reader_request) FROM spark_exposures WHERE NOT reader_delivered) AS contained_requests,
  (SELECT count(DISTINCT victim_request) FROM d) AS victim_requests,
  (SELECT count(*) FROM (SELECT DISTINCT reader_request, victim_request FROM d)) AS exposure_pairs,
  (SELECT count(*) FROM (SELECT DISTINCT reader_request, victim_request FROM d
                         WHERE reader_tenant <> victim_tenant)) AS cross_tenant_pairs,
  (SELECT coalesce(sum(n_pages), 0) FROM spark_pages WHERE part = 'exposed_pages' AND reader_delivered)
    AS exposed_page_reads,
  (SELECT coalesce(sum(n_pages), 0) FROM spark_pages WHERE part = 'uninitialized_pages') AS uninitialized_reads,
  (SELECT count(DISTINCT victim_tenant) FROM d) AS affected_tenants
"""


def spark_schema(schema: pa.Schema) -> Any:
    """An Arrow schema as Spark's."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def analyse_case(db: Path | str, *, master: str = "local[2]", partitions: int = 8) -> dict[str, int]:
    """The figures of the DuckDB case ``db`` computed on Spark (its records exported as Parquet)."""
    spark = spark_session(master, partitions=partitions)
    with tempfile.TemporaryDirectory(prefix="kvforensics-spark-") as tmp:
        return analyse(records_of_case(spark, db, tmp)).figures
