"""A brute-force exposure oracle: log-schema.md section 5 as a plain sweep, page by page."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

Version = tuple[str, int] | None


def expand(pages: str) -> list[int]:
    """Page ids of a page-range string, one by one."""
    out: list[int] = []
    for part in pages.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
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


@dataclass
class OracleResult:
    figures: dict[str, int]
    # (reader, victim, node, boot) -> pages, first seq seen, any inferred read
    exposures: dict[tuple[str, str, str, int], tuple[frozenset[int], int, bool]]
    uninitialized: set[tuple[str, str, int]] = field(default_factory=set)


def run(records: Iterable[dict[str, Any]]) -> OracleResult:
    """Exposures and figures of a list of valid canonical records."""
    records = list(records)
    by_node_boot: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    readers_on = {
        (r["node"], r["request_id"]) for r in records if r["kind"] == "kv" and r["op"] == "read"
    }
    for r in records:
        if r.get("seq") is None:
            continue
        if r["kind"] == "kv" or (r["kind"] == "request" and r["event"] == "decode_started"):
            by_node_boot[(r["node"], r.get("boot", 0))].append(r)
    seen: list[
        tuple[str, str, int, int, Version, int, bool]
    ] = []  # reader,node,boot,page,ver,seq,inf
    clean_share: set[tuple[str, str, int, int, Version]] = set()
    for (node, boot), events in by_node_boot.items():
        version: dict[int, Version] = {}
        holds: dict[str, set[int]] = defaultdict(set)
        reading: dict[int, dict[str, bool]] = defaultdict(dict)  # page -> reader -> inferred
        for ev in sorted(events, key=lambda e: e["seq"]):
            seq, rid = ev["seq"], ev["request_id"]
            if ev["kind"] == "request":
                if (node, rid) in readers_on:
                    continue
                for p in sorted(holds[rid]):
                    if rid not in reading[p]:
                        reading[p][rid] = True
                        seen.append((rid, node, boot, p, version.get(p), seq, True))
                continue
            op = ev["op"]
            for p in expand(ev["pages"]):
                if op in ("alloc", "share"):
                    holds[rid].add(p)
                    if op == "share":
                        clean_share.add((rid, node, boot, p, version.get(p)))
                elif op == "write":
                    version[p] = (rid, seq)
                    for reader, inferred in reading[p].items():
                        seen.append((reader, node, boot, p, version[p], seq, inferred))
                elif op == "read":
                    if rid not in reading[p]:
                        reading[p][rid] = False
                        seen.append((rid, node, boot, p, version.get(p), seq, False))
                elif op == "free":
                    holds[rid].discard(p)
                    reading[p].pop(rid, None)
    exposures: dict[tuple[str, str, str, int], tuple[set[int], int, bool]] = {}
    uninitialized: set[tuple[str, str, int]] = set()
    for reader, node, boot, p, ver, seq, inferred in seen:
        if ver is None:
            uninitialized.add((reader, node, p))
            continue
        writer = ver[0]
        if writer == reader or (reader, node, boot, p, ver) in clean_share:
            continue
        key = (reader, writer, node, boot)
        pages, first, inf = exposures.get(key, (set(), seq, False))
        pages.add(p)
        exposures[key] = (pages, min(first, seq), inf or inferred)
    return OracleResult(
        _figures(records, exposures, uninitialized),
        {k: (frozenset(v[0]), v[1], v[2]) for k, v in exposures.items()},
        uninitialized,
    )


def _figures(
    records: list[dict[str, Any]],
    exposures: dict[tuple[str, str, str, int], tuple[set[int], int, bool]],
    uninitialized: set[tuple[str, str, int]],
) -> dict[str, int]:
    tenant: dict[str, str] = {}
    ok: dict[str, bool] = defaultdict(bool)
    failed: dict[str, bool] = defaultdict(bool)
    for r in records:
        if r["kind"] != "request":
            continue
        if r["event"] == "received":
            rid = r["request_id"]
            tenant[rid] = min(tenant.get(rid, r["tenant_id"]), r["tenant_id"])
        if r["event"] == "finished":
            ok[r["request_id"]] |= 200 <= r["status"] <= 299
            failed[r["request_id"]] |= r["status"] >= 400

    def delivered(rid: str) -> bool:
        return ok[rid] and not failed[rid]

    exposed = {k for k in exposures}
    delivered_pairs = {(r, v) for r, v, _, _ in exposed if delivered(r)}
    page_reads = {
        (r, n, p)
        for (r, _, n, _), (pages, _, _) in exposures.items()
        if delivered(r)
        for p in pages
    }
    return {
        "exposed_responses": len({r for r, _ in delivered_pairs}),
        "contained_requests": len({r for r, _, _, _ in exposed if not delivered(r)}),
        "victim_requests": len({v for _, v in delivered_pairs}),
        "exposure_pairs": len(delivered_pairs),
        "cross_tenant_pairs": len(
            {
                (r, v)
                for r, v in delivered_pairs
                if r in tenant and v in tenant and tenant[r] != tenant[v]
            }
        ),
        "exposed_page_reads": len(page_reads),
        "uninitialized_reads": len(uninitialized),
        "affected_tenants": len({tenant[v] for _, v in delivered_pairs if v in tenant}),
    }
