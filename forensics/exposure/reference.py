"""The exposure rule of log-schema.md section 5 in plain Python, page by page: the executable
reference that the compiled sweep (``kernel``, ``sweep``) and every engine are held to.

It reads valid canonical records (dicts, as the schema writes them) and is written for
clarity, not speed: each page is its own entry. Tests compare the case's exposures and
figures with :func:`run` on random logs and on the spec's examples.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from forensics.ids import NodeId, PageId, RequestId

#: A page's content version: (writer request, seq of its write); None before any write in the boot.
Version = tuple[RequestId, int] | None
#: (reader, victim, node, boot)
ExposureKey = tuple[RequestId, RequestId, NodeId, int]
Record = Mapping[str, Any]


def expand(pages: str) -> list[PageId]:
    """Page ids of a page-range string, one by one: ``"1-3,7"`` is ``[1, 2, 3, 7]``."""
    out: list[int] = []
    for part in pages.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return cast(list[PageId], out)


@dataclass(frozen=True)
class Seen:
    """A reader saw a page's version: at ``seq``, by a logged read or an inferred one."""

    reader: RequestId
    node: NodeId
    boot: int
    page: PageId
    version: Version
    seq: int
    inferred: bool


@dataclass(frozen=True)
class Result:
    """What the rule gives for a log set."""

    figures: dict[str, int]
    #: (reader, victim, node, boot) -> pages, the first seq the reader saw any, any read inferred
    exposures: dict[ExposureKey, tuple[frozenset[int], int, bool]]
    #: (reader, node, page) read before any write in the boot
    uninitialized: frozenset[tuple[RequestId, NodeId, PageId]]


def run(records: Iterable[Record]) -> Result:
    """Exposures, uninitialized reads and the eight figures of valid canonical ``records``."""
    records = list(records)
    seen, clean_share = _sweep(records)
    exposures: dict[ExposureKey, tuple[set[int], int, bool]] = {}
    uninitialized: set[tuple[RequestId, NodeId, PageId]] = set()
    for s in seen:
        if s.version is None:
            uninitialized.add((s.reader, s.node, s.page))
            continue
        writer = s.version[0]
        if writer == s.reader or (s.reader, s.node, s.boot, s.page, s.version) in clean_share:
            continue
        key = (s.reader, writer, s.node, s.boot)
        pages, first, inferred = exposures.get(key, (set(), s.seq, False))
        pages.add(s.page)
        exposures[key] = (pages, min(first, s.seq), inferred or s.inferred)
    return Result(
        figures(records, exposures, uninitialized),
        {k: (frozenset(v[0]), v[1], v[2]) for k, v in exposures.items()},
        frozenset(uninitialized),
    )


def _sweep(records: list[Record]) -> tuple[list[Seen], set[tuple[RequestId, NodeId, int, PageId, Version]]]:
    """Every (reader, page, version) seen, node by node and boot by boot in seq order; and the
    versions each reader took as its own by ``share``."""
    by_node_boot: dict[tuple[NodeId, int], list[Record]] = defaultdict(list)
    logged_readers = {(r["node"], r["request_id"]) for r in records if r["kind"] == "kv" and r["op"] == "read"}
    for r in records:
        if r.get("seq") is None:
            continue
        if r["kind"] == "kv" or (r["kind"] == "request" and r["event"] == "decode_started"):
            by_node_boot[(r["node"], r.get("boot", 0))].append(r)
    seen: list[Seen] = []
    clean_share: set[tuple[RequestId, NodeId, int, PageId, Version]] = set()
    for (node, boot), events in by_node_boot.items():
        version: dict[PageId, Version] = {}  # a new boot: no page holds anyone's content
        holds: dict[RequestId, set[PageId]] = defaultdict(set)
        reading: dict[PageId, dict[RequestId, bool]] = defaultdict(dict)  # page -> reader -> inferred
        for ev in sorted(events, key=lambda e: e["seq"]):
            seq, rid = ev["seq"], ev["request_id"]
            if ev["kind"] == "request":  # decode_started: an inferred read of every page held
                if (node, rid) not in logged_readers:
                    for p in sorted(holds[rid]):
                        if rid not in reading[p]:
                            reading[p][rid] = True
                            seen.append(Seen(rid, node, boot, p, version.get(p), seq, True))
                continue
            op = ev["op"]
            for p in expand(ev["pages"]):
                if op in ("alloc", "share"):
                    holds[rid].add(p)
                    if op == "share":
                        clean_share.add((rid, node, boot, p, version.get(p)))
                elif op == "write":  # readers still attending the page see the new version too
                    version[p] = (rid, seq)
                    seen.extend(Seen(reader, node, boot, p, version[p], seq, inferred)
                                for reader, inferred in reading[p].items())
                elif op == "read":
                    if rid not in reading[p]:
                        reading[p][rid] = False
                        seen.append(Seen(rid, node, boot, p, version.get(p), seq, False))
                elif op == "free":
                    holds[rid].discard(p)
                    reading[p].pop(rid, None)
    return seen, clean_share


def delivered_requests(records: Iterable[Record]) -> set[str]:
    """Requests with a 2xx ``finished`` and none with a status >= 400 (section 3)."""
    ok: set[str] = set()
    failed: set[str] = set()
    for r in records:
        if r["kind"] == "request" and r["event"] == "finished":
            if 200 <= r["status"] <= 299:
                ok.add(r["request_id"])
            if r["status"] >= 400:
                failed.add(r["request_id"])
    return ok - failed


def figures(
    records: list[Record],
    exposures: Mapping[ExposureKey, tuple[Iterable[int], int, bool]],
    uninitialized: set[tuple[RequestId, NodeId, PageId]],
) -> dict[str, int]:
    """The eight figures of section 5 from the exposures and uninitialized reads."""
    tenant: dict[str, str] = {}
    for r in records:
        if r["kind"] == "request" and r["event"] == "received":
            rid = r["request_id"]
            tenant[rid] = min(tenant.get(rid, r["tenant_id"]), r["tenant_id"])
    delivered = delivered_requests(records)
    pairs = {(r, v) for r, v, _, _ in exposures if r in delivered}
    page_reads = {(r, n, p) for (r, _, n, _), (pages, _, _) in exposures.items() if r in delivered for p in pages}
    return {
        "exposed_responses": len({r for r, _ in pairs}),
        "contained_requests": len({r for r, _, _, _ in exposures if r not in delivered}),
        "victim_requests": len({v for _, v in pairs}),
        "exposure_pairs": len(pairs),
        "cross_tenant_pairs": len({(r, v) for r, v in pairs if r in tenant and v in tenant and tenant[r] != tenant[v]}),
        "exposed_page_reads": len(page_reads),
        "uninitialized_reads": len(uninitialized),
        "affected_tenants": len({tenant[v] for _, v in pairs if v in tenant}),
    }
