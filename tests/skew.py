"""Logs with missing records and skewed clocks, and evidence.clock_skew worked out by brute force:
shared by the findings' tests on DuckDB and on Spark."""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import forensics


def skewed_logs(out: Path, simulate: Callable[..., Any]) -> None:
    """A simulated run (``simulate(out, seed=, over_long=)``) whose decode-0 lost the records of
    seq 40, 41, 100 and 250 and has one record 3 s behind the one before it, and whose decode-1's
    clock runs a minute early."""
    simulate(out, seed=3, over_long=0.0)
    decode0 = out / "decode-0.jsonl"
    lines = decode0.read_text().splitlines(keepends=True)
    dropped = [40, 41, 100, 250]  # seqs 40-41 (one gap of two), 100, 250
    back = json.loads(lines[300])  # and one record 3 s behind the one before it in seq
    back["ts"] = back["ts"][:17] + f"{int(back['ts'][17:19]) - 3:02d}" + back["ts"][19:] \
        if int(back["ts"][17:19]) >= 3 else back["ts"][:17] + "00" + back["ts"][19:]
    lines[300] = json.dumps(back) + "\n"
    decode0.write_text("".join(x for i, x in enumerate(lines) if i not in dropped))
    decode1 = out / "decode-1.jsonl"
    shifted = []
    for line in decode1.read_text().splitlines():
        r = json.loads(line)
        early = dt.datetime.fromisoformat(r["ts"].replace("Z", "+00:00")) - dt.timedelta(minutes=1)
        r["ts"] = early.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # one minute early (before, minute 0 became "-1":
        shifted.append(json.dumps(r))  # quarantined, decode-1's log then began at seq 2100: a seq gap)
    decode1.write_text("\n".join(shifted) + "\n")


def clock_skew_oracle(db: Path) -> list[tuple[object, ...]]:
    """evidence.clock_skew by brute force: every transfer's start paired with its completion, per
    link; every node's records walked in seq order, boot by boot."""
    with forensics.Case(db) as case:
        transfers = case.sql("SELECT transfer_id, event, node, src_node, dst_node, ts FROM transfers").rows()
        records = case.sql("SELECT node, boot, seq, ts FROM records WHERE seq IS NOT NULL").rows()

    def us(d: dt.timedelta) -> int:
        return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds

    signs: dict[tuple[str, str, str | None], list[int]] = defaultdict(list)
    for tid, event, node, src, _, ts in transfers:
        if event == "started" and node == src:
            for tid2, event2, node2, _, dst2, ts2 in transfers:
                if tid2 == tid and event2 == "completed" and node2 == dst2:
                    signs["transfer", src, dst2].append(us(ts2 - ts))
    walks: dict[tuple[str, int], list[tuple[int, dt.datetime]]] = defaultdict(list)
    for node, boot, seq, ts in records:
        walks[node, boot].append((seq, ts))
    for (node, _), walk in walks.items():
        walk.sort(key=lambda r: r[0])
        for (_, before), (_, after) in zip(walk, walk[1:], strict=False):
            if after < before:
                signs["ts_before_previous_seq", node, None].append(us(after - before))
    return sorted(((signal, a, b, len(d), min(d) / 1e6, max(d) / 1e6)
                   for (signal, a, b), d in signs.items() if min(d) < 0),
                  key=lambda r: (r[0], r[1], r[2] or ""))


