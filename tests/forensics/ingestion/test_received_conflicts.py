"""A request id received for two tenants or two prompt lengths (log-schema.md section 4, issue #44
item 3): the received whose canonical JSON sorts first is kept with those that agree with it, the
others are quarantined as conflicts, whatever the order and split of the files, and a finding
names the id. Held against a brute force over the records themselves."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import write_jsonl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import forensics

TS = "2026-08-27T10:00:00.000000Z"


def received(rid: str, tenant: str, prompt: int, node: str = "router", **extra: Any) -> dict[str, Any]:
    return {"kind": "request", "ts": TS, "node": node, "request_id": rid, "event": "received",
            "tenant_id": tenant, "prompt_tokens": prompt, **extra}


def canon(record: dict[str, Any]) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def oracle(records: list[dict[str, Any]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """By brute force: the received records kept and those quarantined (each distinct record once;
    a repeat is a duplicate of whichever it repeats)."""
    distinct = {canon(r): r for r in records}
    kept, lost = [], []
    for rid in sorted({r["request_id"] for r in distinct.values()}):
        mine = sorted((c, r) for c, r in distinct.items() if r["request_id"] == rid)
        winner = mine[0][1]
        for _, r in mine:
            same = (r["tenant_id"], r["prompt_tokens"]) == (winner["tenant_id"], winner["prompt_tokens"])
            (kept if same else lost).append((r["node"], rid, r["tenant_id"], r["prompt_tokens"]))
    return sorted(kept), sorted(lost)


def outcome(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        kept = con.execute("SELECT node, request_id, tenant_id, prompt_tokens FROM request_records "
                           "ORDER BY ALL").fetchall()
        lost = con.execute("SELECT DISTINCT node, request_id, tenant_id, prompt_tokens FROM received_conflicts "
                           "ORDER BY ALL").fetchall()
        q = con.execute("SELECT reason, count(*) FROM quarantine GROUP BY ALL ORDER BY ALL").fetchall()
        held = con.execute("SELECT count(*) FROM received_conflicts").fetchone()
        assert held is not None
        assert q == ([("conflict", held[0])] if held[0] else [])  # every held record is a quarantined line
        return kept, lost, q
    finally:
        con.close()


def test_the_first_by_canonical_json_wins_with_those_agreeing_in_every_order(tmp_path: Path) -> None:
    """A router's and an engine's received of acme agree; initech's and a second prompt length do
    not. The engine's sorts first ("engine" < "router"), so however the four come (each in a file
    of its own, in 8 of the 24 orders: each record first twice and last twice), both acme records
    of 10 tokens are kept and the other two are quarantined: a file that brings the winner last
    puts back a record quarantined before it."""
    recs = [received("v", "acme", 10), received("v", "initech", 10, seq=1), received("v", "acme", 10, node="engine"),
            received("v", "acme", 12)]
    want_kept, want_lost = oracle(recs)
    assert want_kept == [("engine", "v", "acme", 10), ("router", "v", "acme", 10)]
    seen, lasts = set(), set()
    for n, order in enumerate(list(itertools.permutations(recs))[::3]):
        files = [write_jsonl(tmp_path / str(n) / f"{i}.jsonl", [r]) for i, r in enumerate(order)]
        result = forensics.ingest(files, tmp_path / str(n) / "case.duckdb")
        assert result.records.as_dict() == {"read": 4, "ingested": 2, "duplicates": 0, "quarantined": 2}
        kept, lost, _ = outcome(tmp_path / str(n) / "case.duckdb")
        assert kept == want_kept and lost == want_lost
        seen.add(canon(order[0]))
        lasts.add(canon(order[-1]))
    assert len(seen) == 4 and len(lasts) == 4


def test_the_finding_names_the_id_and_figures_count_it_once_for_the_kept_tenant(tmp_path: Path) -> None:
    """The id reused by another tenant shows in evidence.request_id_conflict with both claims, and
    the requests table has it once, for the tenant kept; an id whose receiveds agree is no finding."""
    recs = [received("v", "acme", 10), received("v", "initech", 10, seq=1), received("w", "acme", 5),
            received("w", "acme", 5, node="prefill-0")]
    inv = forensics.investigate([write_jsonl(tmp_path / "a.jsonl", recs[:2]),
                                 write_jsonl(tmp_path / "b.jsonl", recs[2:])], tmp_path / "case.duckdb")
    assert inv.ingest.records.quarantined == 1
    with forensics.Case(tmp_path / "case.duckdb", read_only=True) as case:
        (found,) = [f for f in case.findings() if f.id == "evidence.request_id_conflict"]
    assert found.count == 1 and found.severity == "high"
    row = found.evidence.row(0, named=True)
    assert row["request_id"] == "v" and row["quarantined_records"] == 1
    winner = min((received("v", "acme", 10), received("v", "initech", 10, seq=1)), key=canon)
    assert row["kept_tenant_id"] == winner["tenant_id"]
    assert row["quarantined_tenant_ids"] == ["acme" if winner["tenant_id"] == "initech" else "initech"]
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT request_id, tenant_id FROM requests ORDER BY 1").fetchall() == [
            ("v", winner["tenant_id"]), ("w", "acme")]
        (detail,) = con.execute("SELECT detail FROM quarantine").fetchone() or ("",)
    finally:
        con.close()
    assert detail.startswith("received of a request id received with another tenant_id at file ")
    assert "acme" not in detail and "initech" not in detail  # a detail holds no record's values


def test_a_repeat_of_a_losing_record_goes_with_it_and_comes_back_with_it(tmp_path: Path) -> None:
    """The losing record's byte-for-byte repeat is quarantined with it; when a later file's winner
    agrees with them, the record comes back to records and its repeat to duplicates."""
    loser = received("v", "acme", 10)  # "router" sorts after "engine"
    rival = received("v", "initech", 10, seq=1)
    winner = received("v", "acme", 10, node="engine")
    assert canon(winner) < canon(rival) < canon(loser)
    first = [write_jsonl(tmp_path / "1.jsonl", [loser, loser]), write_jsonl(tmp_path / "2.jsonl", [rival])]
    r1 = forensics.ingest(first, tmp_path / "case.duckdb")
    assert r1.records.as_dict() == {"read": 3, "ingested": 1, "duplicates": 0, "quarantined": 2}
    r2 = forensics.ingest([write_jsonl(tmp_path / "3.jsonl", [winner])], tmp_path / "case.duckdb")
    assert r2.records.as_dict()["ingested"] == 1
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    try:
        counts = dict(con.execute("SELECT path[-7:], read::VARCHAR || '/' || ingested || '/' || duplicates || '/' "
                                  "|| quarantined FROM file_counts").fetchall())
    finally:
        con.close()
    assert counts == {"1.jsonl": "2/1/1/0", "2.jsonl": "1/0/0/1", "3.jsonl": "1/1/0/0"}
    kept, lost, _ = outcome(tmp_path / "case.duckdb")
    assert kept == [("engine", "v", "acme", 10), ("router", "v", "acme", 10)]
    assert lost == [("router", "v", "initech", 10)]


@st.composite
def claims(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Received records of a few ids, from a few nodes, naming a few tenants and lengths, with
    repeats, and other records of the same ids beside them."""
    out = []
    for _ in range(draw(st.integers(1, 14))):
        rid = draw(st.sampled_from(["a", "b", "c"]))
        if draw(st.integers(0, 5)) == 0:
            out.append({"kind": "request", "ts": TS, "node": "decode-0", "request_id": rid, "event": "admitted"})
            continue
        rec = received(rid, draw(st.sampled_from(["acme", "initech", "umbrella"])), draw(st.sampled_from([7, 9])),
                       node=draw(st.sampled_from(["router", "prefill-0", "engine"])))
        out.append(rec)
        if draw(st.booleans()):
            out.append(dict(reversed(list(rec.items()))))  # the same record, keys in another order
    return out


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(records=claims(), seed=st.integers(0, 2**32))
def test_any_split_and_order_of_files_ends_as_the_brute_force_says(
    records: list[dict[str, Any]], seed: int, tmp_path_factory: pytest.TempPathFactory,
) -> None:
    want_kept, want_lost = oracle([r for r in records if r["event"] == "received"])
    tmp = tmp_path_factory.mktemp("received")
    ends = []
    for attempt in range(2):
        rng = random.Random(seed + attempt)
        shuffled = records[:]
        rng.shuffle(shuffled)
        n = rng.randint(1, 4)
        parts = [p for p in (shuffled[i::n] for i in range(n)) if p]
        assume(len({json.dumps(p) for p in parts}) == len(parts))  # identical files are one piece of evidence
        files = [write_jsonl(tmp / str(attempt) / f"{i}.jsonl", p) for i, p in enumerate(parts)]
        rng.shuffle(files)
        # one run, or file by file in runs of their own (a later run can turn an earlier one over)
        if rng.random() < 0.5:
            result = forensics.ingest(files, tmp / str(attempt) / "case.duckdb")
            read = result.records.read
            assert read == result.records.ingested + result.records.duplicates + result.records.quarantined
        else:
            for f in files:
                forensics.ingest([f], tmp / str(attempt) / "case.duckdb")
        kept, lost, q = outcome(tmp / str(attempt) / "case.duckdb")
        assert sorted(k for k in kept if k[2] is not None) == want_kept
        assert lost == want_lost
        con = duckdb.connect(str(tmp / str(attempt) / "case.duckdb"), read_only=True)
        try:
            totals = con.execute("SELECT sum(read), sum(ingested), sum(duplicates), sum(quarantined) "
                                 "FROM file_counts").fetchone()
        finally:
            con.close()
        assert totals is not None and totals[0] == sum(totals[1:])
        ends.append((kept, q, totals))
    assert ends[0] == ends[1]


def test_a_case_written_before_the_table_opens_read_only_with_no_conflict(tmp_path: Path) -> None:
    """A case of this schema written before received_conflicts existed (dropped here) opens
    read-only, its findings run, and the new finding has nothing to say; the file is not written."""
    db = tmp_path / "case.duckdb"
    forensics.investigate([write_jsonl(tmp_path / "a.jsonl", [received("v", "acme", 10)])], db)
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE received_conflicts")
    con.close()
    before = db.read_bytes()
    with forensics.Case(db, read_only=True) as case:
        assert "evidence.request_id_conflict" not in {f.id for f in case.findings()}
    assert db.read_bytes() == before
