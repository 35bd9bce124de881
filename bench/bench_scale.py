"""The DuckDB path's memory as the case grows: ingest and analysis of generated cases of several
sizes, each in a child process whose resident memory a thread samples every 50 ms; and, with
``--whole-job``, ``kvforensics investigate --out`` (ingest, analysis, replays, report) on the
smallest, its process tree sampled the same way.

Run: python bench/bench_scale.py [--millions 5 20 50] [--keep DIR] [--whole-job]

Each size is ``bench/generate.py``'s incident (4 decode nodes, seed 5) of about that many
million records, made once into ``--keep`` (else a temporary folder; 50 million records take
about 35 minutes to generate and 8 GB of disk). Prints, per size: records, ingest and analysis
time, and the peak resident memory of each; the baseline is the smallest size in the same run
(the ratios say how memory grows against records).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from generate import generate
from peaks import tree_peak

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
import forensics
from forensics.exposure.analysis import analyse
from forensics.store import connect
from peaks import Peaks

sampled = Peaks('ingest')
t = time.perf_counter()
result = forensics.ingest([sys.argv[1]], sys.argv[2], fast=True)
ingest_s = time.perf_counter() - t
sampled.part = 'analysis'
con = connect(sys.argv[2])
t = time.perf_counter()
figures = analyse(con, fast=True)
analysis_s = time.perf_counter() - t
con.close()
time.sleep(0.1)
print(json.dumps({'records': result.records.ingested, 'ingest_s': ingest_s, 'analysis_s': analysis_s,
                  'peak': sampled.peak, 'figures': figures}))
"""


def _logs(root: Path, millions: int) -> Path:
    """The generated log set of about ``millions`` million records (8 records a request)."""
    logs = root / f"logs-{millions}m"
    if not (logs / "router.jsonl").exists():
        generate(logs, requests=millions * 1_000_000 // 8, seed=5, decode_nodes=4)
    return logs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--millions", type=int, nargs="+", default=[5, 20, 50])
    parser.add_argument("--keep", type=Path, help="generate the log sets here and keep them (else a temporary folder)")
    parser.add_argument("--whole-job", action="store_true", help="also investigate --out the smallest size")
    parser.add_argument("--only-whole-job", action="store_true", help="only that")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        for m in [] if args.only_whole_job else sorted(args.millions):
            logs = _logs(root, m)
            db = Path(tmp) / f"case-{m}m.duckdb"
            done = subprocess.run([sys.executable, "-c", _CHILD, str(logs), str(db), str(Path(__file__).parent)],
                                  check=True, capture_output=True, text=True)
            got = json.loads(done.stdout.strip().splitlines()[-1])
            db.unlink()
            rows.append((m, got))
            peak = {k: v / 2**30 for k, v in got["peak"].items()}
            print(f"{got['records']:>11,} records: ingest {got['ingest_s']:6.1f} s, peak {peak['ingest']:.2f} GiB; "
                  f"analysis {got['analysis_s']:5.1f} s, peak {peak['analysis']:.2f} GiB; "
                  f"{got['figures']['exposed_responses']:,} exposed", flush=True)
        for m, got in rows[1:]:
            base_m, base = rows[0]
            print(f"{m} / {base_m} million (x{got['records'] / base['records']:.2f} records): ingest peak "
                  f"x{got['peak']['ingest'] / base['peak']['ingest']:.2f}, analysis peak "
                  f"x{got['peak']['analysis'] / base['peak']['analysis']:.2f}")
        if args.whole_job or args.only_whole_job:
            m = min(args.millions)
            out, db = Path(tmp) / "report", Path(tmp) / "whole.duckdb"
            t = time.perf_counter()
            process = subprocess.Popen(
                [sys.executable, "-c", "from kvforensics.cli import main; main()", "investigate",
                 str(_logs(root, m)), "--db", str(db), "--out", str(out), "--generated-at", "2026-12-01T00:00:00Z"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            lines: list[bytes] = []
            reader = threading.Thread(target=lambda: lines.extend(process.stdout or []), daemon=True)
            reader.start()
            peak_tree = tree_peak(process)
            reader.join()
            wall = time.perf_counter() - t
            print(f"investigate --out, {m} million records: exit {process.returncode}, {wall:.0f} s, "
                  f"peak {peak_tree / 2**30:.2f} GiB (the process and its children)")
            for line in lines[-12:]:
                print("   ", line.decode(errors="replace").rstrip())


if __name__ == "__main__":
    main()
