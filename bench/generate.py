"""Generate canonical log sets of a placeholder-handoff incident, for samples and benchmarks.

A deliberately small workload model (not the reference engine of replay/): requests arrive
at a router, each decode node preallocates the prompt's pages from a free list that reuses
freed pages first, the transfer writes them (one page only for an over-long prompt: the
placeholder), decode reads them all, then frees them. With ``boots`` above 1 each decode node
restarts that many times less one, evenly over the requests: what is in flight finishes, and the
node starts a new boot (its seq from 0, its pool fresh, its config logged again). Deterministic
for a seed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from forensics.emit import page_string

T0 = dt.datetime(2026, 9, 14, 8, 0, tzinfo=dt.UTC)


class NodeLog:
    """One node's log file with its own seq counter."""

    def __init__(self, folder: Path, node: str) -> None:
        self.node = node
        self.seq = 0
        self.boot: int | None = None  # (logged only when the node restarts: boots above 1)
        self.fh: TextIO = (folder / f"{node}.jsonl").open("w", encoding="utf-8")

    def emit(self, ts: dt.datetime, record: dict[str, Any], *, seq: bool = True) -> None:
        record = {
            "kind": record.pop("kind"),
            "ts": ts.isoformat().replace("+00:00", "Z"),
            "node": self.node,
            **record,
        }
        if self.boot is not None:
            record["boot"] = self.boot
        if seq:
            record["seq"] = self.seq
            self.seq += 1
        self.fh.write(json.dumps(record) + "\n")


def generate(
    out: Path,
    *,
    requests: int,
    seed: int,
    decode_nodes: int = 2,
    pool_pages: int = 10_646,
    page_size: int = 64,
    over_long: float = 0.02,
    in_flight: int = 24,
    boots: int = 1,
) -> int:
    """Write the log set to ``out``; the number of records written."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    router = NodeLog(out, "router")
    decoders = [NodeLog(out, f"decode-{i}") for i in range(decode_nodes)]
    tenants = [f"tenant-{i:02d}" for i in range(12)]
    free = {d.node: deque(range(1, pool_pages)) for d in decoders}
    active: deque[tuple[str, NodeLog, list[int]]] = deque()
    written = 0

    def configure(d: NodeLog, at: dt.datetime) -> int:
        d.emit(
            at,
            {
                "kind": "config",
                "role": "decode",
                "engine": "sglang",
                "engine_version": "0.5.21",
                "model": "glm-5.3",
                "context_length": 1_048_576,
                "page_size": page_size,
                "pool_pages": pool_pages,
            },
        )
        return 1

    for d in decoders:
        d.boot = 0 if boots > 1 else None
        written += configure(d, T0)
    now = T0

    def finish() -> int:
        rid, node, pages = active.popleft()
        node.emit(
            now,
            {
                "kind": "request",
                "request_id": rid,
                "event": "finished",
                "status": 200,
                "output_tokens": 64,
            },
        )
        node.emit(now, {"kind": "kv", "request_id": rid, "op": "free", "pages": page_string(pages)})
        free[node.node].extend(pages)
        return 2

    per_boot = -(-requests // boots)
    for i in range(requests):
        now += dt.timedelta(milliseconds=rng.randint(5, 400))
        if i and i % per_boot == 0:  # every decode node restarts, once what is in flight is done
            while active:
                written += finish()
            for d in decoders:
                d.boot, d.seq = (d.boot or 0) + 1, 0
                free[d.node] = deque(range(1, pool_pages))
                written += configure(d, now)
        rid = f"req-{seed}-{i:07d}"
        long_prompt = rng.random() < over_long
        tokens = (
            rng.randint(681_275, 1_048_575)
            if long_prompt
            else int(rng.lognormvariate(8.5, 1.0)) + 1
        )
        need = min(-(-tokens // page_size), pool_pages // 4)
        node = decoders[i % decode_nodes]
        while active and (len(active) >= in_flight or len(free[node.node]) < need):
            written += finish()
        if len(free[node.node]) < need:
            continue
        pages = [free[node.node].popleft() for _ in range(need)]
        router.emit(
            now,
            {
                "kind": "request",
                "request_id": rid,
                "event": "received",
                "tenant_id": rng.choice(tenants),
                "prompt_tokens": tokens,
                "decode_node": node.node,
            },
            seq=False,
        )
        node.emit(now, {"kind": "request", "request_id": rid, "event": "admitted"})
        node.emit(now, {"kind": "kv", "request_id": rid, "op": "alloc", "pages": page_string(pages)})
        sent = pages[:1] if long_prompt else pages
        node.emit(
            now,
            {
                "kind": "kv",
                "request_id": rid,
                "op": "write",
                "pages": page_string(sent),
                "source": "transfer",
            },
        )
        node.emit(now, {"kind": "request", "request_id": rid, "event": "decode_started"})
        node.emit(now, {"kind": "kv", "request_id": rid, "op": "read", "pages": page_string(pages)})
        written += 6
        active.append((rid, node, pages))
    while active:
        written += finish()
    for log in (router, *decoders):
        log.fh.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--decode-nodes", type=int, default=2)
    parser.add_argument("--pool-pages", type=int, default=10_646)
    parser.add_argument("--over-long", type=float, default=0.02)
    parser.add_argument("--boots", type=int, default=1, help="boots of each decode node (restarts plus one)")
    args = parser.parse_args()
    n = generate(
        args.out,
        requests=args.requests,
        seed=args.seed,
        decode_nodes=args.decode_nodes,
        pool_pages=args.pool_pages,
        over_long=args.over_long,
        boots=args.boots,
    )
    print(f"{n} records in {args.out}")


if __name__ == "__main__":
    main()
