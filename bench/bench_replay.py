"""The reference engine on a whole public trace: simulate it, then replay the case without its
page records; requests and page operations per second, against a plain DuckDB load of the
same log set as the baseline.

Run: python bench/bench_replay.py [--trace ../shared/traces/mooncake_conversation_trace.jsonl]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import duckdb

import forensics
from replay.replay import replay
from replay.simulate import Deployment, shape, simulate
from replay.workload import read_trace

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--length-scale", type=float, default=6.0)
    args = parser.parse_args()
    arrivals = read_trace(args.trace)
    deployment = Deployment()
    shaped = shape(arrivals, random.Random(0), deployment, length_scale=args.length_scale)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        sim = simulate(root / "full", shaped, deployment=deployment, seed=0)
        sim_s = time.perf_counter() - t
        con = duckdb.connect()
        t = time.perf_counter()
        con.execute(f"CREATE TABLE t AS SELECT * FROM read_json('{root / 'full'}/*.jsonl', union_by_name=true)")
        plain_s = time.perf_counter() - t
        kv_records, pages = con.execute(
            "SELECT count(*), sum(list_sum([CAST(split_part(r, '-', -1) AS BIGINT) - "
            "CAST(split_part(r, '-', 1) AS BIGINT) + 1 FOR r IN string_split(pages, ',')])) "
            "FROM t WHERE kind = 'kv'"
        ).fetchone() or (0, 0)
        con.close()
        stripped = root / "stripped"
        stripped.mkdir()
        for f in (root / "full").iterdir():
            lines = f.read_text().splitlines(keepends=True)
            (stripped / f.name).write_text("".join(x for x in lines if '"kind":"kv"' not in x))
        found = forensics.investigate([stripped], root / "case.duckdb")
        t = time.perf_counter()
        result = replay(root / "case.duckdb", "sglang-placeholder", root / "replayed")
        replay_s = time.perf_counter() - t
        full = forensics.investigate([root / "full"], root / "full.duckdb").exposure
    print(f"trace: {args.trace.name}, {sim.requests:,} requests, lengths x{args.length_scale}")
    print(f"simulate: {sim_s:.2f} s, {sim.records:,} records, {kv_records:,} page records "
          f"covering {pages:,} page ids")
    print(f"  {sim.requests / sim_s:,.0f} requests/s, {kv_records / sim_s:,.0f} page records/s, "
          f"{pages / sim_s:,.0f} pages/s; {sim_s / plain_s:.2f}x a plain DuckDB load of its output ({plain_s:.2f} s)")
    print(f"replay of the case without page records (engine, log set, ingest, analysis): {replay_s:.2f} s, "
          f"{sim.requests / replay_s:,.0f} requests/s ({found.ingest.records.ingested:,} records in)")
    print(f"figures equal the full logs': {result.exposure == full} ({full['exposed_responses']} exposed responses)")


if __name__ == "__main__":
    main()
