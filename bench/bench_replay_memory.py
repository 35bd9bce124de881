"""The replay's memory and rate as the case grows: simulated cases of several sizes, page records
stripped, replayed as the whole job replays them (confirm mode).

Run: python bench/bench_replay_memory.py [--requests 25000 100000 400000] [--keep DIR]

For each size: ``simulate_to`` writes the full log set (seed 1, the default deployment: 4 prefill
and 4 decode nodes), the page records are stripped, the rest is ingested, and ``replay`` runs in
a child process of its own, whose resident memory a thread samples every 0.1 s. The replay has
two parts, timed and sampled apart: the replay proper (the plans, the engine over every node, the
replayed log set written) and the ingest and analysis of that replayed log set (``investigate``,
the same code as any case's). Prints, per size, requests per second and the peak resident memory
of each part; the baseline is the smallest size in the same run (the ratios show how each grows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import forensics
from replay.simulate import simulate_to

_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[3])
import forensics
import replay.replay as R
from peaks import Peaks

sampled = Peaks('replay', every=0.1)
peak = sampled.peak
inner = forensics.investigate
times = {}
def investigate(*args, **kwargs):
    times['replay'] = time.perf_counter() - t0
    sampled.part = 'investigate'
    t = time.perf_counter()
    try:
        return inner(*args, **kwargs)
    finally:
        times['investigate'] = time.perf_counter() - t
R.forensics = type('F', (), {'investigate': staticmethod(investigate)})
t0 = time.perf_counter()
result = R.replay(sys.argv[1], 'sglang-placeholder', sys.argv[2])
print(json.dumps({'times': times, 'peak': peak, 'records': result.records,
                  'exposed': result.exposure['exposed_responses'], 'disagreements': len(result.disagreements)}))
"""


def _case(root: Path, requests: int) -> Path:
    """A stripped, ingested case of ``requests`` simulated requests."""
    full, stripped = root / f"full-{requests}", root / f"stripped-{requests}"
    simulate_to(full, requests=requests, seed=1)
    stripped.mkdir()
    for f in sorted(full.glob("*.jsonl")):
        with f.open() as src, (stripped / f.name).open("w") as dst:
            dst.writelines(line for line in src if '"kind":"kv"' not in line)
        f.unlink()
    case = root / f"case-{requests}.duckdb"
    forensics.ingest([stripped], case)
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, nargs="+", default=[25_000, 100_000, 400_000])
    parser.add_argument("--keep", type=Path, help="work in this folder and keep the cases (else a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        rows = []
        for n in sorted(args.requests):
            case = root / f"case-{n}.duckdb"
            if not case.exists():
                case = _case(root, n)
            t = time.perf_counter()
            child = [sys.executable, "-c", _CHILD, str(case), str(root / f"replay-{n}"), str(Path(__file__).parent)]
            done = subprocess.run(child, check=True, capture_output=True, text=True)
            wall = time.perf_counter() - t
            got = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append((n, wall, got))
            print(f"{n:>9,} requests: {wall:7.1f} s ({n / wall:,.0f} requests/s), {got['records']:,} records replayed, "
                  f"{got['exposed']:,} exposed, {got['disagreements']} disagreements", flush=True)
            times, peak = got["times"], {k: v / 2**20 for k, v in got["peak"].items()}
            print(f"           replay proper {times['replay']:7.1f} s, peak {peak['replay']:,.0f} MiB; ingest and "
                  f"analysis of the replayed set {times['investigate']:6.1f} s, peak {peak['investigate']:,.0f} MiB",
                  flush=True)
        base_n, _, base = rows[0]
        for n, _, got in rows[1:]:
            print(f"{n:,} / {base_n:,} requests (x{n / base_n:g}): replay proper peak "
                  f"x{got['peak']['replay'] / base['peak']['replay']:.2f}, replayed-set analysis peak "
                  f"x{got['peak']['investigate'] / base['peak']['investigate']:.2f}")


if __name__ == "__main__":
    main()
