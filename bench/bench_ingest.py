"""Ingest speed: `forensics.ingest` against a plain DuckDB load of the same files.

Run: python bench/bench_ingest.py [--requests N]   (default gives about 2.1 million records)
Prints the ratio ingest / plain load (target: at most 2x).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
from generate import generate

import forensics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=260_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) / "logs"
        n = generate(logs, requests=args.requests, seed=1, decode_nodes=4)
        size = sum(p.stat().st_size for p in logs.iterdir())
        t = time.perf_counter()
        con = duckdb.connect(str(Path(tmp) / "plain.duckdb"))
        con.execute(
            f"CREATE TABLE t AS SELECT * FROM read_json('{logs}/*.jsonl', union_by_name=true)"
        )
        con.close()
        plain = time.perf_counter() - t
        t = time.perf_counter()
        result = forensics.ingest([logs], Path(tmp) / "case.duckdb")
        ours = time.perf_counter() - t
        assert result.records.read == n
        print(f"records: {n:,} ({size / 2**20:.0f} MiB)")
        print(f"plain DuckDB load: {plain:.2f} s")
        print(f"kvforensics ingest: {ours:.2f} s")
        print(f"ratio: {ours / plain:.2f}x (target <= 2x)")


if __name__ == "__main__":
    main()
