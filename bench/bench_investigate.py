"""End-to-end investigate: analysis against ingest, against a plain DuckDB load, and
against the brute-force oracle on a subset; peak memory; page-size scaling.

Run: python bench/bench_investigate.py [--requests N] [--oracle-requests N]
(defaults: about 5 million records; the oracle on 640,000 of the same kind, about 40 s)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from generate import generate

import forensics
from forensics.exposure import reference
from forensics.exposure.analysis import analyse
from forensics.store import connect

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from logsets import scale_pages  # noqa: E402


def _timed_investigate(logs: Path, db: Path) -> tuple[float, float, dict[str, int]]:
    t = time.perf_counter()
    forensics.ingest([logs], db, fast=True)
    ingest_s = time.perf_counter() - t
    con = connect(db)
    t = time.perf_counter()
    figures = analyse(con, fast=True)
    analyse_s = time.perf_counter() - t
    con.close()
    return ingest_s, analyse_s, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=640_000)
    parser.add_argument("--oracle-requests", type=int, default=80_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        logs = root / "logs"
        n = generate(logs, requests=args.requests, seed=3, decode_nodes=4)
        t = time.perf_counter()
        con = duckdb.connect(str(root / "plain.duckdb"))
        con.execute(
            f"CREATE TABLE t AS SELECT * FROM read_json('{logs}/*.jsonl', union_by_name=true)"
        )
        con.close()
        plain = time.perf_counter() - t
        ingest_s, analyse_s, figures = _timed_investigate(logs, root / "case.duckdb")
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"records: {n:,}")
        print(
            f"plain DuckDB load {plain:.2f} s; ingest {ingest_s:.2f} s; analysis {analyse_s:.2f} s"
        )
        print(f"investigate / plain load: {(ingest_s + analyse_s) / plain:.2f}x")
        print(f"analysis / ingest: {analyse_s / ingest_s:.2f} (target <= 1)")
        print(f"peak RSS: {peak:.2f} GiB (target < 4)")
        print(f"figures: {json.dumps(figures)}")

        small = root / "small"
        generate(small, requests=args.oracle_requests, seed=4, decode_nodes=2)
        records = [json.loads(line) for f in sorted(small.iterdir()) for line in f.open()]
        t = time.perf_counter()
        expected = reference.run(records).figures
        oracle_s = time.perf_counter() - t
        forensics.ingest([small], root / "small.duckdb", fast=True)
        runs = []
        for _ in range(3):  # the median of three: one run is at the mercy of the machine's noise
            con = connect(root / "small.duckdb")
            t = time.perf_counter()
            got = analyse(con, fast=True)
            runs.append(time.perf_counter() - t)
            con.close()
        a_s = statistics.median(runs)
        assert got == expected, (got, expected)
        print(
            f"oracle on {len(records):,} records: {oracle_s:.2f} s; "
            f"analysis {a_s:.3f} s (median of {', '.join(f'{r:.3f}' for r in runs)}): "
            f"oracle is {oracle_s / a_s:.0f}x slower (target >= 50x)"
        )
        print(f"compiling the sweep from nothing: {_cold_compile():.1f} s (once per install)")

        coarse = root / "coarse"
        generate(coarse, requests=20_000, seed=5, decode_nodes=2, pool_pages=2_049)
        fine = root / "fine"
        _scale_pages(coarse, fine, 64)
        _, a1, f1 = _timed_investigate(coarse, root / "coarse.duckdb")
        _, a64, f64 = _timed_investigate(fine, root / "fine.duckdb")
        assert f1["exposed_responses"] == f64["exposed_responses"]
        print(
            f"page ids x64: analysis {a1:.2f} s -> {a64:.2f} s, ratio {a64 / a1:.2f} (target <= 2)"
        )


def _cold_compile() -> float:
    """Seconds the first analysis in a fresh process takes beyond a warm one, with an empty
    numba cache: the compile a new install pays once."""
    script = (
        "import sys, time, forensics\n"
        "from forensics.exposure.analysis import analyse\n"
        "from forensics.store import connect\n"
        "forensics.ingest([sys.argv[1]], sys.argv[2], fast=True)\n"
        "times = []\n"
        "for _ in range(2):\n"
        "    con = connect(sys.argv[2]); t = time.perf_counter(); analyse(con, fast=True)\n"
        "    times.append(time.perf_counter() - t); con.close()\n"
        "print(times[0] - times[1])\n"
    )
    with tempfile.TemporaryDirectory() as cache:
        sample = Path(cache) / "logs"
        generate(sample, requests=500, seed=6, decode_nodes=2)
        out = subprocess.run(
            [sys.executable, "-c", script, str(sample), str(Path(cache) / "case.duckdb")],
            env={**os.environ, "NUMBA_CACHE_DIR": str(Path(cache) / "numba")},
            check=True, capture_output=True, text=True,
        )
    return float(out.stdout.split()[-1])


def _scale_pages(src: Path, dst: Path, factor: int) -> None:
    dst.mkdir()
    for f in src.iterdir():
        records = scale_pages((json.loads(line) for line in f.open()), factor)
        (dst / f.name).write_text("".join(json.dumps(r) + "\n" for r in records))


if __name__ == "__main__":
    main()
