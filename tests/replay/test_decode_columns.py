"""A decode node's logged lines made over columns (replay/decode_columns.py) held to
replay.logset.record_line writing each record alone, their oracle; and the node queries' batches
handed out a node at a time (replay.events.ByNode) held to a dictionary of every node's rows."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from replay import decode_columns
from replay.events import EVENT_FIELDS, ByNode
from replay.logset import record_line, ts_text

_SEQ = 918273645546372819
_INTS = {"ts", "boot", "seq", "prompt_tokens", "max_new_tokens", "limit_tokens", "status", "output_tokens",
         "tokens", "bytes", "cached_tokens", "running", "steps", "retractions"}
#: Texts JSON writes as they are, and some it escapes (quotes, backslashes, controls), and others.
_TEXTS = ["r-1", "tenant é", "decode-0", "a\"b", "back\\slash", "tab\there", "nl\nx", "\x01ctl", "", "日本"]


def _records(rng: random.Random, n: int, escapes: bool, far: bool) -> list[dict[str, Any]]:
    records = []
    for _ in range(n):
        r: dict[str, Any] = {}
        for f in EVENT_FIELDS:
            if f == "kind":
                r[f] = rng.choice(["request", "transfer", "step"])
            elif f == "ts":
                # (far: anywhere int64 nanoseconds reach, the kernel's times: decode_fast.BLOCKERS)
                r[f] = rng.choice([rng.randrange(-2**63, 2**63) // 1000, -1, -2**63 // 1000 + 1, (2**63 - 1) // 1000]) \
                    if far else rng.randrange(1_700_000_000_000_000, 1_800_000_000_000_000)
            elif rng.random() < 0.4:
                r[f] = None
            elif f in _INTS:
                r[f] = rng.choice([0, 1, -5, rng.randrange(2**62)])
            else:
                r[f] = rng.choice(_TEXTS if escapes else _TEXTS[:3])
        records.append(r)
    return records


def _batch(records: list[dict[str, Any]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {f: pa.array([r[f] for r in records], pa.int64() if f in _INTS else pa.string()) for f in EVENT_FIELDS})


def _logged(record: dict[str, Any], node: str, boot: int, **more: Any) -> dict[str, Any]:
    """The record as decode_fast writes it: node and boot the node's, its time as text, the seq open."""
    return dict(record, node=node, boot=boot, seq=_SEQ, ts=ts_text(record["ts"] * 1000), **more)


@pytest.mark.parametrize(("escapes", "far"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("boot", [0, 3])
def test_lines_as_record_line_writes_them(escapes: bool, far: bool, boot: int) -> None:
    rng = random.Random(boot * 10 + escapes + 2 * far)
    records = _records(rng, 400, escapes, far)
    node = "decode \"7\"" if escapes else "decode-7"
    data, start, middle = decode_columns.templates(_batch(records), node, boot)
    ends = np.append(start[1:], len(data))
    text = data.tobytes()
    for i, record in enumerate(records):
        expected = record_line(_logged(record, node, boot)) + "\n"
        before, after = expected.split(f'"seq":{_SEQ}')
        assert text[start[i]:middle[i]] == (before + '"seq":').encode()
        assert text[middle[i]:ends[i]] == after.encode()


@pytest.mark.parametrize("escapes", [False, True])
def test_landed_pages_as_record_line_writes_them(escapes: bool) -> None:
    rng = random.Random(5 + escapes)
    records = _records(rng, 300, escapes, False)
    tokens = np.array([rng.randrange(1, 1 << 20) for _ in records], np.int64)
    data, start, second, third = decode_columns.landed(_batch(records), "decode-1", 0, tokens)
    ends = np.append(start[1:], len(data))
    text = data.tobytes()
    dst = "0-918273645546372819"
    for i, record in enumerate(records):
        landed = _logged(record, "decode-1", 0, tokens=int(tokens[i]), dst_pages=dst)
        landed.pop("src_pages")
        before, after = record_line(landed).split(f'"seq":{_SEQ}')
        middle, rest = after.split(f'"dst_pages":"{dst}"')
        assert text[start[i]:second[i]] == (before + '"seq":').encode()
        assert text[second[i]:third[i]] == (middle + '"dst_pages":"').encode()
        assert text[third[i]:ends[i]] == ('"' + rest + "\n").encode()


def test_a_node_queries_batches_handed_out_node_by_node() -> None:
    """Nodes across batch boundaries, nodes asked for and passed over, rows and batches taken in
    turn: each node asked for gets its rows, in order, as a dictionary of them all says."""
    rng = random.Random(11)
    for _ in range(200):
        nodes = sorted(rng.sample([f"n{i:02d}" for i in range(30)], rng.randrange(1, 12)))
        rows = [(node, i) for node in nodes for i in range(rng.randrange(1, 9))]
        cuts = sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randrange(0, 6)))) if len(rows) > 1 else []
        bounds = [0, *cuts, len(rows)]
        batches = [pa.RecordBatch.from_pydict({"node": [r[0] for r in rows[a:b]], "i": [r[1] for r in rows[a:b]]})
                   for a, b in zip(bounds, bounds[1:], strict=False)]
        batches.insert(rng.randrange(len(batches) + 1), batches[0].slice(0, 0))  # (an empty batch)
        by_node = ByNode(iter(batches))
        expected = {node: [(i,) for n, i in rows if n == node] for node in nodes}
        asked = sorted(rng.sample([f"n{i:02d}" for i in range(31)], rng.randrange(1, 15)))
        for node in asked:
            how = rng.choice(["rows", "batches", "has"])
            if how == "has":
                assert by_node.has(node) == (node in expected)
                how = rng.choice(["rows", "batches"])
            if how == "rows":
                got = list(by_node.of(node))
            else:
                got = [(i,) for b in by_node.batches_of(node) for i in b.column("i").to_pylist()]
                assert all(b.schema.names == ["i"] for b in by_node.batches_of(node))  # (none left: asked once)
            assert got == expected.get(node, [])
            assert not by_node.has(node)  # (its rows handed out)


