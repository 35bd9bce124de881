"""Records lost in a node's seq (a gap): what the page records still prove, and what they do not.

Held to the page records of a generator that shares no code with the toolkit
(tests/independent_logs.py), before records are taken out: a victim the page records name across
lost records is possible, never certain; a request whose decode records were lost is counted as
not known, never as not exposed; and what the figures say is not ruled out is what the rows list."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from independent_logs import Layout, generate
from typer.testing import CliRunner

import forensics
from forensics.case import Case
from forensics.exposure.tiers import LOST_KINDS, lost_record_list, lost_record_rows
from forensics.store import connect
from kvforensics.cli import app
from kvforensics.job import run
from kvforensics.story import _notes, verdict


def _not_known(report: Path) -> list[dict]:
    """The rows of the list of requests the records leave unknown, beside ``report``."""
    return pq.read_table(report.with_name(f"{report.stem}-lists") / "not_known.parquet").to_pylist()


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


#: Which of decode-0's records are lost: a third in the middle (a seq gap), or its log cut short.
CUTS = {"a gap": (3, 6), "the log's start cut off": (0, 3), "the log's end cut off": (7, 10), "the whole log": (0, 10)}


@pytest.mark.parametrize(("layout", "cut"), [(Layout(), "a gap"), (Layout(capped_prompt_pages=2000), "a gap"),
                                             (Layout(), "the log's start cut off"),
                                             (Layout(), "the log's end cut off"), (Layout(), "the whole log")],
                         ids=["plain, a gap", "capped pool, a gap", "plain, start cut off", "plain, end cut off",
                              "plain, the whole log"])
def test_where_a_nodes_records_are_lost_every_true_reader_is_named_or_said_not_known(
        tmp_path: Path, layout: Layout, cut: str) -> None:
    """A third of decode-0's records (every kind) lost: in the middle of its log, or at either end;
    or all of them (its log not given: the node is in no record of the case but others').
    The replay cannot fill what the node's own request records no longer say: 45 true (reader,
    victim) pairs (70 with the capped pool) are in no row, and before, nothing said so. The requests
    other nodes place on decode-0 with no ``decode_started`` left there are counted as not known
    (the verdict, the notes, ``--json``): each true pair missing from the rows is one of theirs, or
    has one of them as its victim and a reader whose victims the rows say are in doubt across the
    gap. Every certain row is true. And the pairs the figures say are not ruled out are those the
    rows list: before, with the capped pool (its replay cannot follow decode-0's logs), 337 were said
    not ruled out and none was listed (the fill takes no row outside the window, where the page
    records name the victims)."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=layout)
    truth = _truth(full, tmp_path / "truth.duckdb")
    path = full / "decode-0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lo, hi = CUTS[cut]
    path.write_text("".join(lines[:len(lines) * lo // 10] + lines[len(lines) * hi // 10:]))
    found = run([full], tmp_path / "gapped.duckdb", tmp_path / "report.html")
    with Case(tmp_path / "gapped.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
        summary = case.summary()
    con = connect(tmp_path / "gapped.duckdb", read_only=True, create=False)
    try:
        lost = lost_record_rows(con)
    finally:
        con.close()
    named = {(r["reader_request"], r["victim_request"]) for r in rows}
    assert all((r["reader_request"], r["victim_request"]) in truth for r in rows if r["certainty"] == "certain")
    # every true pair the rows miss is a request's whose decode records are lost; or a reader's whose
    # victims the rows say are in doubt across the gap, the true victim one of those requests; or a
    # reader's that read pages never written in what remains after the gap (the start cut off); or one
    # whose finish went with the records (the end cut off)
    ids = {r["request_id"] for r in lost["missing_decodes"]}
    blind = {r["request_id"] for r in lost["blind_readers"]}
    unfinished = {r["request_id"] for r in lost["unfinished_readers"]}
    doubted = {r["reader_request"] for r in rows if (r["certainty_note"] or "").startswith("records missing")}
    missed = truth - named
    assert missed and all(reader in ids | blind | unfinished or (reader in doubted and victim in ids)
                          for reader, victim in missed)
    told = found.lost_records
    # (a decode-0 with a gap, or a router's finish logged: lost, none said not started)
    assert (told.requests, told.blind_readers, told.unfinished_readers, told.unstarted) == (
        len(ids), len(blind), len(unfinished), 0)
    assert told.no_finish == sum(1 for r in lost["missing_decodes"] if r["no_finish"])
    assert told.any and set(told.nodes) <= {"decode-0"}
    assert found.as_dict()["lost_records"] == told.as_dict() and summary.lost_records == told
    assert "<p>Records are missing: " in summary._repr_html_()
    html = " ".join((tmp_path / "report.html").read_text().split())
    assert "<b>Records are missing</b>" in html
    assert f"{told.requests} requests that other nodes&#39; records place on decode-0 have no record of their" in html
    # every request counted is named beside the report, with what is not known of it (before: counted only)
    listed_unknown = _not_known(tmp_path / "report.html")
    finishes = {r["request_id"]: r["no_finish"] for r in lost["missing_decodes"]}
    assert sorted((r["request_id"], r["what"]) for r in listed_unknown) == sorted(
        [(rid, LOST_KINDS["missing_decodes"]) for rid in ids]
        + [(rid, LOST_KINDS[part]) for part in ("blind_readers", "unfinished_readers", "in_flight_readers")
           for rid in {r["request_id"] for r in lost[part]}])
    assert all(r["node"] == "decode-0" and r["delivered"] == ("not known" if finishes[r["request_id"]] else "yes")
               for r in listed_unknown if r["what"] == LOST_KINDS["missing_decodes"])
    assert f"Requests the records leave unknown ({len(listed_unknown)})" in html
    with Case(tmp_path / "gapped.duckdb") as case:  # (the notebook's: the same rows, ids as logged)
        assert case.not_known().to_dicts() == listed_unknown
    if cut == "the whole log":  # every request decode-0 decoded is counted: the node is in no record of its own
        with Case(tmp_path / "truth.duckdb") as case:
            decoded = set(case.sql("SELECT request_id FROM records WHERE kind = 'request' AND "
                                   "event = 'decode_started' AND node = 'decode-0'")["request_id"])
        assert decoded and decoded <= ids
    said = verdict(found, [])
    assert "; records are missing: " in said and not said.startswith("Not exposed")
    assert any(line.startswith("records are missing (a seq gap, a node's log cut short") for line in _notes(found))
    listed = {(r["reader_request"], r["victim_request"]) for r in rows
              if (r["certainty_note"] or "").startswith("not ruled out")}
    assert (found.filled.not_ruled_out if found.filled is not None else 0) == len(listed)
    # (a gap in the middle, or the start cut off, is a seq gap; the end cut off is none)
    gapped = cut in ("a gap", "the log's start cut off")
    assert (found.filled.gap_windows if found.filled is not None else 0) == gapped


@pytest.mark.parametrize("logs", ["generated", "glm53-incident", "glm53-incident-sglang", "the router's alone"])
def test_on_complete_logs_no_decode_is_said_missing(tmp_path: Path, logs: str) -> None:
    """Every request other nodes place on a decode node has its decode_started there: none is said
    not known, on the generator's logs (capped pool: over-long prompts, failures) and on the shipped
    sample incident, canonical and as SGLang printed it (its prefill's transfer records name no
    decode node: 'unknown', no node of the case). A case of the router's log alone holds no node's
    decode records: the decode nodes it names are not said to have lost theirs."""
    root = Path(__file__).parents[2] / "sample_logs"
    source = generate(tmp_path / "full", seed=12, requests=200, layout=Layout(capped_prompt_pages=2000)) \
        if logs == "generated" else root / "glm53-incident" / "router.jsonl" if logs == "the router's alone" \
        else root / logs
    forensics.investigate([source], tmp_path / "case.duckdb")
    con = connect(tmp_path / "case.duckdb", read_only=True, create=False)
    try:
        assert lost_record_rows(con) == {"missing_decodes": [], "blind_readers": [], "unfinished_readers": [],
                                         "in_flight_readers": []}
        assert lost_record_list(con) == []
        assert (con.execute("SELECT count(*) FROM records WHERE kind = 'request' AND event = 'decode_started'"
                            ).fetchall()[0][0] > 0) == (logs != "the router's alone")
    finally:
        con.close()


def _cut_at(logs: Path, fraction: float) -> tuple[set[str], set[tuple[str, str]], set[tuple[str, str]]]:
    """Every file of ``logs`` cut at one moment, the ``fraction`` of the way through all their
    records (logs collected while the deployment served); the requests with a finish left, the
    (request, node) pairs other nodes place on a node (a completed transfer's ``dst_node``, the
    router's ``decode_node``) and those with a ``decode_started`` left, read from the cut files."""
    moments = sorted(json.loads(line)["ts"] for f in logs.glob("*.jsonl") for line in f.read_text().splitlines())
    end = moments[int(len(moments) * fraction)]
    finished: set[str] = set()
    placed: set[tuple[str, str]] = set()
    started: set[tuple[str, str]] = set()
    for f in sorted(logs.glob("*.jsonl")):
        kept = [line for line in f.read_text().splitlines(keepends=True) if json.loads(line)["ts"] <= end]
        for r in map(json.loads, kept):
            event = r.get("event")
            finished |= {r["request_id"]} if event == "finished" else set()
            started |= {(r["request_id"], r["node"])} if event == "decode_started" else set()
            placed |= {(r["request_id"], r["dst_node"])} if r["kind"] == "transfer" and event == "completed" else set()
            placed |= {(r["request_id"], r["decode_node"])} if r.get("decode_node") else set()
        f.write_text("".join(kept))
    return finished, placed, started


@pytest.mark.parametrize("fraction", [0.2, 0.35, 0.65, 0.8, 0.9])
def test_logs_cut_at_one_moment_lose_nothing_and_say_what_had_not_started(tmp_path: Path, fraction: float) -> None:
    """Every node's log cut at one moment: no record is lost (each file holds all it logged until
    then), so nothing may be said missing. Before, at 5 of 19 such cuts of this set, a request the
    router had sent to a decode node that had not started it yet was said "decoded with no record of
    it left" and the verdict said not known. Such requests are counted apart (``unstarted``), as
    many as the cut files' own lines give: placed on a node, no decode_started there, no finish."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=Layout())
    finished, placed, started = _cut_at(full, fraction)
    found = run([full], tmp_path / "cut.duckdb", tmp_path / "report.html")
    told = found.lost_records
    assert not told.lost and (told.requests, told.blind_readers, told.unfinished_readers) == (0, 0, 0)
    unstarted = {rid for rid, node in placed - started if rid not in finished}
    assert unstarted and told.unstarted == len(unstarted)  # (one at each of these cuts)
    said = verdict(found, [])
    assert "records are missing" not in said and not any("records are missing" in line for line in _notes(found))
    assert any(line.startswith(f"{len(unstarted)} request") and "no decode_started there" in line
               for line in _notes(found))
    html = " ".join((tmp_path / "report.html").read_text().split())
    assert "<b>Records are missing</b>" not in html
    assert "not started decoding there where the logs end" in html
    listed_unknown = _not_known(tmp_path / "report.html")
    assert {r["request_id"] for r in listed_unknown if r["what"] == LOST_KINDS["unstarted"]} == unstarted
    assert all(r["delivered"] == "not known" for r in listed_unknown if r["what"] == LOST_KINDS["unstarted"])


def test_a_reader_in_flight_where_the_logs_end_is_said_not_known_delivered(tmp_path: Path) -> None:
    """Every node's log cut at one moment, as logs collected while the deployment served: a reader of
    other requests' pages whose finish comes after is counted contained (log-schema.md: not
    delivered), though the whole logs show it delivered. Before, the report called it an exposure
    "stopped before delivery" and a case of no other reader was said not exposed; now it is counted
    apart, from the cut files' own finish lines, and its delivery is said not known."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=Layout())
    forensics.investigate([full], tmp_path / "full.duckdb")
    with Case(tmp_path / "full.duckdb") as case:
        delivered = set(case.sql("SELECT request_id FROM requests WHERE delivered")["request_id"])
    moments = sorted(json.loads(line)["ts"] for f in full.glob("*.jsonl") for line in f.read_text().splitlines())
    end = moments[len(moments) // 2]
    finished = set()
    for f in full.glob("*.jsonl"):
        kept = [line for line in f.read_text().splitlines(keepends=True) if json.loads(line)["ts"] <= end]
        finished |= {r["request_id"] for r in map(json.loads, kept) if r.get("event") == "finished"}
        f.write_text("".join(kept))
    found = run([full], tmp_path / "cut.duckdb", tmp_path / "report.html")
    with Case(tmp_path / "cut.duckdb") as case:
        readers = set(case.sql("SELECT DISTINCT reader_request FROM exposures")["reader_request"])
        summary = case.summary()
    in_flight = readers - finished
    assert in_flight and in_flight <= delivered  # (counted contained here, delivered in the whole logs)
    told = found.lost_records
    assert told.in_flight_readers == len(in_flight) == summary["contained_requests"]
    assert not told.lost and told.any and summary.lost_records == told
    assert found.as_dict()["lost_records"]["in_flight_readers"] == len(in_flight)
    assert {r["request_id"] for r in _not_known(tmp_path / "report.html")
            if r["what"] == LOST_KINDS["in_flight_readers"]} == in_flight
    said = verdict(found, [])
    assert "no finish in the logs (in flight when they end" in said and not said.startswith("Not exposed")
    assert not any(line.startswith("records are missing") for line in _notes(found))
    assert any("no finish in the logs" in line for line in _notes(found))
    assert "<p>Delivery not known: " in summary._repr_html_()
    html = " ".join((tmp_path / "report.html").read_text().split())
    assert "<b>Delivery not known</b>" in html and "<b>Records are missing</b>" not in html


def test_the_requests_left_unknown_are_listed_escaped_and_safe_for_a_spreadsheet(tmp_path: Path) -> None:
    """A request whose decode records are lost, its id markup and a spreadsheet formula: the report
    names it in its table of requests the records leave unknown escaped (no tag of it in the HTML),
    and its list beside the report starts its cell with an apostrophe in the CSV, the id as logged in
    the Parquet."""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=Layout())
    path = full / "decode-0.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:len(lines) * 3 // 10] + lines[len(lines) * 6 // 10:]))
    forensics.investigate([full], tmp_path / "probe.duckdb")
    con = connect(tmp_path / "probe.duckdb", read_only=True, create=False)
    try:
        victim = lost_record_rows(con)["missing_decodes"][0]["request_id"]
    finally:
        con.close()
    hostile = '=HYPERLINK("x")<img src=x onerror=alert(1)>'
    for f in full.glob("*.jsonl"):
        f.write_text(f.read_text().replace(f'"{victim}"', json.dumps(hostile)))
    run([full], tmp_path / "case.duckdb", tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert hostile in [r["request_id"] for r in _not_known(tmp_path / "report.html")]
    csv = (tmp_path / "report-lists" / "not_known.csv").read_text()
    assert "'=HYPERLINK" in csv and '\n"=HYPERLINK' not in csv and "\n=HYPERLINK" not in csv
    # the terminal's: every row as JSON, the same as the report's list; as CSV, the cell neutralised
    runner = CliRunner()
    listed = runner.invoke(app, ["not-known", "--db", str(tmp_path / "case.duckdb"), "--format", "json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == _not_known(tmp_path / "report.html")
    as_csv = runner.invoke(app, ["not-known", "--db", str(tmp_path / "case.duckdb"), "--format", "csv"])
    assert as_csv.exit_code == 0 and "'=HYPERLINK" in as_csv.stdout
    # a regulator's report names them too, by ordinal: the id is nowhere in it nor in its list
    ruled = runner.invoke(app, ["report", "--db", str(tmp_path / "case.duckdb"), "--out",
                                str(tmp_path / "regulator.html"), "--audience", "regulator"])
    assert ruled.exit_code == 0
    pseudonymous = _not_known(tmp_path / "regulator.html")
    assert len(pseudonymous) == len(_not_known(tmp_path / "report.html"))
    assert all(r["request_id"].startswith("request ") for r in pseudonymous)
    assert "HYPERLINK" not in (tmp_path / "regulator.html").read_text()
    assert not any("HYPERLINK" in str(v) for r in pseudonymous for v in r.values())
    whole = generate(tmp_path / "whole", seed=12, requests=50, layout=Layout())
    forensics.investigate([whole], tmp_path / "whole.duckdb")
    none = runner.invoke(app, ["not-known", "--db", str(tmp_path / "whole.duckdb")])
    assert none.exit_code == 0 and none.stdout.startswith("none: no record is missing")
