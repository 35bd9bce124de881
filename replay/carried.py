"""Transfer ends one node logged for another: each as the record the other node would have
logged, put in that node's order where causality and then time say."""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from replay.events import AFTER_TRANSFER_END, EVENT_FIELDS, NO_SEQ, Row, row_of

_N_EVENT = len(EVENT_FIELDS)


def carried_to(rows: Iterator[tuple[Any, ...]], node: str) -> Iterator[tuple[int, Row]]:
    """The transfer ends ``node`` did not log itself but another node did, for its side, each with
    the place in the node's order from which it may go (after the last of its request's records
    that come before a transfer end there), in that order (its rows of ``carried_ends``).

    A transfer's ``completed`` or ``failed`` logged by one node is a fact for both sides (the
    schema's section 3): its prefill node (``src_node``) releases its pages then, its decode node
    (``dst_node``) has them land. Each such end (the first record of it, in node order) comes as
    the record that node would have logged, marked ``_carried`` with the node that did; where it
    goes in the node's order is :func:`placed`'s. Ends of requests the node holds nothing of
    act on nothing there and are left out.

    A request no node logged a transfer end of, that decode started on, had its transfer end
    before that (decode reads what it carried): its end is *implied* there, for both sides
    (``implied``: the engine acts on it and logs no transfer record, as none was logged; the
    decode node places it just before the ``decode_started``, the prefill node by that time).
    """
    for row in rows:
        r = row_of(row[:_N_EVENT + 2] + row[_N_EVENT + 3:])
        record = dict(r.record, node=node, seq=None, _carried=r.record["node"])
        if row[_N_EVENT + 2]:
            record["implied"] = True
        yield row[_N_EVENT + 1], r._replace(record=record, last=False)


def placed(rows: Iterator[Row], carried: Iterator[tuple[int, Row]]) -> Iterator[Row | str]:
    """A node's ``rows`` (in its order) with each carried transfer end put where causality and
    then time say: after the last of its request's records that come before a transfer end
    (``carried`` gives that place, and comes in that order), before the first of the request's
    records that come after one, and, between the two, before the first record (of any request)
    logged after it. Ends at one place go in the order ``carried`` gives them. Each placed record
    takes the (boot, seq) of the record before it as its sort key. A request's id comes as a
    string once nothing of it is left to come on the node (the replay forgets it then)."""
    upcoming = iter(carried)
    nxt = next(upcoming, None)
    armed: dict[str, list[tuple[int, Row]]] = defaultdict(list)  # by request, in carried order
    by_time: list[tuple[str, int, str]] = []  # heap of the armed: (ts, n, request)
    done: set[str] = set()  # requests past their last record, waiting for their ends
    n = 0
    prev: dict[str, Any] | None = None

    def arm(at: int) -> None:
        nonlocal nxt, n
        while nxt is not None and nxt[0] <= at:
            rid = nxt[1].record["request_id"]
            armed[rid].append((n, nxt[1]))
            heapq.heappush(by_time, (nxt[1].record["ts"], n, rid))
            n += 1
            nxt = next(upcoming, None)

    def place(due: list[tuple[int, Row]], before: dict[str, Any] | None) -> Iterator[Row | str]:
        nonlocal prev
        ids = []
        for _, row in sorted(due, key=lambda d: d[0]):
            ref = prev if prev is not None else before
            boot = ref["boot"] if ref is not None else 0
            key = ref.get("_seq_key", ref["seq"]) if ref is not None else None
            record = dict(row.record, boot=boot, _seq_key=NO_SEQ if key is None else key)
            yield row._replace(record=record)
            prev = record
            ids.append(record["request_id"])
        for rid in dict.fromkeys(ids):  # (once every end due here is placed)
            if rid in done and not armed.get(rid):
                done.discard(rid)
                yield rid

    def take(rid: str, ns: set[int]) -> list[tuple[int, Row]]:
        mine = armed.get(rid, [])
        out = [d for d in mine if d[0] in ns]
        left = [d for d in mine if d[0] not in ns]
        if left:
            armed[rid] = left
        else:
            armed.pop(rid, None)
        return out

    i = 0
    for row in rows:
        record = row.record
        rid = record["request_id"]
        if nxt is None and not by_time and not armed:  # (nothing to place: most nodes, most of the time)
            yield row
            prev = record
            i += 1
            if row.last and rid is not None:
                yield rid
            continue
        arm(i)
        due_n: dict[str, set[int]] = defaultdict(set)
        while by_time and by_time[0][0] < record["ts"]:
            _, k, r = heapq.heappop(by_time)
            due_n[r].add(k)
        if rid in armed and (record["kind"], record["event"]) in AFTER_TRANSFER_END:
            due_n[rid].update(k for k, _ in armed[rid])
        due = [d for r, ks in due_n.items() for d in take(r, ks)]
        if due:
            yield from place(due, record)
        yield row
        prev = record
        i += 1
        arm(i)
        if row.last and rid is not None:
            if armed.get(rid):
                done.add(rid)
            else:
                armed.pop(rid, None)
                yield rid
    arm(1 << 62)
    rest = [d for r in list(armed) for d in take(r, {k for k, _ in armed[r]})]
    yield from place(rest, None)
    for rid in sorted(done):
        yield rid
