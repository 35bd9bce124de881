"""The findings on Spark: each query of ``sql/findings.sql`` run unchanged, on a part of the case at a time.

A finding's ``-- partition:`` says what each of its rows depends on. The case's rows are grouped
that way and each group goes to a task, which puts them in a DuckDB of its own and runs the
findings of that partition on them:

- ``boot``: a (node, boot)'s records, its exposures and uninitialized reads;
- ``request``: the requests of a bucket (their records, their rows of ``requests``), the transfer
  records that share a transfer id with theirs (whichever request id those carry: the
  ``transfers`` view looks across a transfer's two sides), and every config;
- ``transfer``: the transfer records of a bucket of transfer ids;
- ``case``: the whole case, run by the driver in DuckDB over the Parquet case;
- ``parts``: each of the finding's parts runs in the tasks of its own partition, and the driver
  sums their rows with the finding's query (``evidence.clock_skew``: a part per transfer bucket,
  a part per (node, boot); what reaches the driver is a row per link and bucket, and per node and
  boot).

A task writes each finding's rows into ``CASE/findings/ID/`` as a Parquet file named for its
group (a task run again writes the same file again), and a part's rows into ``CASE/.parts/ID/``,
which the driver removes once it has summed them; the driver adds a file of no rows that holds
each finding's columns. The Parquet case's manifest lists them, and
:func:`forensics.findings.findings` reads them in the query's order.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from forensics.findings import PART, FindingSpec, specs
from forensics.ingestion.settle import RECORD_TABLES
from forensics.spark.wire import Wire
from forensics.store import connect, open_parquet_case, scan

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

#: The analysis tables a finding reads, besides the records.
ANALYSIS_TABLES = ("requests", "exposures", "uninitialized_reads")
#: Where a Parquet case holds its findings' rows.
FOLDER = "findings"


def findings_wire(case: Path) -> Wire:
    """The wire of the record tables and the analysis tables of ``case`` (their columns as written)."""
    extra = {t: pq.read_schema(sorted((case / t).glob("*.parquet"))[0]) for t in ANALYSIS_TABLES}
    return Wire.of_case_tables(tuple(RECORD_TABLES.values()), extra)


def run_group(rows: pa.Table, wire: Wire, partition: str, out: Path, group: str) -> pa.Table:
    """The findings of ``partition`` on one group's rows (wire rows), each finding's rows written
    to ``out/ID/PARTITION-GROUP.parquet``: how many rows each had."""
    import pyarrow.compute as pc

    done: dict[str, list[object]] = {"finding": [], "rows": []}
    with tempfile.TemporaryDirectory(prefix="kvforensics-findings-") as tmp:
        con = connect(Path(tmp) / "part.duckdb")
        try:
            tables = rows.column("tbl")
            for table in RECORD_TABLES.values():
                wire.insert(con, table, rows.filter(pc.equal(tables, table)))
            for table in ANALYSIS_TABLES:
                own = wire.from_wire(table, rows.filter(pc.equal(tables, table)))
                scan(con, own, "own_rows", f"CREATE TABLE {table} AS FROM own_rows")
            for spec in _of(partition):
                found = con.sql(spec.sql).to_arrow_table()
                if found.num_rows:
                    write_atomic(found, out / spec.id / f"{partition}-{group}.parquet")
                done["finding"].append(spec.id)
                done["rows"].append(found.num_rows)
            for spec, k, sql in _parts_of(partition):
                found = con.sql(sql).to_arrow_table()
                if found.num_rows:
                    write_atomic(found, out.parent / PARTS / spec.id / f"{k}-{partition}-{group}.parquet")
                done["finding"].append(f"{spec.id}{PART}{k}")
                done["rows"].append(found.num_rows)
        finally:
            con.close()
    return pa.table(done, schema=DONE)


#: What a group's task hands back: each finding's row count there.
DONE = pa.schema([("finding", pa.string()), ("rows", pa.int64())])


def _of(partition: str) -> list[FindingSpec]:
    return [s for s in specs() if s.partition == partition]


def _parts_of(partition: str) -> list[tuple[FindingSpec, int, str]]:
    """The parts of findings that run in ``partition``'s tasks: finding, part number, query."""
    return [(s, k, sql) for s in specs() for k, (p, sql) in enumerate(s.parts) if p == partition]


#: Where a Parquet case being written holds its findings' parts' rows, until they are summed.
PARTS = ".parts"


