"""Ingest on Spark: the DuckDB path's reading, validation and settling, file by file and node by node.

The DuckDB ingest reads each file (validating its lines, :func:`forensics.ingestion.pipeline.ingest`)
and then settles it against the case (repeats to duplicates, conflicts on ``(node, boot, seq)``
and pages beyond the pool to quarantine, :func:`forensics.ingestion.settle.settle_across`). The
first depends on the file alone; each rule of the second on one node's records alone. So on Spark:

1. a task per file reads it into a DuckDB case of its own by the same code
   (:func:`~forensics.ingestion.pipeline.ingest_alone`: its lines placed in their kind's table or
   quarantine, or the file refused), and hands back what that case holds;
2. the driver numbers the files as the DuckDB path would (in the order found, a file whose bytes
   came earlier or that was refused taking no number);
3. a task per node puts that node's records in a DuckDB case of its own, file by file in that
   order, settling each as the DuckDB path does (with the text of their files, for a record that
   goes to quarantine takes its line along);
4. the one rule that spans nodes, a request id ``received`` with two tenants or prompt lengths
   (:func:`~forensics.ingestion.settle.resolve_received`), runs once on the driver over the
   received records of the ids in dispute (few: none in a sound log set), in a DuckDB case of
   their records, duplicates and lines; it ends as the DuckDB path's file-by-file settling does,
   since that ends alike whatever the order of the files.

What the tasks hand each other are rows of :func:`ingest_wire` (every table's columns side by side,
a row of one table at a time, a record hash as its hex text), so Spark moves them without
knowing the case schema.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from forensics.adapters import Options
from forensics.ingestion.pipeline import ingest_alone
from forensics.ingestion.readers import LogFile
from forensics.ingestion.settle import RECORD_TABLES, resolve_received, settle_across
from forensics.ingestion.validate import prepare
from forensics.spark.wire import Wire, select_text
from forensics.store import connect, scan, schema_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The tables a file's task hands back (``files``/``file_notes``/``refused_files``: a row or a few
#: per file), and those a node's task does.
FILE_TABLES = (*RECORD_TABLES.values(), "quarantine", "source_lines", "files", "file_notes", "refused_files")
NODE_TABLES = (*RECORD_TABLES.values(), "quarantine", "duplicates")
_TABLES = (*FILE_TABLES, "duplicates", "received_conflicts")
#: What the driver's settling of received conflicts hands back.
RECEIVED_TABLES = ("request_records", "quarantine", "duplicates", "received_conflicts")


@cache
def ingest_wire() -> Wire:
    """The ingest's wire: the tables the file and node tasks hand on."""
    return Wire.of_case_tables(_TABLES)


def _select(table: str) -> str:
    return select_text(schema_columns()[table])


#: A file task's batches: at most this many rows each.
BATCH_ROWS = 65_536


def read_file(log: LogFile, idx: int, options: Options) -> Iterator[pa.RecordBatch]:
    """The ``idx``-th file found, read into a case of its own (:func:`ingest_alone`): what that case
    holds, as wire rows (its ``file_id`` is ``idx`` there; the driver numbers the files later)."""
    with tempfile.TemporaryDirectory(prefix="kvforensics-file-") as tmp:
        db = Path(tmp) / "file.duckdb"
        ingest_alone(log, db, options)
        con = connect(db, read_only=True, create=False)
        try:
            for table in FILE_TABLES:
                select = _select(table).replace("file_id", f"{idx}::INTEGER AS file_id", 1) \
                    if table != "refused_files" else _select(table)
                reader = con.sql(f"SELECT {select} FROM {table}").fetch_arrow_reader(BATCH_ROWS)
                for batch in reader:
                    if batch.num_rows:
                        yield ingest_wire().to_wire(table, batch, idx)
        finally:
            con.close()


