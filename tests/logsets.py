"""Log sets the tests draw (random valid ones, :func:`log_sets`) and transforms they use to check that
the analysis's answers do not depend on layout."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

TS = "2026-08-27T10:00:00Z"


def ts_of(boot: int, seq: int) -> str:
    """A node's record time: distinct per (boot, seq), so first_ts can be checked."""
    return f"2026-08-27T1{boot}:{seq // 60:02d}:{seq % 60:02d}Z"


def namespaced(i: int, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A log set's records with its nodes, requests and tenants named apart from other sets' (the
    ``i``-th set), so that many sets make one case whose figures are the sum of theirs."""
    out = []
    for r in records:
        r = dict(r, node=f"s{i}-{r['node']}")
        for key in ("request_id", "tenant_id"):
            if r.get(key) is not None:
                r[key] = f"s{i}-{r[key]}"
        out.append(r)
    return out


def scale_pages(records: Iterable[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
    """The same log with every page split into ``factor`` pages (page_size divided by it)."""
    out = []
    for r in records:
        r = dict(r)
        if r["kind"] == "config":
            r["pool_pages"] *= factor
            r["page_size"] = max(1, r["page_size"] // factor)
        if r["kind"] == "kv":
            parts = []
            for part in r["pages"].split(","):
                lo, _, hi = part.partition("-")
                parts.append(f"{int(lo) * factor}-{(int(hi or lo) + 1) * factor - 1}")
            r["pages"] = ",".join(parts)
        out.append(r)
    return out


@st.composite
def log_sets(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Random valid log sets: two nodes, boots, alloc/share/write/read/free, decode starts."""
    requests = [f"r{i}" for i in range(draw(st.integers(2, 6)))]
    tenants = ["acme", "globex", "initech"]
    records: list[dict[str, Any]] = []
    for rid in requests:
        records.append(
            {
                "kind": "request",
                "ts": TS,
                "node": "router",
                "request_id": rid,
                "event": "received",
                "tenant_id": draw(st.sampled_from(tenants)),
                "prompt_tokens": 8,
            }
        )
    pool = 12
    for node in ("decode-0", "decode-1"):
        for boot in range(draw(st.integers(1, 2))):
            seq = 0
            records.append(
                {
                    "kind": "config",
                    "ts": TS,
                    "node": node,
                    "seq": seq,
                    "boot": boot,
                    "role": "decode",
                    "engine": "sglang",
                    "engine_version": "0.5.21",
                    "model": "glm-5.3",
                    "context_length": 64,
                    "page_size": 4,
                    "pool_pages": pool,
                }
            )
            for _ in range(draw(st.integers(0, 24))):
                seq += draw(st.integers(1, 3))
                rid = draw(st.sampled_from(requests))
                if draw(st.integers(0, 9)) == 0:
                    records.append(
                        {
                            "kind": "request",
                            "ts": ts_of(boot, seq),
                            "node": node,
                            "seq": seq,
                            "boot": boot,
                            "request_id": rid,
                            "event": "decode_started",
                        }
                    )
                    continue
                lo = draw(st.integers(0, pool - 1))
                hi = draw(st.integers(lo, min(pool - 1, lo + 4)))
                pages = f"{lo}-{hi}" if hi > lo else str(lo)
                if draw(st.booleans()):
                    extra = draw(st.integers(0, pool - 1))
                    pages += f",{extra}"
                op = draw(st.sampled_from(["alloc", "share", "write", "read", "free", "write"]))
                records.append(
                    {
                        "kind": "kv",
                        "ts": ts_of(boot, seq),
                        "node": node,
                        "seq": seq,
                        "boot": boot,
                        "request_id": rid,
                        "op": op,
                        "pages": pages,
                    }
                )
    for rid in requests:
        for status in draw(st.lists(st.sampled_from([200, 200, 500, 504]), max_size=2)):
            records.append(
                {
                    "kind": "request",
                    "ts": TS,
                    "node": "router",
                    "request_id": rid,
                    "event": "finished",
                    "status": status,
                }
            )
    return records
