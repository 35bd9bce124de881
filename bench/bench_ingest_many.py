"""Many small files against a few large ones: the same records, ingested side by side.

Run: python bench/bench_ingest_many.py [--records 1000000] [--per-file 50] [--only many|few]
(default: about a million canonical records, as 4 files and as about 20,000 files of 50)
A fleet's archive is many small files (hourly-rotated logs per server); issue #44 asks that
they go in within 3x the time of the same records in a few large files. The records are
generated once (4 node logs, bench/generate.py), then cut into files of ``--per-file`` lines,
each node's lines in order (as rotation cuts them). Both sets are ingested into fresh cases in
one process, after a warm-up ingest that loads the compiled fast path; the two cases must hold
the same records, duplicates and quarantined lines. Prints the times and the ratio, and the
machine's load average before and after (the two sides slow differently under others' load).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import duckdb
from generate import generate

import forensics

#: The records generate() writes per request, about (a received, 5 on the decode node, 2 at the end).
RECORDS_PER_REQUEST = 8


def cut(logs: Path, out: Path, per_file: int) -> int:
    """Each file of ``logs`` cut into files of ``per_file`` lines in ``out``: the number of files."""
    out.mkdir(parents=True)
    files = 0
    for log in sorted(logs.glob("*.jsonl")):
        with log.open("rb") as fh:
            lines = fh.readlines()
        for at in range(0, len(lines), per_file):
            (out / f"{log.stem}-{at // per_file:06d}.jsonl").write_bytes(b"".join(lines[at : at + per_file]))
            files += 1
    return files


def ingest(logs: Path, db: Path) -> tuple[float, forensics.IngestResult]:
    t = time.perf_counter()
    result = forensics.ingest([logs], db, fast=True)
    return time.perf_counter() - t, result


def contents(db: Path) -> tuple[object, ...]:
    """What two cases of the same records must share, whatever the files: every record, duplicate
    and quarantined line, by its hash and key (not by file and line)."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return tuple(
            con.execute(sql).fetchall()
            for sql in (
                "SELECT kind, count(*), sum((rec_hash % 1000003)::BIGINT), count(DISTINCT (node, boot, seq)) "
                "FROM records GROUP BY ALL ORDER BY ALL",
                "SELECT count(*), sum((rec_hash % 1000003)::BIGINT) FROM duplicates",
                "SELECT reason, count(*) FROM quarantine GROUP BY ALL ORDER BY ALL",
            )
        )
    finally:
        con.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000, help="about how many records in all")
    parser.add_argument("--per-file", type=int, default=50, help="lines in each small file")
    parser.add_argument("--only", choices=("many", "few"), help="time only one of the two sets")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        few = tmp / "few"
        n = generate(few, requests=args.records // RECORDS_PER_REQUEST, seed=1, decode_nodes=3)
        files = cut(few, tmp / "many", args.per_file)
        size = sum(p.stat().st_size for p in few.iterdir())
        os.sync()  # (the logs just written would otherwise go to disk during the first ingest)
        first = tmp / "first.jsonl"
        first.write_bytes(b"".join((few / "router.jsonl").open("rb").readlines()[:1_000]))
        ingest(first, tmp / "first.duckdb")  # loads the compiled fast path, once a process
        print(f"records: {n:,} ({size / 2**20:.0f} MiB): {len(list(few.iterdir()))} files, "
              f"and {files:,} files of {args.per_file}", flush=True)
        print(f"load average before: {load()}", flush=True)
        times = {}
        for name, logs in (("few", few), ("many", tmp / "many")):
            if args.only not in (None, name):
                continue
            seconds, result = ingest(logs, tmp / f"{name}.duckdb")
            assert result.records.read == n, (result.records, n)
            times[name] = seconds
            print(f"{name}: {len(result.files):,} files in {seconds:.2f} s "
                  f"({seconds / len(result.files) * 1000:.2f} ms a file)", flush=True)
        if len(times) == 2:
            assert contents(tmp / "few.duckdb") == contents(tmp / "many.duckdb"), "the two cases differ"
            print("the two cases hold the same records, duplicates and quarantined lines")
            print(f"ratio many / few: {times['many'] / times['few']:.2f}x (target <= 3x)")
        print(f"load average after: {load()}")


def load() -> str:
    """The machine's load average over 1, 5 and 15 minutes."""
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    main()