def settle_node(rows: pa.Table, files: pa.Table) -> Iterator[pa.RecordBatch]:
    """One node's records (wire rows of the record tables, with the ``source_lines`` of their
    files) settled as the DuckDB path settles them, file by file in the order of ``file_id``:
    the node's records, duplicates and quarantined records, as wire rows. ``files``: every file
    of the case (its ``files`` rows)."""
    if not rows.num_rows:
        return
    node = rows.column("wire_node")[0].as_py()
    file_id = ingest_wire().names["files", "file_id"]
    rows = rows.sort_by([(file_id, "ascending"), ("tbl", "ascending")])
    ids = rows.column(file_id).to_numpy()
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    with tempfile.TemporaryDirectory(prefix="kvforensics-node-") as tmp:
        con = connect(Path(tmp) / "node.duckdb")
        try:
            prepare(con)  # (a conflict's contenders are validated again, for their canonical JSON)
            scan(con, files, "case_files", "INSERT INTO files SELECT * FROM case_files")
            for at, stop in zip(starts.tolist(), [*starts[1:].tolist(), len(ids)], strict=True):
                of_file = rows.slice(at, stop - at)
                tables = of_file.column("tbl")
                con.execute("BEGIN")
                for table in (*RECORD_TABLES.values(), "source_lines"):
                    ingest_wire().insert(con, table, of_file.filter(pc.equal(tables, table)))
                settle_across(con, int(ids[at]))
                con.execute("COMMIT")
            for table in NODE_TABLES:
                reader = con.sql(f"SELECT {_select(table)} FROM {table}").fetch_arrow_reader(BATCH_ROWS)
                for batch in reader:
                    if batch.num_rows:
                        yield ingest_wire().to_wire(table, batch, -1, node)
        finally:
            con.close()


@dataclass(frozen=True)
class Numbered:
    """The files of a run as the DuckDB path numbers them: ``ids`` maps a file's place in the
    order found to its ``file_id`` (a file refused, or whose bytes came earlier, has none)."""

    ids: dict[int, int]
    files: pa.Table  # the ``files`` rows, numbered
    file_notes: pa.Table
    refused_files: pa.Table
    sha256: dict[int, str]  # every file read, by its place


def number_files(files: pa.Table, notes: pa.Table, refused: pa.Table) -> Numbered:
    """Number the files read (wire rows of ``files``, ``file_notes``, ``refused_files``)."""
    found = sorted(zip(files.column("idx").to_pylist(), files.column("sha256").to_pylist(), strict=True))
    ids: dict[int, int] = {}
    seen: set[str] = set()
    for idx, sha in found:
        if sha in seen:
            continue
        seen.add(sha)
        ids[idx] = len(ids) + 1
    own = _renumbered(files, "files", ids).sort_by("file_id")
    note_rows = _renumbered(notes, "file_notes", ids).sort_by([("file_id", "ascending"), ("key", "ascending")])
    return Numbered(ids, own, note_rows, ingest_wire().from_wire("refused_files", refused).sort_by("path"), dict(found))


def _renumbered(rows: pa.Table, table: str, ids: dict[int, int]) -> pa.Table:
    """Wire rows of ``table`` of the files numbered in ``ids`` (by place), as its own columns with
    ``file_id`` their number."""
    places = rows.column("idx").to_pylist()
    keep = pa.array([i for i, idx in enumerate(places) if idx in ids], pa.int64())
    own = ingest_wire().from_wire(table, rows).take(keep)
    numbers = pa.array([ids[places[i]] for i in keep.to_pylist()], pa.int32())
    return own.set_column(own.schema.get_field_index("file_id"), "file_id", numbers)


