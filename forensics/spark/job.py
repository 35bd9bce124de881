"""The investigation on Spark, logs to case: ingest (:mod:`forensics.spark.ingest`), analysis
(:mod:`forensics.spark.analysis`), and the result written as a Parquet case
(:func:`forensics.store.open_parquet_case` opens it as the DuckDB path's case is opened).

The case is written into a folder beside ``out`` and renamed onto it once whole: a run killed
mid-way leaves no case (and the folder it worked in, removed by the next run), and a run again
writes the case again, whole. An earlier Parquet case at ``out`` is replaced; anything else there
is refused untouched.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from forensics.adapters import Options
from forensics.errors import CaseError, SparkFailed
from forensics.exposure.figures import FIGURES
from forensics.ingestion.pipeline import Counts, FileResult, IngestResult, unopened
from forensics.ingestion.readers import Limits, LogFile, PassedOver, discover
from forensics.ingestion.settle import RECORD_TABLES
from forensics.spark.analysis import COLUMNS, analyse, spark_session
from forensics.spark.findings import run_findings
from forensics.spark.ingest import (
    ingest_wire,
    number_files,
    numbered_rows,
    read_files,
    settle_nodes,
    settle_received,
)
from forensics.store import connect, is_parquet_case, write_parquet_manifest
from forensics.text import path_text, shown
from forensics.version import __version__

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: How each table's rows are ordered in its files (so a run again writes the same rows in order).
ORDER = {
    **{t: ("file_id", "line_no", "part") for t in RECORD_TABLES.values()},
    "quarantine": ("file_id", "line_no", "reason"),
    "duplicates": ("file_id", "line_no"),
    "received_conflicts": ("file_id", "line_no", "part", "duplicate"),
    "source_lines": ("file_id", "first_line"),
    "requests": ("request_id",),
    "exposures": ("node", "boot", "reader_request", "victim_request"),
    "uninitialized_reads": ("node", "boot", "seq", "lo", "request_id"),
    "page_reads": ("node", "boot", "start_seq", "lo", "request_id"),
}


@dataclass(frozen=True)
class SparkInvestigation:
    """What the Spark run found: how the records ended, the figures, and where the case is."""

    ingest: IngestResult
    exposure: dict[str, int]
    case: Path
    phases: dict[str, float]  # seconds each phase took: read, settle, write_records, analyse, write_analysis, findings

    def as_dict(self) -> dict[str, object]:
        """As JSON-ready data (``investigate --engine spark --json``)."""
        data = self.ingest.as_dict()
        return {"case": str(self.case), "engine": "spark", "records": data["records"], "exposure": self.exposure,
                "files": data["files"], "skipped": data["skipped"], "refused": data["refused"],
                "case_records": data["case"]}


def investigate(
    paths: Sequence[Path | str],
    out: Path,
    *,
    master: str = "local[2]",
    partitions: int = 8,
    format: str | None = None,
    options: Options | None = None,
    limits: Limits | None = None,
    progress: bool = False,
    spark: SparkSession | None = None,
) -> SparkInvestigation:
    """Ingest and analyse ``paths`` on Spark (``master``; ``partitions`` for its shuffles) into the
    Parquet case ``out``. ``spark``: a session to use instead of one made here."""
    from forensics import adapters

    if format is not None:
        adapters.get(format)
    _check_out(out)
    logs, skipped = discover([Path(p) for p in paths], format, limits=limits)
    work = out.parent / f".{out.name}.partial"
    if work.exists():
        shutil.rmtree(work)  # a run killed mid-way
    work.mkdir(parents=True)
    try:
        session = spark or spark_session(master, partitions=partitions, progress=progress)
        try:
            found = _run(session, logs, skipped, options or Options(), work, master, partitions)
        except Exception as exc:
            if type(exc).__module__.startswith(("pyspark", "py4j")):
                raise SparkFailed(spark_failure(exc)) from exc
            raise
        shutil.rmtree(work / "_stage")
        earlier = out.parent / f".{out.name}.earlier"  # (an earlier case stays whole until this one is in)
        if earlier.exists():
            shutil.rmtree(earlier)
        if out.exists():
            os.replace(out, earlier)
        os.replace(work, out)
        shutil.rmtree(earlier, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    con = connect(out, read_only=True, create=False)
    try:
        ingest = _ingest_result(con, out, logs, skipped, found)
    finally:
        con.close()
    return SparkInvestigation(ingest, found.figures, out, found.phases)


def _check_out(out: Path) -> None:
    if out.exists() and not is_parquet_case(out):
        raise CaseError(f"{shown(out)}: exists and is not a Parquet case; name a new folder for --out-dir")


@dataclass(frozen=True)
class _Found:
    figures: dict[str, int]
    ids: dict[int, int]
    sha256: dict[int, str]
    phases: dict[str, float]


def _run(spark: SparkSession, logs: list[LogFile], skipped: list[PassedOver], options: Options, work: Path,
         master: str, partitions: int) -> _Found:
    from pyspark.sql import functions as F

    clock = _Clock()
    stage = work / "_stage"
    wire = read_files(spark, logs, options, stage / "files")
    clock.lap("read")
    small = wire.filter(F.col("tbl").isin("files", "file_notes", "refused_files")).toArrow()
    numbered = number_files(*(small.filter(pa.compute.equal(small["tbl"], t))
                              for t in ("files", "file_notes", "refused_files")))
    numbered = replace(numbered, refused_files=_with_unopened(numbered.refused_files, skipped))
    for name in ("files", "file_notes", "refused_files"):
        _write_arrow(work / name, getattr(numbered, name))
    read_rows = numbered_rows(spark, wire, numbered)
    settled = settle_nodes(spark, read_rows, numbered, stage / "nodes")
    settled = settle_received(spark, settled, read_rows, numbered, stage / "received")
    clock.lap("settle")
    for table in RECORD_TABLES.values():
        _write_wire(settled, table, work)
    _write_wire(settled, "duplicates", work)
    _write_wire(settled, "received_conflicts", work)
    _write_wire(settled.unionByName(read_rows), "quarantine", work)
    _write_wire(read_rows, "source_lines", work)
    clock.lap("write_records")
    parts = [_kind_rows(spark, work, kind, t) for kind, t in RECORD_TABLES.items()]
    records = parts[0]
    for p in parts[1:]:
        records = records.unionByName(p)
    result = analyse(records)
    clock.lap("analyse")
    _write_frame(result.requests, work, "requests")
    _write_frame(result.exposures, work, "exposures")
    _write_frame(result.uninitialized_reads, work, "uninitialized_reads")
    _write_frame(result.page_reads, work, "page_reads")
    _write_arrow(work / "exposure_summary",
                 pa.table({name: pa.array([result.figures[name]], pa.int64()) for name in FIGURES}))
    clock.lap("write_analysis")
    analysed = sum(pq.ParquetFile(f).metadata.num_rows for t in RECORD_TABLES.values()
                   for f in sorted((work / t).glob("*.parquet")))
    meta = {"analysed_records": str(analysed)}
    extra = {"written_by": "spark", "toolkit_version": __version__, "master": master, "partitions": partitions,
             "figures": result.figures}
    write_parquet_manifest(work, meta=meta, extra=extra)  # (the findings' driver part opens the case)
    run_findings(spark, work, partitions)
    write_parquet_manifest(work, meta=meta, extra=extra)
    clock.lap("findings")
    return _Found(result.figures, numbered.ids, numbered.sha256, clock.laps)


class _Clock:
    """Seconds each phase of a run took."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self.at = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self.at, 3)
        self.at = now


