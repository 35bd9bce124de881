"""Ingest speed: `forensics.ingest` against a plain DuckDB load of the same files.

Run: python bench/bench_ingest.py [--requests N [N ...]] [--repeat R] [--decoders]
(default: two sets, about 2.1 and 5.1 million records, 5 rounds each)
Each round loads the files both ways, one after the other; the medians are compared.
Prints the ratio ingest / plain load (target: at most 2x), and what the first ingest in a
process costs on top (loading the compiled fast path and its libraries, once).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
from generate import generate

import forensics


def plain_load(logs: Path, db: Path) -> float:
    t = time.perf_counter()
    con = duckdb.connect(str(db))
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_json('{logs}/*.jsonl', union_by_name=true)")
    con.close()
    return time.perf_counter() - t


def ingest(logs: Path | list[Path], db: Path) -> tuple[float, int]:
    t = time.perf_counter()
    result = forensics.ingest(logs if isinstance(logs, list) else [logs], db, fast=True)
    return time.perf_counter() - t, result.records.read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, nargs="+", default=[260_000, 640_000],
                        help="log sets to time, in requests (8 records each)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--decoders", action="store_true",
                        help="also time the fast path's split against msgspec + mmh3 on the same lines "
                        "(bench/decoders.py; pip install msgspec)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for requests in args.requests:
            measure(Path(tmp) / str(requests), requests, args.repeat, args.decoders)


def measure(tmp: Path, requests: int, repeat: int, decoders: bool = False) -> None:
    """Time ``repeat`` rounds of both loads of a generated set of ``requests`` requests."""
    logs = tmp / "logs"
    n = generate(logs, requests=requests, seed=1, decode_nodes=4)
    size = sum(p.stat().st_size for p in logs.iterdir())
    # the logs just written would otherwise be written back to disk during the first rounds,
    # taking CPU and disk from whichever load runs then (ingests ran 5.0-5.4 s here against
    # 4.6-4.8 s in a fresh process)
    os.sync()
    # the first ingest in a process loads the compiled code: timed apart, on the first 1,000 lines
    first = tmp / "first.jsonl"
    with sorted(logs.iterdir())[0].open() as fh:
        first.write_text("".join(line for _, line in zip(range(1_000), fh, strict=False)))
    cold, _ = ingest([first], tmp / "first.duckdb")
    warm, _ = ingest([first], tmp / "second.duckdb")
    plains, ours = [], []
    for _ in range(repeat):
        plains.append(plain_load(logs, tmp / "plain.duckdb"))
        seconds, read = ingest(logs, tmp / "case.duckdb")
        assert read == n
        ours.append(seconds)
        for db in ("plain.duckdb", "case.duckdb"):
            (tmp / db).unlink()
    plain, mine = statistics.median(plains), statistics.median(ours)
    print(f"records: {n:,} ({size / 2**20:.0f} MiB), {repeat} rounds")
    print(f"plain DuckDB load: median {plain:.2f} s ({', '.join(f'{s:.2f}' for s in plains)})")
    print(f"kvforensics ingest: median {mine:.2f} s ({', '.join(f'{s:.2f}' for s in ours)})")
    print(f"ratio: {mine / plain:.2f}x (target <= 2x)")
    print(f"first ingest in a process, 1,000 lines: {cold:.2f} s, the next {warm:.2f} s "
          f"(with the load once: {(mine + cold - warm) / plain:.2f}x)", flush=True)
    if decoders:
        from decoders import compare

        c = compare(sorted(logs.glob("*.jsonl")))
        print(f"decoding {c['lines']:,} lines: the fast path's split {c['fast_path_split']:.2f} s on one thread; "
              f"msgspec typed decode + canonical JSON + mmh3, a lower bound of a path built on them: "
              f"{c['msgspec_mmh3_lower_bound']:.2f} s ({c['msgspec_mmh3_lower_bound'] / c['fast_path_split']:.1f}x), "
              f"{c['msgspec_mmh3_lower_bound'] / plain:.2f}x the whole plain load", flush=True)
    shutil.rmtree(logs)


if __name__ == "__main__":
    main()
