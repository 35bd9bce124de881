"""Records lost in a node's seq (a gap): what the page records still prove, and what they do not.

Held to the page records of a generator that shares no code with the toolkit
(tests/independent_logs.py), before records are taken out: a victim the page records name across
lost records is possible, never certain; a request whose decode records were lost is counted as
not known, never as not exposed; and what the figures say is not ruled out is what the rows list."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from independent_logs import Layout, generate

import forensics
from forensics.case import Case
from forensics.exposure.tiers import gap_request_rows
from forensics.store import connect
from kvforensics.job import run
from kvforensics.story import _notes, verdict


def _truth(full: Path, db: Path) -> set[tuple[str, str]]:
    """The (reader, victim) pairs of delivered responses the full page records name."""
    forensics.investigate([full], db)
    with Case(db) as case:
        return {(r["reader_request"], r["victim_request"]) for r in case.exposures(delivered_only=True).to_dicts()}


def test_a_victim_named_across_lost_records_is_possible_never_certain(tmp_path: Path) -> None:
    """A reader saw a victim's pages; before that, the victim had overwritten another request's data
    there. With the victim's write records lost (six seq gaps), the page records show the earlier
    writer's data read: a wrong victim. Before, two wrong victims were named certain; now each is
    possible, its note saying records are missing between the write and the read. Every certain row
    is true."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=Layout())
    truth = _truth(full, tmp_path / "truth.duckdb")
    with Case(tmp_path / "truth.duckdb") as case:
        reader, victim, node, first_seq = case.sql("""
            SELECT e.reader_request, e.victim_request, e.node, e.first_seq FROM exposures e
            JOIN page_writes w ON w.node = e.node AND w.boot = e.boot AND w.request_id = e.victim_request
             AND w.seq < e.first_seq
            WHERE e.reader_delivered AND EXISTS (
              SELECT 1 FROM page_writes p WHERE p.node = w.node AND p.boot = w.boot AND p.seq < w.seq
                AND p.request_id <> w.request_id AND p.lo <= w.hi AND p.hi >= w.lo)
            ORDER BY e.first_seq, e.reader_request, e.victim_request LIMIT 1""").row(0)
    path = full / f"{node}.jsonl"

    def lost(line: str) -> bool:
        record = json.loads(line)
        return (record["kind"], record.get("op"), record.get("request_id")) == ("kv", "write", victim) \
            and record["seq"] < first_seq

    lines = path.read_text().splitlines(keepends=True)
    assert sum(map(lost, lines)) > 1
    path.write_text("".join(line for line in lines if not lost(line)))
    forensics.investigate([full], tmp_path / "gapped.duckdb")
    with Case(tmp_path / "gapped.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
        certainty = case.summary().certainty
    wrong = [r for r in rows if (r["reader_request"], r["victim_request"]) not in truth]
    assert wrong and reader in {r["reader_request"] for r in wrong}
    assert all(r["certainty"] == "possible" and r["certainty_note"].startswith("records missing (seq gap")
               for r in wrong)
    assert all((r["reader_request"], r["victim_request"]) in truth for r in rows if r["certainty"] == "certain")
    assert certainty is not None and certainty["victim_requests"]["possible"] > 0


@pytest.mark.parametrize("layout", [Layout(), Layout(capped_prompt_pages=2000)], ids=["plain", "capped pool"])
def test_where_a_nodes_records_are_lost_every_true_reader_is_named_or_said_not_known(
        tmp_path: Path, layout: Layout) -> None:
    """A third of decode-0's records (every kind) lost in the middle of its log. The replay cannot
    fill what the node's own request records no longer say: 45 true (reader, victim) pairs (70 with
    the capped pool) are in no row. The requests other nodes place on decode-0 then, with no
    ``decode_started`` left there, are counted as not known (the verdict, the notes, ``--json``): each
    true pair missing from the rows is one of theirs, or has one of them as its victim and a reader
    whose victims the rows say are in doubt across the gap. Every certain row is true. And the pairs the
    figures say are not ruled out are those the rows list: before, with the capped pool (its replay
    cannot follow decode-0's logs), 337 were said not ruled out and none was listed (the fill takes
    no row outside the window, where the page records name the victims)."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=layout)
    truth = _truth(full, tmp_path / "truth.duckdb")
    path = full / "decode-0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:len(lines) * 3 // 10] + lines[len(lines) * 6 // 10:]))
    found = run([full], tmp_path / "gapped.duckdb", None)
    with Case(tmp_path / "gapped.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
    con = connect(tmp_path / "gapped.duckdb", read_only=True, create=False)
    try:
        lost = gap_request_rows(con)
    finally:
        con.close()
    named = {(r["reader_request"], r["victim_request"]) for r in rows}
    assert all((r["reader_request"], r["victim_request"]) in truth for r in rows if r["certainty"] == "certain")
    # every true pair the rows miss is a lost request's, or a reader's whose victims the rows say are
    # in doubt across the gap, the true victim one of the lost requests (whose writes went with the gap)
    ids = {rid for rid, _, _ in lost}
    doubted = {r["reader_request"] for r in rows if (r["certainty_note"] or "").startswith("records missing")}
    missed = truth - named
    assert missed and all(reader in ids or (reader in doubted and victim in ids) for reader, victim in missed)
    assert {reader for reader, _ in missed} & ids and {reader for reader, _ in missed} - ids <= doubted
    assert found.gap_requests.requests == len(lost)
    assert found.gap_requests.no_finish == sum(1 for _, _, no_finish in lost if no_finish) > 0
    assert found.as_dict()["gap_requests"] == found.gap_requests.as_dict()
    said = verdict(found, [])
    assert f"records are missing in seq gaps, where {found.gap_requests.requests} requests decoded" in said
    assert any(line.startswith("records are missing in seq gaps (finding evidence.seq_gap)") for line in _notes(found))
    assert found.filled is not None
    listed = {(r["reader_request"], r["victim_request"]) for r in rows
              if (r["certainty_note"] or "").startswith("not ruled out")}
    assert found.filled.not_ruled_out == len(listed)