def _kind_rows(spark: SparkSession, work: Path, kind: str, table: str) -> DataFrame:
    """A kind's records as the analysis reads them (:data:`COLUMNS`)."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(str(work / table))
    return frame.select(*[F.lit(kind).alias("kind") if c == "kind" else
                          (F.col(c) if c in frame.columns else F.lit(None).alias(c)) for c in COLUMNS])


def _write_wire(wire: DataFrame, table: str, work: Path) -> None:
    """The wire rows of ``table`` as its own columns, into its folder."""
    from pyspark.sql import functions as F

    names = ingest_wire().names
    cols = [F.col(names[table, f.name]).alias(f.name) for f in ingest_wire().tables[table]]
    _write_frame(wire.filter(F.col("tbl") == table).select(*cols), work, table)


def _write_frame(frame: DataFrame, work: Path, table: str) -> None:
    """A table's rows, ordered (:data:`ORDER`), into ``work/table`` as ``part-NNNNN.parquet`` files."""
    folder = work / table
    frame.orderBy(*ORDER.get(table, ())).write.mode("overwrite").parquet(str(folder))
    parts = sorted(p for p in folder.iterdir() if p.name.startswith("part-") and p.suffix == ".parquet")
    for p in folder.iterdir():
        if p not in parts:
            p.unlink()  # _SUCCESS, checksums
    for i, p in enumerate(parts):
        p.rename(folder / f"part-{i:05d}.parquet")