def test_times_written_a_batch_at_a_time_as_one_at_a_time() -> None:
    """replay.logset.ts_texts against ts_text: four-digit years by Arrow, the others (years 1 to 999)
    one at a time, in batches of either and of both."""
    from replay.logset import ts_texts

    rng = random.Random(3)
    first, four_digits, last = -62_135_596_800_000_000, -30_610_224_000_000_000, 253_402_300_799_999_999
    for lo, hi in ((four_digits, last), (first, four_digits), (first, last)):
        micros = [rng.randrange(lo, hi + 1) for _ in range(500)] + [lo, hi]
        assert ts_texts(pa.array(micros, pa.int64())).to_pylist() == [ts_text(t * 1000) for t in micros]


def test_carried_ends_placed_among_batches_as_placed_places_them() -> None:
    """decode_fast._Batches, carried.Placer driven over a node's rows a batch at a time (batches of
    any size, the rows with nothing to place passed over in bulk), against replay.carried.placed
    driving it a record at a time: the same rows, carried ends (with the boot and key each takes)
    and forgotten requests, in the same order."""
    from replay.carried import placed
    from replay.decode_fast import _Batches
    from replay.events import Row

    rng = random.Random(21)
    general = after_last = 0  # (batches placed end by end; carried ends placed after the node's last row)
    for _ in range(300):
        n = rng.randrange(0, 40)
        rids = [rng.choice([None, *(f"r{i}" for i in range(8))]) for _ in range(n)]
        micros = sorted(rng.randrange(1_700_000_000_000_000, 1_700_000_000_000_100) for _ in range(n))
        if rng.random() < 0.3:  # (times out of order)
            rng.shuffle(micros)
        kinds = [rng.choice([("request", "admitted"), ("request", "decode_started"), ("request", "finished"),
                             ("transfer", "completed"), ("step", None)]) for _ in range(n)]
        seen: set[str] = set()
        last = [False] * n
        for j in range(n - 1, -1, -1):  # (a request's last row on the node)
            if rids[j] is not None and rids[j] not in seen:
                seen.add(rids[j])
                last[j] = True
        batch = pa.RecordBatch.from_pydict({
            "kind": pa.array([k for k, _ in kinds], pa.string()), "ts": pa.array(micros, pa.int64()),
            "boot": pa.array([0] * n, pa.int64()),
            "seq": pa.array([j if rng.random() < 0.9 else None for j in range(n)], pa.int64()),
            "request_id": pa.array(rids, pa.string()), "event": pa.array([e for _, e in kinds], pa.string()),
            "_last": pa.array(last, pa.bool_())})
        records = [dict(kind=kinds[j][0], ts=ts_text(micros[j] * 1000), boot=0, seq=batch.column("seq")[j].as_py(),
                        request_id=rids[j], event=kinds[j][1]) for j in range(n)]
        rows = [Row(r, last[j], None, False) for j, r in enumerate(records)]
        carried = sorted(((rng.randrange(0, n + 2), Row(
            {"kind": "transfer", "ts": ts_text(rng.randrange(1_700_000_000_000_000, 1_700_000_000_000_100) * 1000),
             "request_id": f"r{rng.randrange(8)}", "event": "completed", "seq": None}, False, None, False))
            for _ in range(rng.randrange(0, 6))), key=lambda c: c[0])
        expected = list(placed(iter(rows), iter(carried)))
        placer = _Batches(iter(carried))
        got: list[Any] = []
        at = 0
        while at < n or at == 0:
            size = rng.randrange(1, 12)
            part = batch.slice(at, size)
            order = placer.order(part)
            general += order is not None
            if order is None:  # (the rows in order, each request's last followed by its id)
                order = []
                for j in range(part.num_rows):
                    order.append(j)
                    if last[at + j] and rids[at + j] is not None:
                        order.append(rids[at + j])
            got += [rows[at + x] if isinstance(x, int) else x for x in order]
            at += size
            if at >= n:
                break
        rest = placer.rest()
        after_last += any(not isinstance(x, str) for x in rest)
        got += rest
        assert [x if isinstance(x, str) else x.record for x in got] == \
            [x if isinstance(x, str) else x.record for x in expected]
    assert general > 100 and after_last > 20
