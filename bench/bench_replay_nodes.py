"""The replay of a case of many nodes, against the investigation of the same case, side by side.

A simulated incident on NODES prefill and NODES decode nodes (a few requests each, 2% over-long
prompts), stripped of its page records into one file (an archive of a file a node is the
many-files bench's, bench_ingest.py): ``forensics.investigate`` of it (ingest and analysis; the
baseline), then the replay under ``sglang-placeholder`` (plans, the engine over every node, the
replayed log set written, ingested and analysed). Issue #44 asks that 10,000 nodes replay in
seconds; the replay read each node with queries of its own (40 ms a node) and wrote a file a
node (85 ms each to ingest).

Run: python bench/bench_replay_nodes.py [--nodes 5000] [--requests-per-node 2] [--seed 1]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5_000, help="prefill nodes, and as many decode nodes")
    parser.add_argument("--requests-per-node", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    deployment = Deployment(prefill_nodes=args.nodes, decode_nodes=args.nodes)
    rng = random.Random(args.seed)
    n = args.nodes * args.requests_per_node
    arrivals = shape(synthetic(n, rng, rate=4.0), rng, deployment, over_long=0.02)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        sim = simulate(root / "full", arrivals, deployment=deployment, seed=args.seed)
        sim_s = time.perf_counter() - t
        full, bare = root / "full.jsonl", root / "bare.jsonl"
        with full.open("w") as whole, bare.open("w") as out:
            for f in sorted((root / "full").iterdir()):
                with f.open() as inp:
                    for line in inp:
                        whole.write(line)
                        if '"kind":"kv"' not in line:
                            out.write(line)
        forensics.investigate([bare], root / "warm.duckdb")  # (a first run may compile the sweep)
        t = time.perf_counter()
        base = forensics.investigate([bare], root / "bare.duckdb")
        base_s = time.perf_counter() - t
        logged = forensics.investigate([full], root / "full.duckdb").exposure
        t = time.perf_counter()
        result = replay(root / "bare.duckdb", "sglang-placeholder", root / "replayed")
        replay_s = time.perf_counter() - t
    print(f"{2 * args.nodes:,} nodes, {sim.requests:,} requests, {sim.records:,} records; simulate {sim_s:.1f} s")
    print(f"investigate of the case without page records: {base_s:.1f} s ({base.ingest.records.read:,} records)")
    print(f"replay: {replay_s:.1f} s, {replay_s / base_s:.2f}x the investigation; {len(result.disagreements)} "
          f"disagreements; {result.step_records:,} step records read, {default_jobs()} process(es)")
    same = result.exposure == logged
    print(f"replayed figures equal the full logs': {'yes' if same else 'no'} "
          f"({result.exposure['exposed_responses']:,} exposed responses, logs {logged['exposed_responses']:,})")


if __name__ == "__main__":
    main()