def _write_arrow(folder: Path, table: pa.Table) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")


def _with_unopened(refused: pa.Table, skipped: list[PassedOver]) -> pa.Table:
    """``refused_files`` with the files and folders the system would not open (found by
    :func:`~forensics.ingestion.readers.discover`), refused as the DuckDB path refuses them."""
    results = [unopened(p) for p in skipped if p.refused]
    if not results:
        return refused
    now = dt.datetime.now(dt.UTC)
    rows = pa.table({"path": [r.path for r in results], "size": [r.size for r in results],
                     "sha256": [None] * len(results), "why": [r.why for r in results],
                     "refused_at": [now] * len(results), "toolkit_version": [__version__] * len(results)})
    return pa.concat_tables([refused, rows.cast(refused.schema)]).sort_by("path")


def _ingest_result(con: duckdb.DuckDBPyConnection, out: Path, logs: list[LogFile], skipped: list[PassedOver],
                   found: _Found) -> IngestResult:
    """Each file's outcome and counts, as the DuckDB path reports them, from the written case."""
    counts = {int(r[0]): Counts(*(int(v) for v in r[1:])) for r in con.execute(
        "SELECT file_id, read, ingested, duplicates, quarantined FROM file_counts").fetchall()}
    meta = {int(r[0]): r[1:] for r in con.execute(
        "SELECT file_id, sha256, size, lines_ignored FROM files").fetchall()}
    notes: dict[int, list[str]] = {}
    for file_id, text in con.execute("SELECT file_id, text FROM file_notes ORDER BY file_id, key").fetchall():
        notes.setdefault(int(file_id), []).append(text)
    refused = {r[0]: r[1:] for r in con.execute("SELECT path, sha256, size, why FROM refused_files").fetchall()}
    results = []
    for place, log in enumerate(logs):
        base: dict[str, Any] = dict(path=path_text(log.path), format=log.format, compression=log.compression,
                                    adapter=log.adapter)
        if place in found.ids:
            i = found.ids[place]
            sha, size, ignored = meta[i]
            results.append(FileResult(sha256=sha, size=int(size), status="ingested", counts=counts[i],
                                      ignored=int(ignored), notes=tuple(notes.get(i, ())), **base))
        elif base["path"] in refused:
            sha, size, why = refused[base["path"]]
            results.append(FileResult(sha256=sha or "", size=int(size), status="refused", counts=Counts(),
                                      why=why, **base))
        else:  # the same bytes as a file before it
            sha = found.sha256[place]
            same = next(i for i, m in meta.items() if m[0] == sha)
            results.append(FileResult(sha256=sha, size=int(meta[same][1]), status="already_in_case",
                                      counts=counts[same], ignored=int(meta[same][2]), **base))
    results += [unopened(p) for p in skipped if p.refused]  # (as the DuckDB path lists them: after the files read)
    total = sum((counts[i] for i in found.ids.values()), Counts())
    return IngestResult(db=str(out), files=tuple(results), skipped=tuple(p for p in skipped if not p.refused),
                        records=total, case=total)


#: The line of a Python traceback that says what was raised.
_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.+)$", re.M)


def spark_failure(exc: BaseException) -> str:
    """What a Spark failure says, in one line: what a task raised where it says (the last
    ``Error: ...`` line of the worker's traceback), else the first line of Spark's report."""
    text = str(exc)
    raised = _RAISED.findall(text)
    if raised:
        kind, what = raised[-1]
        return f"Spark failed: {kind.rsplit('.', 1)[-1]}: {what.strip()}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"Spark failed: {first}"
