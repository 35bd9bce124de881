"""Request-level logs of decode runs that SGLang's own allocator made, and the victims those runs
had: shares no code with ``replay/`` (issue #42's check of the victims named).

``tests/replay/allocator/<release>/ps<P>-decode-*.json`` record a scripted decode node driven
through SGLang's allocator classes, cut from the release wheels and run on CPU torch: every
request's row of KV slots as the allocator handed them out, and the iterations it was
preallocated, landed, joined the running batch and was freed in (the driver is stated in each
file). Which pages a request got does not depend on what its transfer carried, so the same run
is the incident's if its longest prompts were over-long: each of those marked rejected on its
prefill node, a one-token placeholder sent, decode's reservation for the whole prompt read at its
first step with only the first page written.

:func:`logs` writes that run as request-level canonical logs (no page records): a router, a
prefill node a request, the decode node, its events in the driver's order within an iteration,
an iteration 10 ms. :func:`victims` works out, from the allocator's slots alone, whose content
each placeholder read: for every page of its prompt but the ones its transfer wrote, the last
request to write it before its first step (a transfer writes the pages of the tokens it carries;
a decode step writes the page of its slot, so a placeholder's first step writes its last prompt
page where that page is partly filled)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

T0 = dt.datetime(2026, 9, 14, 8, 0, tzinfo=dt.UTC)
ITERATION_US = 10_000
#: Where in its iteration each kind of event is logged (microseconds): arrivals, preallocations,
#: landings with the joins and one-token finishes that follow them, then (after the step) frees.
AT_US = {"arrive": 0, "admit": 1_000, "sent": 1_500, "land": 2_000, "free": 8_000}
TENANTS = 5
#: The share of the requests that decode (more than one token) whose prompts are over-long.
OVER_LONG = 0.25


def expand(runs: list[list[int]]) -> list[int]:
    """The values of ``[first, count]`` runs, in order."""
    return [v for first, count in runs for v in range(first, first + count)]


def _ts(iteration: int, at: str, more_us: int = 0) -> str:
    moment = T0 + dt.timedelta(microseconds=iteration * ITERATION_US + AT_US[at] + more_us)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Run:
    """One decode run of a fixture, read as the incident."""

    page_size: int
    pool_pages: int  # with page 0, as a config record says
    requests: dict[str, dict[str, Any]]  # by rid: prompt, output, arrive_iter, ...
    outcome: dict[str, dict[str, Any]]  # by rid (served only): iterations and slots
    served: list[str]  # in stream order, which is preallocation order (FIFO)
    limit: int  # prefill's max_req_input_len: prompts of this many tokens or more are over-long

    def over_long(self, rid: str) -> bool:
        return self.requests[rid]["prompt"] >= self.limit

    def tenant(self, rid: str) -> str:
        return f"tenant-{int(rid[1:]) % TENANTS}"


def run_of(fixture: dict[str, Any]) -> Run:
    ps = fixture["page_size"]
    requests = {r["rid"]: r for r in fixture["requests"]}
    outcome = {rid: o for rid, o in fixture["outcome"].items() if rid != "aborted"}
    served = sorted(outcome, key=lambda rid: int(rid[1:]))
    decoding = sorted(requests[r]["prompt"] for r in served if requests[r]["output"] >= 2)
    limit = decoding[int(len(decoding) * (1 - OVER_LONG))]
    while (limit + 6) % ps:  # (prefill's pool then holds a whole number of pages)
        limit -= 1
    return Run(ps, fixture["size"] // ps + 1, requests, outcome, served, limit)


def victims(run: Run) -> set[tuple[str, str]]:
    """Every (reader, victim): a placeholder that read a page whose last write was another's."""
    ps, order = run.page_size, {rid: i for i, rid in enumerate(run.served)}
    writes: dict[int, list[tuple[tuple[int, int, int], str]]] = {}
    for rid in run.served:
        o, r = run.outcome[rid], run.requests[rid]
        slots = expand(o["slots"])
        sent = slots[:1] if run.over_long(rid) else slots[: r["prompt"]]
        for page in {s // ps for s in sent}:  # the transfer lands in the iteration's landing
            writes.setdefault(page, []).append(((o["land_iter"], 2, order[rid]), rid))
        if o["join_iter"] is not None:  # then a slot an iteration, each written in its step
            for j, slot in enumerate(slots[r["prompt"]:]):
                writes.setdefault(slot // ps, []).append(((o["join_iter"] + j, 3, order[rid]), rid))
    pairs = set()
    for rid in run.served:
        o, r = run.outcome[rid], run.requests[rid]
        if not run.over_long(rid) or o["join_iter"] is None:  # (one token: finished as it landed)
            continue
        first_step = (o["join_iter"], 3, -1)  # it reads its whole reservation as it joins
        for page in {s // ps for s in expand(o["slots"])[: r["prompt"]]}:
            before = [w for w in writes.get(page, []) if w[0] < first_step]
            if before and max(before)[1] != rid:
                pairs.add((rid, max(before)[1]))
    return pairs


def logs(run: Run, folder: Path, *, overlap: bool, engine_version: str = "0.5.20") -> Path:
    """The run's request-level logs in ``folder`` (made), one file a node."""
    ps = run.page_size
    events: dict[str, list[tuple[tuple[Any, ...], dict[str, Any]]]] = {}

    def add(node: str, key: tuple[Any, ...], record: dict[str, Any]) -> None:
        events.setdefault(node, []).append((key, {**record, "node": node}))

    config = {"kind": "config", "ts": _ts(0, "arrive"), "engine": "sglang", "engine_version": engine_version,
              "model": "m", "page_size": ps, "context_length": 1 << 20}
    add("decode-0", (-1,), {**config, "role": "decode", "pool_pages": run.pool_pages,
                            **({} if overlap else {"overlap_schedule": False})})
    for i, rid in enumerate(run.served):
        o, r = run.outcome[rid], run.requests[rid]
        prefill = f"prefill-{i:03d}"
        add(prefill, (-1,), {**config, "role": "prefill", "pool_pages": (run.limit + 6) // ps + 1})
        arrive, land = r["arrive_iter"], o["land_iter"]
        add("router", (arrive, 0, i), {
            "kind": "request", "ts": _ts(arrive, "arrive"), "request_id": rid, "event": "received",
            "tenant_id": run.tenant(rid), "prompt_tokens": r["prompt"], "max_new_tokens": r["output"],
            "prefill_node": prefill, "decode_node": "decode-0"})
        sent = {"transfer_id": f"x-{rid}", "src_node": prefill, "dst_node": "decode-0",
                "tokens": 1 if run.over_long(rid) else r["prompt"]}
        request = {"kind": "request", "request_id": rid}
        if run.over_long(rid):
            add(prefill, (0,), {**request, "ts": _ts(arrive, "arrive", 100), "event": "rejected",
                                "reason": "input_too_long", "limit_tokens": run.limit})
        add(prefill, (1,), {**request, "ts": _ts(arrive, "arrive", 100), "event": "prefill_started"})
        add(prefill, (2,), {**request, "ts": _ts(land, "sent"), "event": "prefill_done"})
        add(prefill, (3,), {"kind": "transfer", "ts": _ts(land, "sent"), "request_id": rid, "event": "started", **sent})
        add(prefill, (4,), {"kind": "transfer", "ts": _ts(land, "land"), "request_id": rid, "event": "completed",
                            **sent})
        add("decode-0", (o["prealloc_iter"], 1, i), {**request, "ts": _ts(o["prealloc_iter"], "admit"),
                                                     "event": "admitted"})
        add("decode-0", (land, 2, i, 0), {"kind": "transfer", "ts": _ts(land, "land"), "request_id": rid,
                                          "event": "completed", **sent})
        finished = {**request, "event": "finished", "status": 200, "finish_reason": "stop",
                    "output_tokens": r["output"]}
        if o["join_iter"] is None:  # one token: finished and freed as it lands
            add("decode-0", (land, 2, i, 1), {**finished, "ts": _ts(land, "land")})
        else:  # joins the batch's end as it lands; freed in batch (join) order
            add("decode-0", (land, 2, i, 1), {**request, "ts": _ts(land, "land"), "event": "decode_started"})
            add("decode-0", (o["free_iter"], 4, land, i), {**finished, "ts": _ts(o["free_iter"], "free")})
    folder.mkdir(parents=True)
    for node, items in events.items():
        items.sort(key=lambda item: item[0])
        lines = [json.dumps({**record, "seq": seq}) + "\n" for seq, (_, record) in enumerate(items)]
        (folder / f"{node}.jsonl").write_text("".join(lines))
    return folder
