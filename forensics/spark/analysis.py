"""The analysis on Apache Spark: the same page sweep and analysis, one (node, boot) per task.

The page sweep of log-schema.md section 5 works (node, boot) by (node, boot), and only three
things join across them: whether a request read on a node in any boot (then its
``decode_started`` there starts no inferred read), a request's distinct pages on a node over its
boots, and naming requests (tenant, delivered) for the figures. So Spark finds the first (the
node's readers) before the sweep, and keeps only the ``decode_started`` records that start an
inferred read; then it groups the page records by (node, boot), and each group runs the DuckDB
path's own analysis (``exposure.sweep`` and ``analysis.sql``, unchanged) in a DuckDB of its own.
What comes back depends on that (node, boot) alone (the exposure rows but for their requests'
tenant and delivery, the uninitialized reads, the reading intervals, and each reader's exposed
page ranges); Spark joins the requests' facts (the statement of ``analysis.sql`` that makes the
``requests`` table) and counts the eight figures by ``analysis.sql``'s own statement of them
(its ``union_pages`` over the boots of a node included), run by Spark SQL. Not a second
implementation: the rules are stated once.

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

#: What a (node, boot)'s task hands back: rows of four kinds (``part``), each with the columns it
#: uses. ``exposure``: an exposure row without its requests' tenants and delivery;
#: ``uninitialized``: an uninitialized read; ``page_read``: a row of ``page_reads`` (``seq`` its
#: start); ``exposed_range``: a page range where ``reader`` saw another request's content.
BOOT_ROWS = pa.schema([
    ("part", pa.string()), ("node", pa.string()), ("boot", pa.int64()), ("reader", pa.string()),
    ("victim", pa.string()), ("pages", pa.string()), ("n_pages", pa.int64()), ("seq", pa.int64()),
    ("ts", pa.timestamp("us", tz="UTC")), ("inferred", pa.bool_()), ("lo", pa.int64()), ("hi", pa.int64()),
    ("end_seq", pa.int64()),
])

#: The (node, boot)'s own rows, from the tables the DuckDB analysis left.
_BOOT_SQL = """
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
SELECT DISTINCT 'exposed_range', nb.node, nb.boot, q.request_id, NULL, NULL, NULL, NULL, NULL, NULL, e.lo, e.hi, NULL
FROM sweep_exposures e JOIN sweep_node_boots nb USING (nb) JOIN sweep_requests q ON q.rid = e.reader
"""


def analyse_boot(records: pa.Table) -> pa.Table:
    """One (node, boot)'s records (:data:`COLUMNS`; of its ``decode_started`` records only those
    that start an inferred read: :func:`sweep_records`) through the DuckDB path's analysis: its
    rows (:data:`BOOT_ROWS`)."""
    from forensics.exposure.sweep import sweep  # (numpy and numba load only to analyse)

    con = duckdb.connect()
    try:
        session(con)
        scan(con, records, "boot_records", "CREATE TABLE records AS FROM boot_records")
        sweep(con, fast=True)  # (a worker lives on past its task: the machine code loads once)
        con.execute(sql_text("analysis.sql"))
        return con.sql(_BOOT_SQL).to_arrow_table().cast(BOOT_ROWS)
    finally:
        con.close()


def sweep_records(records: DataFrame) -> DataFrame:
    """What the sweep reads of ``records``: the page records, and the ``decode_started`` records
    of requests with no ``read`` on their node in any boot (the others start no inferred read:
    ``sweep.SETUP_SQL``'s ``sweep_readers``, which is why a (node, boot) needs no other boot)."""
    readers = (records.filter("kind = 'kv' AND op = 'read' AND seq IS NOT NULL AND size(page_ranges) > 0")
               .select("node", "request_id").distinct())
    starts = (records.filter("kind = 'request' AND event = 'decode_started' AND seq IS NOT NULL")
              .join(readers, ["node", "request_id"], "left_anti"))
    return records.filter("kind = 'kv' AND seq IS NOT NULL").select(*COLUMNS).unionByName(starts.select(*COLUMNS))


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
    """The analysis of ``records`` (a DataFrame of :data:`COLUMNS`): per (node, boot) in a task,
    then joined."""
    from pyspark.sql import functions as F

    spark = records.sparkSession
    boot_rows = (sweep_records(records).groupBy("node", "boot")
                 .applyInArrow(analyse_boot, spark_schema(BOOT_ROWS)).cache())
    records.createOrReplaceTempView("kvforensics_records")
    all_requests = spark.sql(_requests_sql())
    requests = all_requests.select("request_id", "tenant_id", "delivered")
    involved = (boot_rows.select(F.col("reader").alias("request_id"))
                .union(boot_rows.select(F.col("victim").alias("request_id"))).distinct())
    facts = requests.join(involved, "request_id", "left_semi").select(
        F.col("request_id"), F.col("tenant_id"), F.coalesce(F.col("delivered"), F.lit(False)).alias("delivered")
    ).cache()  # (only the requests the rows name: the exposures' and pages' facts)
    r = facts.select(F.col("request_id").alias("reader"), F.col("tenant_id").alias("reader_tenant"),
                     F.col("delivered").alias("reader_delivered"))
    v = facts.select(F.col("request_id").alias("victim"), F.col("tenant_id").alias("victim_tenant"))
    rows = boot_rows.filter(F.col("part") == "exposure")
    exposures = (rows.join(r, "reader", "left").join(v, "victim", "left")
                 .select(F.col("reader").alias("reader_request"), F.col("victim").alias("victim_request"),
                         "node", "boot", "pages", "n_pages", F.col("seq").alias("first_seq"),
                         F.col("ts").alias("first_ts"), "inferred", "reader_tenant", "victim_tenant",
                         F.coalesce(F.col("reader_delivered"), F.lit(False)).alias("reader_delivered"),
                         F.when(F.col("inferred"), F.lit("page records, read inferred"))
                         .otherwise(F.lit("page records")).alias("evidence"))).cache()
    uninitialized = (boot_rows.filter(F.col("part") == "uninitialized")
                     .select("node", "boot", "lo", "hi", F.col("reader").alias("request_id"), "seq", "inferred"))
    page_reads = (boot_rows.filter(F.col("part") == "page_read")
                  .select("node", "boot", "lo", "hi", F.col("reader").alias("request_id"),
                          F.col("seq").alias("start_seq"), "end_seq", "inferred"))
    # the ranges analysis.sql's figures take the union of per request and node, over its boots
    delivered_ranges = (boot_rows.filter(F.col("part") == "exposed_range").join(r, "reader")
                        .filter(F.col("reader_delivered"))
                        .select(F.col("reader").alias("rid"), F.col("node").alias("node_id"), "lo", "hi"))
    uninitialized_ranges = uninitialized.select(F.col("request_id").alias("rid"), F.col("node").alias("node_id"),
                                                "lo", "hi")
    exposures.createOrReplaceTempView("spark_exposures")
    delivered_ranges.createOrReplaceTempView("spark_delivered_exposed_ranges")
    uninitialized_ranges.createOrReplaceTempView("spark_uninitialized_ranges")
    row = spark.sql(_figures_sql()).collect()[0]
    return SparkResult({name: int(row[name] or 0) for name in FIGURES}, exposures, uninitialized, page_reads,
                       all_requests)  # (the rows and the exposures stay cached: the result's frames read them)


def _figures_sql() -> str:
    """The statement of ``analysis.sql`` that counts the eight figures (figures.DEFINITIONS), as a
    Spark SQL query of the views ``spark_exposures``, ``spark_delivered_exposed_ranges`` and
    ``spark_uninitialized_ranges``: its ``union_pages`` macro written out where it is called."""
    text = sql_text("analysis.sql")
    macro = re.search(r"CREATE OR REPLACE TEMP MACRO union_pages\(tbl\) AS TABLE\s+(SELECT .*?);", text, re.S)
    summary = re.search(r"CREATE OR REPLACE TABLE exposure_summary AS\s+(WITH .*?);", text, re.S)
    assert macro is not None and summary is not None, "analysis.sql counts the figures with union_pages"
    query = re.sub(r"\bunion_pages\('(\w+)'\)",
                   lambda m: f"({macro.group(1).replace('query_table(tbl)', 'spark_' + m.group(1))})", summary.group(1))
    return re.sub(r"\bFROM exposures\b", "FROM spark_exposures", query)


def spark_schema(schema: pa.Schema) -> Any:
    """An Arrow schema as Spark's."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def analyse_case(db: Path | str, *, master: str = "local[2]", partitions: int = 8) -> dict[str, int]:
    """The figures of the DuckDB case ``db`` computed on Spark (its records exported as Parquet)."""
    spark = spark_session(master, partitions=partitions)
    with tempfile.TemporaryDirectory(prefix="kvforensics-spark-") as tmp:
        return analyse(records_of_case(spark, db, tmp)).figures
