"""Engine logs: ingesting SGLang's logs of a simulated run, against ingesting its canonical logs.

Run: python bench/bench_adapters.py [--requests N] [--json]
Simulates the incident's deployment, writes what SGLang servers would have logged of it
(replay/sglang_logs.py), and times: canonical ingest of the full page logs; adapter ingest
of the SGLang logs; the replay that names the victims from them. Checks the figures agree.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import forensics
from forensics.adapters import Options, read_tenant_map
from replay.replay import replay
from replay.sglang_logs import write as write_sglang_logs
from replay.simulate import Deployment, shape, simulate
from replay.workload import synthetic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--json", action="store_true", help="the JSON request log instead of the text form")
    args = parser.parse_args()
    deployment = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                            page_size=64, prefill_nodes=2, decode_nodes=2)
    rng = random.Random(11)
    arrivals = shape(synthetic(args.requests, rng, rate=3.0), rng, deployment, over_long=0.02, length_scale=0.5)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        simulate(root / "full", arrivals, deployment=deployment, seed=11)
        files, tenants = write_sglang_logs(root / "full", root / "sglang", text=not args.json)
        lines = sum(len(f.read_text().splitlines()) for f in files)
        t = time.perf_counter()
        full = forensics.investigate([root / "full"], root / "full.duckdb")
        canonical_s = time.perf_counter() - t
        t = time.perf_counter()
        options = Options(tenants=read_tenant_map(tenants))
        adapted = forensics.investigate(files, root / "sglang.duckdb", options=options)
        adapter_s = time.perf_counter() - t
        t = time.perf_counter()
        replayed = replay(root / "sglang.duckdb", "sglang-placeholder", root / "replayed")
        replay_s = time.perf_counter() - t
        print(f"requests: {args.requests:,}")
        print(f"canonical logs: {full.ingest.records.read:,} records, investigate {canonical_s:.2f} s")
        print(f"SGLang logs: {lines:,} lines -> {adapted.ingest.records.read:,} records, "
              f"investigate {adapter_s:.2f} s ({lines / adapter_s:,.0f} lines/s)")
        print(f"replay of the SGLang case: {replay_s:.2f} s")
        print(f"figures equal: {replayed.exposure == full.exposure} "
              f"({full.exposure['exposed_responses']} exposed responses)")


if __name__ == "__main__":
    main()
