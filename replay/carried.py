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
    string once nothing of it is left to come on the node (the replay forgets it then).
    (:class:`Placer` does it, a row at a time.)"""
    placer = Placer(carried)
    for i, row in enumerate(rows):
        record = row.record
        rid = record["request_id"]
        key = (record["boot"], record.get("_seq_key", record["seq"]))
        if placer.quiet():  # (nothing to place: most nodes, most of the time)
            yield row
            placer.passed(key)
            if row.last and rid is not None:
                yield rid
            continue
        yield from placer.before(i, rid, record["ts"], (record["kind"], record["event"]) in AFTER_TRANSFER_END, key)
        yield row
        yield from placer.after(i, rid, row.last, key)
    yield from placer.rest()


class Placer:
    """Where :func:`placed` puts the transfer ends ``carried`` to a node among its rows, and where it
    forgets each request, asked a row at a time (the row's request id, time text, whether it comes
    after its request's transfer end, whether it is its request's last, and its (boot, sort key)):
    by :func:`placed` over records, and by the compiled decode node over a batch's columns
    (replay/decode_fast.py)."""

    def __init__(self, carried: Iterator[tuple[int, Row]]) -> None:
        self._upcoming = iter(carried)
        self._nxt = next(self._upcoming, None)
        self._armed: dict[str, list[tuple[int, Row]]] = defaultdict(list)  # by request, in carried order
        self._by_time: list[tuple[str, int, str]] = []  # heap of the armed: (ts, n, request)
        self._done: set[str] = set()  # requests past their last record, waiting for their ends
        self._n = 0
        self._prev: tuple[Any, Any] | None = None  # the (boot, sort key) of the last record handed out

    def quiet(self) -> bool:
        """Whether nothing carried is left to place: the rows go in order, each request forgotten
        after its last (:meth:`passed` for each)."""
        return self._nxt is None and not self._by_time and not self._armed

    def waits_past(self, i: int) -> bool:
        """Whether nothing is armed and the next carried end may go only after the row ``i``, the
        rows up to it going in order (:meth:`passed` for the last of them)."""
        return not self._by_time and not self._armed and (self._nxt is None or self._nxt[0] > i + 1)

    def passed(self, key: tuple[Any, Any]) -> None:
        """A row handed out with nothing to place around it (its (boot, sort key))."""
        self._prev = key

    def before(self, i: int, rid: str | None, ts: str, after_end: bool, key: tuple[Any, Any]) -> list[Row | str]:
        """What goes before the node's row ``i``: the carried ends due there, and the requests
        forgotten once they are placed."""
        self._arm(i)
        due_n: dict[str, set[int]] = defaultdict(set)
        while self._by_time and self._by_time[0][0] < ts:
            _, m, r = heapq.heappop(self._by_time)
            due_n[r].add(m)
        if rid in self._armed and after_end:
            due_n[rid].update(m for m, _ in self._armed[rid])
        due = [d for r, ms in due_n.items() for d in self._take(r, ms)]
        return self._place(due, key) if due else []

    def after(self, i: int, rid: str | None, last: bool, key: tuple[Any, Any]) -> list[str]:
        """What goes after the node's row ``i``: its request's id, where it was its last and none of
        its ends is still to place."""
        self._prev = key
        self._arm(i + 1)
        if last and rid is not None:
            if self._armed.get(rid):
                self._done.add(rid)
            else:
                self._armed.pop(rid, None)
                return [rid]
        return []

    def rest(self) -> list[Row | str]:
        """The carried ends left to place after the node's last row, then the requests still to forget."""
        self._arm(1 << 62)
        rest = [d for r in list(self._armed) for d in self._take(r, {m for m, _ in self._armed[r]})]
        out = self._place(rest, None)
        out.extend(sorted(self._done))
        return out

    def _arm(self, at: int) -> None:
        while self._nxt is not None and self._nxt[0] <= at:
            row = self._nxt[1]
            rid = row.record["request_id"]
            self._armed[rid].append((self._n, row))
            heapq.heappush(self._by_time, (row.record["ts"], self._n, rid))
            self._n += 1
            self._nxt = next(self._upcoming, None)

    def _take(self, rid: str, ns: set[int]) -> list[tuple[int, Row]]:
        mine = self._armed.get(rid, [])
        out = [d for d in mine if d[0] in ns]
        left = [d for d in mine if d[0] not in ns]
        if left:
            self._armed[rid] = left
        else:
            self._armed.pop(rid, None)
        return out

    def _place(self, due: list[tuple[int, Row]], before: tuple[Any, Any] | None) -> list[Row | str]:
        out: list[Row | str] = []
        ids = []
        for _, row in sorted(due, key=lambda d: d[0]):
            ref = self._prev if self._prev is not None else before
            boot, key = ref if ref is not None else (0, None)
            record = dict(row.record, boot=boot, _seq_key=NO_SEQ if key is None else key)
            out.append(row._replace(record=record))
            self._prev = (boot, record["_seq_key"])
            ids.append(record["request_id"])
        for rid in dict.fromkeys(ids):  # (once every end due here is placed)
            if rid in self._done and not self._armed.get(rid):
                self._done.discard(rid)
                out.append(rid)
        return out
