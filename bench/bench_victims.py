"""Naming victims from request-level evidence against reading them from page logs, side by side.

One simulated incident (the incident's deployment, a synthetic workload with realistic outputs),
in one run: ``forensics.investigate`` of the full log set (page records: the victims read off
them), then the replay of the same case stripped of its page records (the victims named by the
reference engine, its decode step by step), over ``--jobs`` processes (default: one a core),
and, with ``--one-process``, in one process too, alternating, to measure what the workers give.
The ratio is issue #42's target (at most 1.5x); the replayed figures must equal the page logs'.

Run: python bench/bench_victims.py [--requests 25000] [--seed 1] [--jobs N] [--one-process]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import forensics
from replay.nodes import default_jobs
from replay.replay import replay
from replay.simulate import Deployment, shape, simulate
from replay.workload import synthetic


def strip(src: Path, dst: Path) -> Path:
    """A copy of a log set without its page records."""
    dst.mkdir()
    for f in sorted(src.iterdir()):
        with f.open() as inp, (dst / f.name).open("w") as out:
            out.writelines(line for line in inp if '"kind":"kv"' not in line)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=25_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None, help="processes the replay uses (default: one a core)")
    parser.add_argument("--one-process", action="store_true", help="also replay in one process, after, to compare")
    args = parser.parse_args()
    jobs = args.jobs or default_jobs()
    deployment = Deployment()
    rng = random.Random(args.seed)
    arrivals = shape(synthetic(args.requests, rng, rate=4.0), rng, deployment, over_long=0.02)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        sim = simulate(root / "full", arrivals, deployment=deployment, seed=args.seed)
        sim_s = time.perf_counter() - t
        forensics.investigate([root / "full"], root / "warm.duckdb")  # (a first run may compile the sweep)
        t = time.perf_counter()
        logged = forensics.investigate([root / "full"], root / "full.duckdb").exposure
        pages_s = time.perf_counter() - t
        forensics.investigate([strip(root / "full", root / "bare")], root / "bare.duckdb")
        t = time.perf_counter()
        result = replay(root / "bare.duckdb", "sglang-placeholder", root / "replayed", jobs=jobs)
        replay_s = time.perf_counter() - t
        if args.one_process:
            t = time.perf_counter()
            alone = replay(root / "bare.duckdb", "sglang-placeholder", root / "alone", jobs=1)
            alone_s = time.perf_counter() - t
            same = alone.exposure == result.exposure and all(
                a.read_bytes() == b.read_bytes() for a, b in zip(sorted((root / "alone" / "logs").iterdir()),
                                                                  sorted((root / "replayed" / "logs").iterdir()),
                                                                  strict=True))
    outputs = sum(a.output_tokens for a in arrivals) / len(arrivals)
    print(f"{sim.requests:,} requests (mean output {outputs:,.0f} tokens), {sim.records:,} records; "
          f"simulate {sim_s:.1f} s")
    print(f"investigate of the page logs: {pages_s:.1f} s")
    print(f"replay of the case without page records, {jobs} process(es): {replay_s:.1f} s "
          f"({sim.requests / replay_s:,.0f} requests/s)")
    print(f"replay / page-log investigate: {replay_s / pages_s:.2f}x (target at most 1.5x)")
    if args.one_process:
        print(f"the same replay in one process: {alone_s:.1f} s ({alone_s / pages_s:.2f}x); "
              f"the same files and figures: {same}")
    print(f"replayed figures equal the page logs': {result.exposure == logged} "
          f"({logged['exposed_responses']} exposed responses, {logged['victim_requests']} victims); "
          f"{len(result.disagreements)} disagreements")


if __name__ == "__main__":
    main()