def read_files(spark: SparkSession, logs: Sequence[LogFile], options: Options, stage: Path) -> DataFrame:
    """Every file read by a task of its own: their wire rows, written to ``stage`` (Parquet) and
    read back, so later steps never read a file twice."""
    from pyspark.sql.types import IntegerType, StructField, StructType

    from forensics.spark.analysis import spark_schema

    listed = list(logs)
    places = spark.createDataFrame([(i,) for i in range(len(listed))],
                                   StructType([StructField("place", IntegerType(), False)]))
    places = places.repartition(max(1, len(listed)), "place")

    def read(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for i in batch.column("place").to_pylist():
                yield from read_file(listed[i], i, options)

    places.mapInArrow(read, spark_schema(ingest_wire().schema)).write.mode("overwrite").parquet(str(stage))
    return spark.read.parquet(str(stage))


def numbered_rows(spark: SparkSession, rows: DataFrame, numbered: Numbered) -> DataFrame:
    """The file tasks' wire rows of the files numbered, each with its file's number as ``file_id``."""
    from pyspark.sql import functions as F

    file_id = ingest_wire().names["files", "file_id"]
    ids = spark.createDataFrame(sorted(numbered.ids.items()), "idx INT, new_id INT")
    return rows.join(F.broadcast(ids), "idx").withColumn(file_id, F.col("new_id")).drop("new_id")


def settle_nodes(spark: SparkSession, rows: DataFrame, numbered: Numbered, stage: Path) -> DataFrame:
    """The files' records settled node by node (:func:`settle_node`): the node tasks' wire rows,
    written to ``stage`` and read back. ``rows``: the file tasks' rows, numbered (:func:`numbered_rows`)."""
    from pyspark.sql import functions as F

    from forensics.spark.analysis import spark_schema

    file_id = ingest_wire().names["files", "file_id"]
    records = rows.filter(F.col("tbl").isin(*RECORD_TABLES.values()))
    # each file's text goes to every node it has records of: a record moved to quarantine takes its line
    touched = records.select(F.col(file_id).alias("f"), F.col("wire_node").alias("n")).distinct()
    pieces = (rows.filter(F.col("tbl") == "source_lines").join(touched, F.col(file_id) == F.col("f"))
              .withColumn("wire_node", F.col("n")).drop("f", "n"))
    files = numbered.files

    def settle(rows: pa.Table) -> pa.Table:
        return pa.Table.from_batches(list(settle_node(rows, files)), schema=ingest_wire().schema)

    settled = records.unionByName(pieces).groupBy("wire_node").applyInArrow(settle, spark_schema(ingest_wire().schema))
    settled.write.mode("overwrite").parquet(str(stage))
    return spark.read.parquet(str(stage))


def settle_received(spark: SparkSession, settled: DataFrame, read_rows: DataFrame, numbered: Numbered,
                    stage: Path) -> DataFrame:
    """``settled`` (:func:`settle_nodes`) with the received records of the ids in dispute settled
    (:func:`~forensics.ingestion.settle.resolve_received`): their request records and duplicates
    replaced by what the DuckDB path keeps, and their quarantine rows and
    ``received_conflicts``, written to ``stage`` and read back. ``read_rows``: the file tasks' rows,
    numbered (their ``source_lines``)."""
    from pyspark.sql import functions as F

    from forensics.spark.analysis import spark_schema

    wire = ingest_wire()
    tbl, rid, event = F.col("tbl"), F.col(wire.names["request_records", "request_id"]), F.col(
        wire.names["request_records", "event"])
    claim = F.struct(F.col(wire.names["request_records", "tenant_id"]),
                     F.col(wire.names["request_records", "prompt_tokens"]))
    received = settled.filter((tbl == "request_records") & (event == "received"))
    disputed = received.groupBy(rid.alias("rid")).agg(F.countDistinct(claim).alias("n")).filter("n > 1")
    ids = sorted(r["rid"] for r in disputed.collect())
    if not ids:
        return settled
    rec_hash, file_id = wire.names["request_records", "rec_hash"], wire.names["files", "file_id"]
    rivals = received.filter(rid.isin(ids))
    hashes = sorted({r[rec_hash] for r in rivals.select(rec_hash).collect()})
    mine = tbl.isin("request_records", "duplicates") & F.col(rec_hash).isin(hashes)
    held = settled.filter(mine).toArrow()
    files = sorted({f for f in held.column(file_id).to_pylist() if f is not None})
    lines = read_rows.filter((tbl == "source_lines") & F.col(file_id).isin(files)).toArrow()
    both = pa.concat_tables([t.select(wire.schema.names).cast(wire.schema) for t in (held, lines)])
    out = list(_settled_received(both, numbered.files))
    again = spark.createDataFrame(pa.Table.from_batches(out, schema=wire.schema), spark_schema(wire.schema)) \
        if out else None
    kept = settled.filter(~mine)
    whole = kept if again is None else kept.unionByName(again)
    whole.write.mode("overwrite").parquet(str(stage))
    return spark.read.parquet(str(stage))


def _settled_received(rows: pa.Table, files: pa.Table) -> Iterator[pa.RecordBatch]:
    """The received records of the ids in dispute (wire rows of their request records, duplicates,
    quarantine, with the ``source_lines`` of their files) settled in a DuckDB case of their own:
    its :data:`RECEIVED_TABLES`, as wire rows."""
    with tempfile.TemporaryDirectory(prefix="kvforensics-received-") as tmp:
        con = connect(Path(tmp) / "received.duckdb")
        try:
            prepare(con)
            scan(con, files, "case_files", "INSERT INTO files SELECT * FROM case_files")
            tables = rows.column("tbl")
            for table in ("request_records", "duplicates", "source_lines"):
                ingest_wire().insert(con, table, rows.filter(pc.equal(tables, table)))
            resolve_received(con, None)
            for table in RECEIVED_TABLES:
                for batch in con.sql(f"SELECT {_select(table)} FROM {table}").to_arrow_table().to_batches(BATCH_ROWS):
                    if batch.num_rows:
                        yield ingest_wire().to_wire(table, batch, -1)
        finally:
            con.close()


__all__ = ["FILE_TABLES", "NODE_TABLES", "Numbered", "ingest_wire", "number_files", "numbered_rows", "read_file",
           "read_files", "settle_node", "settle_nodes", "settle_received"]
