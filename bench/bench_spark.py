"""The analysis on Spark (local mode) against the DuckDB path, on one generated case.

Run: python bench/bench_spark.py [--requests 625000] [--boots 1] [--logs DIR] [--masters local[1] local[2]]
     [--partitions 2 8] [--whole | --tasks]

The case is ``bench/generate.py``'s incident (4 decode nodes, seed 5; 625,000 requests are about
5 million records), ingested once. Each analysis runs in a child process whose process tree (for
Spark: the driver, its JVM and its Python workers) is sampled every 50 ms: the DuckDB path's
``analyse`` (the baseline), then ``forensics.spark.analyse`` under each master and shuffle
partition count, timed apart for the session's start, the records' export to Parquet and the
analysis. Prints each one's time and peak, the ratio to the baseline, and whether the figures
are the same (they must be). ``--whole``: the whole investigation from the logs instead, ingest
and analysis (``forensics.investigate`` against ``forensics.spark.investigate``), with the counts
of records read, ingested, duplicate and quarantined compared too, and the Spark run's peak split
by the phases it reports (read, settle, ...). ``--tasks``: the analysis's
unit of work alone, the largest node's records as one task (the unit before it was a boot) against
each of its boots' as a task of its own (``analyse_boot`` in-process, each in a child: time and
peak above the child's resident memory before it). ``--boots``: each decode node restarts, so
that it has that many boots (``generate.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from generate import generate
from peaks import peak_of, peaks_by_phase, tree_samples

import forensics

_DUCKDB = r"""
import json, sys, time
from forensics.exposure.analysis import analyse
from forensics.store import connect
con = connect(sys.argv[1])
t = time.perf_counter()
figures = analyse(con, fast=True)
print(json.dumps({'analysis_s': time.perf_counter() - t, 'figures': figures}))
"""

_SPARK = r"""
import json, sys, time
from forensics.spark import analyse, records_of_case, spark_session
t = time.perf_counter()
spark = spark_session(sys.argv[2], partitions=int(sys.argv[3]))
spark.range(1).count()
start_s = time.perf_counter() - t
t = time.perf_counter()
records = records_of_case(spark, sys.argv[1], sys.argv[4])
export_s = time.perf_counter() - t
t = time.perf_counter()
figures = analyse(records).figures
print(json.dumps({'start_s': start_s, 'export_s': export_s, 'analysis_s': time.perf_counter() - t,
                  'figures': figures}))
spark.stop()
"""


_DUCKDB_WHOLE = r"""
import json, sys, time
import forensics
t = time.perf_counter()
found = forensics.investigate([sys.argv[1]], sys.argv[2], fast=True)
print(json.dumps({'whole_s': time.perf_counter() - t, 'figures': found.exposure,
                  'records': found.ingest.records.as_dict()}))
"""

_SPARK_WHOLE = r"""
import json, sys, time
from pathlib import Path
from forensics.spark import investigate, spark_session
t = time.perf_counter()
spark = spark_session(sys.argv[3], partitions=int(sys.argv[4]))
spark.range(1).count()
start_s = time.perf_counter() - t
t, wall = time.perf_counter(), time.time()
found = investigate([sys.argv[1]], Path(sys.argv[2]), spark=spark)
print(json.dumps({'start_s': start_s, 'whole_s': time.perf_counter() - t, 'wall': wall, 'figures': found.exposure,
                  'records': found.ingest.records.as_dict(), 'phases': found.phases}))
spark.stop()
"""


_TASK = r"""
import json, sys, time
import pyarrow.parquet as pq
from peaks import Peaks, rss
from forensics.spark.analysis import COLUMNS, analyse_boot
records = pq.read_table(sys.argv[1], columns=list(COLUMNS))
analyse_boot(records.slice(0, 1000))  # (the machine code loads: not the task's cost)
base = rss()
peaks = Peaks("task")
t = time.perf_counter()
rows = analyse_boot(records)
took = time.perf_counter() - t
print(json.dumps({'task_s': took, 'records': records.num_rows, 'rows': rows.num_rows, 'base': base,
                  'peak': max(peaks.peak.get('task', 0), rss())}))