def write_atomic(table: pa.Table, path: Path) -> None:
    """``table`` as the Parquet file ``path``, written beside it and renamed onto it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    pq.write_table(table, partial)
    os.replace(partial, path)


def group_name(key: str | None) -> str:
    """A group's key as a file name: its SHA-256's first 16 hex digits."""
    return hashlib.sha256((key or "").encode("utf-8", "surrogatepass")).hexdigest()[:16]


def run_findings(spark: SparkSession, case: Path, buckets: int) -> None:
    """Every finding of the Parquet case in the folder ``case`` (written but for its findings),
    into ``case/findings``: the partitioned ones by Spark tasks, the others by the driver."""
    from pyspark.sql import functions as F

    from forensics.spark.analysis import spark_schema

    wire = findings_wire(case)
    out = case / FOLDER
    frames = {t: spark.read.parquet(str(case / t)) for t in (*RECORD_TABLES.values(), *ANALYSIS_TABLES)}
    as_wire = {t: f.select(*wire.spark_columns(t, f.columns)) for t, f in frames.items()}

    def task(partition: str) -> Callable[[pa.Table], pa.Table]:
        def run(rows: pa.Table) -> pa.Table:
            key = rows.column("fkey")[0].as_py() if rows.num_rows else None
            return run_group(rows.drop_columns(["fkey"]), wire, partition, out, group_name(str(key)))
        return run

    def bucket(column: str) -> Column:
        return F.pmod(F.xxhash64(F.col(column)), F.lit(buckets)).cast("string")

    records = [as_wire[t] for t in RECORD_TABLES.values()]
    everything = records[0]
    for r in records[1:]:
        everything = everything.unionByName(r)
    parts: dict[str, DataFrame] = {}
    # boot: a (node, boot)'s records, exposures and uninitialized reads
    parts["boot"] = everything.unionByName(as_wire["exposures"]).unionByName(as_wire["uninitialized_reads"]) \
        .withColumn("fkey", F.to_json(F.array(F.col("wire_node"), F.col("boot").cast("string"))))
    # request: a bucket's requests' records and rows of requests; the transfer records sharing a
    # transfer id with the bucket's; every config, in every bucket
    owned = (as_wire["request_records"].unionByName(as_wire["kv_records"]).unionByName(as_wire["requests"])
             .filter(F.col("request_id").isNotNull()).withColumn("fkey", bucket("request_id")))
    transfers = as_wire["transfer_records"]
    shared = (transfers.filter(F.col("request_id").isNotNull())
              .select("transfer_id", bucket("request_id").alias("fkey")).distinct())
    carried = transfers.join(shared, transfers["transfer_id"].eqNullSafe(shared["transfer_id"])) \
        .drop(shared["transfer_id"])
    keys = spark.range(buckets).select(F.col("id").cast("string").alias("fkey"))
    configs = as_wire["config_records"].crossJoin(keys)
    parts["request"] = owned.unionByName(carried).unionByName(configs)
    # transfer: a bucket of transfer ids' records
    parts["transfer"] = transfers.withColumn("fkey", bucket("transfer_id"))
    for partition, frame in parts.items():
        if not _of(partition) and not _parts_of(partition):
            continue
        schema = spark_schema(pa.schema([*wire.schema, pa.field("fkey", pa.string())]))
        frame.select(*schema.fieldNames()).groupBy("fkey").applyInArrow(
            task(partition), spark_schema(DONE)).collect()
    con = open_parquet_case(case)
    try:
        for spec in _of("case"):
            found = con.sql(spec.sql).to_arrow_table()
            if found.num_rows:
                write_atomic(found, out / spec.id / "case.parquet")
        for spec in _of("parts"):
            found = _summed(spec, con, case / PARTS / spec.id)
            if found.num_rows:
                write_atomic(found, out / spec.id / "case.parquet")
        shutil.rmtree(case / PARTS, ignore_errors=True)
        for spec in specs():  # a file of no rows with the finding's columns, so that none has no file
            write_atomic(_columns_of(spec, con), out / spec.id / "columns.parquet")
    finally:
        con.close()


def _summed(spec: FindingSpec, con: duckdb.DuckDBPyConnection, folder: Path) -> pa.Table:
    """A finding's rows from its parts' rows (the files in ``folder``), by its query."""
    columns = con.sql(f"SELECT * FROM ({spec.parts_sql}) LIMIT 0").to_arrow_table()  # (an empty plan: no scan)
    found = [pq.read_table(f).cast(columns.schema) for f in sorted(folder.glob("*.parquet"))]
    con.register("parts", pa.concat_tables([columns, *found]))
    try:
        return con.sql(spec.merge).to_arrow_table()
    finally:
        con.unregister("parts")


def _columns_of(spec: FindingSpec, con: duckdb.DuckDBPyConnection) -> pa.Table:
    """The finding's columns, as its query gives them, with no rows."""
    return con.sql(f"SELECT * FROM ({spec.sql}) LIMIT 0").to_arrow_table()