"""


def tasks(db: Path, root: Path) -> None:
    """The largest node's records as one task against each of its boots' as a task of its own."""
    from forensics.spark import records_of_case, spark_session
    from forensics.spark.analysis import sweep_records

    spark = spark_session("local[2]", partitions=8)
    try:  # the records each task gets: forensics.spark.analysis.sweep_records, by node and boot
        records = sweep_records(records_of_case(spark, db, root / "export"))
        records.selectExpr("*", "node AS task_node", "boot AS task_boot").write.partitionBy("task_node", "task_boot") \
            .parquet(str(root / "tasks"))
    finally:
        spark.stop()
    nodes = sorted((sum(f.stat().st_size for f in n.rglob("*.parquet")), n)
                   for n in (root / "tasks").glob("task_node=*"))
    node = nodes[-1][1]
    print(f"{node.name}: {len(list(node.glob('task_boot=*')))} boot(s)", flush=True)
    for label, folder in [(f"{node.name}, one task", node),
                          *((f"  {b.name}", b) for b in sorted(node.glob("task_boot=*")))]:
        got, _ = _run([_TASK, str(folder)], bench_path=True)
        print(f"{label}: {got['records']:,} records, {got['task_s']:.2f} s, peak "
              f"{got['peak'] / 2**20:,.0f} MB ({(got['peak'] - got['base']) / 2**20:,.0f} MB above the "
              f"{got['base'] / 2**20:,.0f} MB before the task), {got['rows']:,} rows", flush=True)


def whole(logs: Path, root: Path, masters: list[str], partitions: list[int]) -> None:
    """The whole investigation (ingest and analysis) from the logs, on DuckDB and on Spark."""
    # twice: a first run on a fresh checkout also compiles the fast path and the sweep (about 30 s)
    first, _ = _run([_DUCKDB_WHOLE, str(logs), str(root / "whole-first.duckdb")])
    base, base_peak = _run([_DUCKDB_WHOLE, str(logs), str(root / "whole.duckdb")])
    print(f"{base['records']['read']:,} records read; DuckDB ingest and analysis: {base['whole_s']:.1f} s "
          f"(the run before it: {first['whole_s']:.1f} s), peak {base_peak / 2**30:.2f} GiB", flush=True)
    for master in masters:
        for n in partitions:
            out = root / f"case-{master.replace('[', '-').rstrip(']')}-{n}"
            got, samples = _sampled([_SPARK_WHOLE, str(logs), str(out), master, str(n)])
            peak = peak_of(samples)
            same = ("same figures and counts" if (got["figures"], got["records"]) == (base["figures"], base["records"])
                    else "FIGURES OR COUNTS DIFFER")
            print(f"Spark {master}, {n} partitions: start {got['start_s']:.1f} s, ingest and analysis "
                  f"{got['whole_s']:.1f} s (x{got['whole_s'] / base['whole_s']:.2f} DuckDB's), "
                  f"peak {peak / 2**30:.2f} GiB; {same}", flush=True)
            print("  phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in got["phases"].items()), flush=True)
            by_phase = peaks_by_phase(samples, got["wall"], got["phases"])
            print("  peak by phase (GiB, the process tree): " + ", ".join(
                f"{k} {v / 2**30:.2f}" for k, v in by_phase.items()), flush=True)


def _run(args: list[str], *, bench_path: bool = False) -> tuple[dict[str, Any], int]:
    """Run a child (``bench_path``: it imports from this folder), sampling its process tree's
    memory; its JSON answer and the peak."""
    got, samples = _sampled(args, bench_path=bench_path)
    return got, peak_of(samples)


def _sampled(args: list[str], *, bench_path: bool = False) -> tuple[dict[str, Any], list[tuple[float, int]]]:
    """Run a child as :func:`_run` does: its JSON answer and its process tree's memory over time."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent),
                                                                     os.environ.get("PYTHONPATH")]))}
    process = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               env=env if bench_path else None)
    samples = tree_samples(process)
    out = (process.stdout.read() if process.stdout else b"").decode()
    if process.returncode != 0:
        raise SystemExit(f"child failed ({process.returncode})")
    return json.loads(out.strip().splitlines()[-1]), samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=625_000)
    parser.add_argument("--logs", type=Path, help="an existing log set of bench/generate.py (else one is made)")
    parser.add_argument("--masters", nargs="*", default=["local[1]", "local[2]"],
                        help="Spark masters to run (none: the DuckDB path alone)")
    parser.add_argument("--partitions", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--boots", type=int, default=1, help="boots of each decode node, if the logs are made here")
    work = parser.add_mutually_exclusive_group()
    work.add_argument("--whole", action="store_true",
                      help="the whole investigation from the logs (ingest and analysis), not the analysis alone")
    work.add_argument("--tasks", action="store_true",
                      help="the largest node's records as one task against each of its boots' as one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs = args.logs
        if logs is None:
            logs = root / "logs"
            generate(logs, requests=args.requests, seed=5, decode_nodes=4, boots=args.boots)
        if args.whole:
            whole(logs, root, args.masters, args.partitions)
            return
        db = root / "case.duckdb"
        records = forensics.ingest([logs], db, fast=True).records.ingested
        if args.tasks:
            tasks(db, root)
            return
        base, base_peak = _run([_DUCKDB, str(db)])
        print(f"{records:,} records; DuckDB analysis: {base['analysis_s']:.1f} s, peak {base_peak / 2**30:.2f} GiB")
        for master in args.masters:
            for partitions in args.partitions:
                parquet = root / f"parquet-{master.replace('[', '-').rstrip(']')}-{partitions}"
                got, peak = _run([_SPARK, str(db), master, str(partitions), str(parquet)])
                same = "same figures" if got["figures"] == base["figures"] else "FIGURES DIFFER"
                print(f"Spark {master}, {partitions} partitions: start {got['start_s']:.1f} s, export "
                      f"{got['export_s']:.1f} s, analysis {got['analysis_s']:.1f} s "
                      f"(x{got['analysis_s'] / base['analysis_s']:.2f} DuckDB's), peak {peak / 2**30:.2f} GiB; {same}",
                      flush=True)


if __name__ == "__main__":
    main()
