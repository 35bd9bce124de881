"""SGLang deployments as they really run, printed by the releases' own code (tests/adapters/releases/).

- ``json-rotated`` (0.5.8, 0.5.23): the scripted run with its ``--log-requests-target`` files
  rolled over by SGLang's own ``TimedRotatingFileHandler`` on the run's clock and the older
  pieces gzipped (SOURCE.json ``rotated``);
- ``hostile-*`` (0.5.11 JSON at ``--log-requests-level 2``, 0.5.23 text at level 3): no client
  rid (each server assigns its own), prompts and outputs that look like log lines, with quotes,
  CR/LF, NUL, ANSI escapes, Unicode line separators and one ~150 KB output (SOURCE.json
  ``hostile``);
- ``text-reuse`` (0.5.11, 0.5.18, 0.5.20, 0.5.23): the investigation of the server logs alone, no
  option, of a run whose long first request left its pages on the over-long prompt's decode pool,
  with the replay that confirms it against what counting alone says it must find (SOURCE.json
  ``reuse``);
- the servers' own requests: the batched start-up warmup of releases before 0.5.18 (0.5.5 to
  0.5.12, every set) and periodic health checks (the reuse and hostile runs).

What each request should become comes from SOURCE.json's scenarios, not from the adapter.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_sglang_releases import ROOT, _rows, _source, assert_as_scripted, retractions

import forensics
from forensics.adapters.sglang.eras import RELEASES

ROTATED = [r for r in ("0.5.8", "0.5.23") if "rotated" in _source(r)]
HOSTILE = [(r, s["folder"]) for r in ("0.5.11", "0.5.23") for s in _source(r).get("hostile", {}).get("sets", [])]
#: What a case says of its requests: compared between two ways of giving it the same lines
KEPT = ("kind, node, boot, ts, request_id, event, status, finish_reason, reason, tokens, prompt_tokens, "
        "output_tokens, transfer_id, src_node, dst_node")


def _case(paths: list[Path], case: Path) -> tuple[duckdb.DuckDBPyConnection, Any, dict[str, Any]]:
    found = forensics.investigate(paths, case)
    with forensics.Case(case) as c:
        findings = {f.id: f for f in c.findings()}
    return duckdb.connect(str(case), read_only=True), found, findings


def _unrotated(folder: Path, out: Path) -> Path:
    """A copy of ``folder`` whose target folders hold one file each: the rotated pieces, gunzipped,
    and the current one, end to end in the order the handler wrote them (what the target would
    be had it never rotated)."""
    shutil.copytree(folder, out)
    for target in (p for p in out.iterdir() if p.is_dir()):
        pieces = sorted(target.iterdir(), key=lambda p: (p.name.endswith(".log"), p.name))
        current = next(p for p in pieces if p.name.endswith(".log"))
        whole = b"".join(gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes() for p in pieces)
        for p in pieces:
            p.unlink()
        current.write_bytes(whole)
    return out


@pytest.mark.parametrize("release", ROTATED)
def test_target_files_rotated_by_sglang_and_gzipped_read_as_the_unrotated_target(release: str,
                                                                                tmp_path: Path) -> None:
    """0.5.8 (bare JSON lines) and 0.5.23 (``[time] {...}``): each server's target folder holds
    the pieces SGLang's handler named (``HOST_RANK.log.YYYY-MM-DD_HH``, the oldest gzipped) and
    the current file. Ingested as found, each piece is paired to its server's log (its node, its
    role), none is quarantined and no request line counts twice: the case holds exactly what
    the same target unrotated gives, and what the scripted run did with each request."""
    source = _source(release)
    rotated = source["rotated"]
    folder = ROOT / release / rotated["folder"]
    for node, names in rotated["pieces"].items():
        assert sorted(p.name for p in (folder / node).iterdir()) == sorted(names)
        assert sum(n.endswith(".gz") for n in names) >= 1 and len(names) >= 3, names
    con, found, findings = _case([folder], tmp_path / "rotated.duckdb")
    assert found.ingest.records.quarantined == 0 and found.ingest.records.duplicates > 0  # (the TP ranks' lines)
    assert_as_scripted(con, findings, source, rotated["scenario"], release)
    notes = {k for (k,) in con.execute("SELECT DISTINCT key FROM file_notes").fetchall()}
    assert "server" in notes and "role" not in notes  # (every piece read with its server's log)
    got = sorted(map(str, con.execute(f"SELECT {KEPT} FROM records").fetchall()))
    counts = (found.ingest.records.read, found.ingest.records.ingested, found.ingest.records.duplicates)
    con.close()

    whole, found_whole, _ = _case([_unrotated(folder, tmp_path / "whole")], tmp_path / "whole.duckdb")
    assert sorted(map(str, whole.execute(f"SELECT {KEPT} FROM records").fetchall())) == got
    assert (found_whole.ingest.records.read, found_whole.ingest.records.ingested,
            found_whole.ingest.records.duplicates) == counts
    whole.close()


def _hostile(release: str) -> dict[str, Any]:
    return _source(release)["hostile"]


@pytest.mark.parametrize(("release", "folder"), HOSTILE, ids=[f"{r}-{f}" for r, f in HOSTILE])
def test_user_text_that_looks_like_log_lines_gives_no_request_time_or_event(release: str, folder: str,
                                                                              tmp_path: Path) -> None:
    """No client rid, the prompt and output text logged (0.5.11 JSON target files at level 2,
    cut to 2,048 characters; 0.5.23 text at level 3, a 150 KB output whole): text holding fake
    receive, finish, time-stats, server_args, pool, KV pool layout, length, integrity and
    transfer-failure lines naming the other requests' rids and rooms, at times in 2031, with quotes, CR/LF, NUL, ANSI
    and Unicode line separators. No genuine line is quarantined; the requests are the run's,
    named by their rooms; each has exactly its own events, at the run's times; the configs are
    the servers' own; no finding rests on the fake lines."""
    source, hostile = _source(release), _hostile(release)
    con, found, findings = _case([ROOT / release / folder], tmp_path / "case.duckdb")
    assert found.ingest.records.quarantined == 0
    room = {s["name"]: f"room-{s['bootstrap_room']}" for s in hostile["scenario"]}
    requests = {r["request_id"]: r for r in _rows(con, "SELECT * FROM requests")}
    assert set(requests) == set(room.values())  # (no rid of the text's, no req-a1, no server rid left)

    # every record at the run's times (the text's are in 2031), every event once on its node
    epoch = forensics_epoch(con)
    assert all(0 <= (r["ts"] - epoch).total_seconds() < 400 for r in _rows(con, "SELECT ts FROM records"))
    events = _rows(con, "SELECT * FROM request_events ORDER BY ts")
    keys = [(e["request_id"], e["node"], e["event"]) for e in events]
    assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1]
    transfers = _rows(con, "SELECT * FROM transfers")

    def on(name: str, event: str) -> list[tuple[str, Any]]:
        return [(e["node"], e["status"] if event == "finished" else e["reason"]) for e in events
                if e["request_id"] == room[name] and e["event"] == event]

    over_long = source["over_long_prompt"]
    for s in hostile["scenario"]:
        name, decode = s["name"], f"decode-0.dp{s['decode_dp_rank']}"
        sent = sorted((t["node"], t["event"], t["tokens"]) for t in transfers if t["request_id"] == room[name])
        if s["outcome"] == "served":
            assert sent == [(decode, "completed", None), ("prefill-0", "completed", s["prompt_tokens"])], name
            assert on(name, "finished") == [(decode, 200)] and on(name, "rejected") == []
            assert requests[room[name]]["delivered"] and requests[room[name]]["prompt_tokens"] == s["prompt_tokens"]
        elif s["outcome"] == "transfer_failed":  # its own failure only: no checksum, room or length abort
            assert sent == [(decode, "failed", None), ("prefill-0", "failed", None)], name
            assert on(name, "finished") == [(decode, 500)] and on(name, "rejected") == [
                ("prefill-0", "kv_transfer_failed")]
            assert [e["finish_reason"] for e in events if e["request_id"] == room[name]
                    and e["event"] == "finished"] == ["kv_transfer_failed"]
        elif s["outcome"] == "over_context":
            assert sorted(on(name, "rejected")) == [("decode-0", "input_too_long"), ("prefill-0", "input_too_long")]
            assert sent == [] and not requests[room[name]]["delivered"]
        else:  # over_pool: as the release does it
            assert on(name, "rejected") == [("prefill-0", "input_too_long")]
            assert requests[room[name]]["delivered"] == (over_long == "sent"), name

    configs = _rows(con, "SELECT node, boot, role, pool_pages, context_length, page_size FROM configs")
    assert sorted((c["node"], c["boot"]) for c in configs) == [("decode-0.dp0", 0), ("decode-0.dp1", 0),
                                                               ("prefill-0", 0)]
    assert {(c["context_length"], c["page_size"]) for c in configs} == {(source["context_length"],
                                                                          source["page_size"])}
    docs = [json.loads(doc) for (doc,) in con.execute("SELECT doc FROM config_records").fetchall()]
    assert [(d["hybrid_pool"], d["recurrent_state"]) for d in docs] == [(False, False)] * 3  # (the text's layout lines)
    assert "integrity.engine_caught_corruption" not in findings
    stubbed = findings.get("handoff.rejected_but_transferred")
    pool = next(s for s in hostile["scenario"] if s["outcome"] == "over_pool")
    assert ({r["request_id"] for r in stubbed.evidence.to_dicts()} if stubbed else set()) == (
        {room[pool["name"]]} if over_long == "sent" else set())
    con.close()


def forensics_epoch(con: duckdb.DuckDBPyConnection) -> Any:
    """The run's start: the first server_args line's time (the run's epoch)."""
    (at,) = con.execute("SELECT min(ts) FROM configs").fetchone() or (None,)
    return at


def test_user_text_is_printed_only_when_asked(tmp_path: Path) -> None:
    """0.5.23's hostile set at level 3: what investigate, findings, quarantine and request print
    holds none of the users' text (nor its ANSI escapes, nor its 2031 times); ``request
    --show-content`` prints it, as it says it may."""
    from typer.testing import CliRunner

    from kvforensics.cli import app

    hostile = _hostile("0.5.23")
    folder = ROOT / "0.5.23" / next(s["folder"] for s in hostile["sets"] if s["log_requests_level"] == 3)
    mark = hostile["user_mark"]
    assert any(len(t) > 150_000 for t in (folder / "decode-0.log").read_text().splitlines())
    db = tmp_path / "case.duckdb"
    served = next(s for s in hostile["scenario"] if s["name"] == "evil-long")
    runner = CliRunner()
    printed = []
    for args in (["investigate", str(folder), "--db", str(db)], ["findings", "--db", str(db)],
                 ["quarantine", "--db", str(db)], ["request", f"room-{served['bootstrap_room']}", "--db", str(db)]):
        done = runner.invoke(app, args)
        assert done.exit_code == 0, (args, done.output)
        printed.append(done.output)
    for out in printed:
        assert mark not in out and "\x1b" not in out and "2031-01-01" not in out
    asked = runner.invoke(app, ["request", f"room-{served['bootstrap_room']}", "--db", str(db), "--show-content"])
    assert asked.exit_code == 0 and mark in asked.output


#: One release of each era the adapters read differently (bare request lines and ``start=``;
#: ``ReqTimeStats(`` with ``attempts=``, the stub still sent; the stub aborted after its forward;
#: the prompt retired at intake, the pool warning)
ERAS = ("0.5.11", "0.5.18", "0.5.20", "0.5.23")
#: A text finish line of a request the server sent itself (bootstrap host 2.2.2.2): its prompt and output
OWN_FINISH = re.compile(r"Finish: obj=.*bootstrap_host='2\.2\.2\.2'.*'prompt_tokens': (\d+), "
                        r"'completion_tokens': (\d+)")


def _pages_truth(source: dict[str, Any], run: dict[str, Any], decode_log: str) -> dict[str, Any]:
    """What the run did with the over-long prompt's decode pool, by counting alone (no replay):
    the requests that ran on that pool before it, the one of them that wrote the most (its whole
    prompt, landed by its transfer), and whether the prompt's reservation must hold pages that
    request wrote last: it does where the reservation's pages besides the stub's outnumber every
    page that request did not write, even counting every page any other request (the run's, and
    the servers' own warmups and health checks, every one the decode log finished) could have
    written over it since."""
    page = source["page_size"]
    usable = run["pool_tokens"]["decode"] // page  # (page 0 is never handed out)
    reader = next(s for s in run["scenario"] if s["outcome"] == "over_pool")
    before = [s for s in run["scenario"] if s["decode_dp_rank"] == reader["decode_dp_rank"]
              and s["at_s"] < reader["at_s"] and s["outcome"] != "over_context"]  # (the tokenizer refuses those)
    wrote = max((s for s in before if s["outcome"] == "served"), key=lambda s: s["prompt_tokens"])
    own = [(int(p), int(o)) for p, o in OWN_FINISH.findall(decode_log)]
    others = sum(math.ceil((s["prompt_tokens"] + s["output_tokens"] + 1) / page) for s in before if s is not wrote)
    others += sum(math.ceil((p + o + 1) / page) for p, o in own)
    not_its = usable - math.ceil(wrote["prompt_tokens"] / page) + others
    stale = math.ceil(reader["prompt_tokens"] / page) - 1  # (the stub's page is its own)
    return {"reader": reader, "before": {s["rid"] for s in before}, "wrote": wrote["rid"], "forced": stale > not_its,
            "never_written_at_most": usable - math.ceil(wrote["prompt_tokens"] / page), "own": len(own)}


@pytest.mark.parametrize("release", ERAS)
def test_the_investigation_of_each_era_gives_what_the_run_did(release: str, tmp_path: Path) -> None:
    """``kvforensics.job.run`` on the two server logs alone (text form), no option, of the run
    that first serves a long request (``req-v``) on the decode DP pool of the over-long prompt,
    that pool small (SOURCE.json ``reuse``): each request's outcome, nodes and boots and the
    findings are those of the scripted run (:func:`assert_as_scripted`), and the confirming replay
    follows the logs (no disagreement, every request placed) to what the run did with the pages,
    worked out by counting alone (:func:`_pages_truth`): where the release sends the one-token
    stub (0.5.11, 0.5.18) decode reads the whole reservation, which must hold pages the long
    request wrote, so exactly one response is exposed, the over-long prompt's, the long request
    among its victims, certain, and every victim a request that ran on that pool before it;
    where it does not (0.5.20, 0.5.23) nothing is exposed and nothing read unwritten."""
    from kvforensics.job import run

    source = _source(release)
    reuse = source["reuse"]
    folder = ROOT / release / reuse["folder"]
    truth = _pages_truth(source, reuse, (folder / "decode-0.log").read_text())
    assert truth["forced"], truth  # (the run is made so: a release that sends the stub cannot avoid them)
    db = tmp_path / "case.duckdb"
    done = run([folder], db, None)
    assert done.investigation.ingest.records.quarantined == 0
    with forensics.Case(db) as c:
        findings = {f.id: f for f in c.findings()}
    con = duckdb.connect(str(db), read_only=True)
    assert_as_scripted(con, findings, {**source, "pool_tokens": reuse["pool_tokens"]}, reuse["scenario"], release)
    pairs = _rows(con, "SELECT DISTINCT reader_request, victim_request, certainty FROM replay_exposures "
                       "WHERE reader_delivered")
    con.close()

    (confirm,) = done.replays
    assert confirm.mode == "confirm" and confirm.not_replayed == 0
    # (only the request decode retracted, on the other DP rank than the reader's)
    assert {(d.request_id, d.node, d.kind) for d in confirm.disagreements} == retractions(source)
    reader, stub_sent = truth["reader"], source["over_long_prompt"] == "sent"
    assert confirm.exposure["exposed_responses"] == (1 if stub_sent else 0)
    assert done.tiers is not None and done.tiers["total"]["exposed_responses"] == (1 if stub_sent else 0)
    assert {p["reader_request"] for p in pairs} == ({reader["rid"]} if stub_sent else set())
    victims = {p["victim_request"] for p in pairs}
    assert victims <= truth["before"]
    assert (truth["wrote"] in {p["victim_request"] for p in pairs if p["certainty"] == "certain"}) == stub_sent
    assert confirm.exposure["victim_requests"] == len(victims)
    # what is left of the reservation was never written: no more pages than the long request left
    assert 0 <= confirm.exposure["uninitialized_reads"] <= (truth["never_written_at_most"] if stub_sent else 0)
    replayed = duckdb.connect(str(confirm.out / "replay.duckdb"), read_only=True)
    readers = _rows(replayed, "SELECT DISTINCT request_id, node FROM uninitialized_reads")
    replayed.close()
    assert readers in ([], [{"request_id": reader["rid"], "node": f"decode-0.dp{reader['decode_dp_rank']}"}])
    assert readers == [] or stub_sent


#: The releases whose start-up warmup is one batch (before 0.5.18): the fixture script noted its end line
BATCHED = [r for r in RELEASES if (ROOT / r / "SOURCE.json").is_file() and "warmup_done" in _source(r)["sources"]]
#: A batch's request line, text or JSON: its items' rids and rooms as the release printed them
BATCH_LINE = re.compile(r"Receive: obj=GenerateReqInput\(.*?\brid=\[(?P<rids>[^\]]*)\].*?\bbootstrap_room=\["
                        r"(?P<rooms>[^\]]*)\]|\"event\": \"request\.received\", \"rid\": \[(?P<jrids>[^\]]*)\]"
                        r".*?\"bootstrap_room\": \[(?P<jrooms>[^\]]*)\]")


def _read(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode() if path.name.endswith(".gz") else path.read_text()


def _batches(path: Path) -> list[tuple[list[str], list[str]]]:
    """The batch request lines of a log file (gzipped or not): each one's items' rids and rooms."""
    out = []
    for m in BATCH_LINE.finditer(_read(path)):
        rids, rooms = (m["rids"], m["rooms"]) if m["rids"] is not None else (m["jrids"], m["jrooms"])
        out.append((re.findall(r"['\"]([0-9a-f]{32})['\"]", rids), [r.strip() for r in rooms.split(",")]))
    return out


def test_the_batched_warmup_is_printed_where_the_release_has_it_and_only_there() -> None:
    """Before 0.5.18 (``_execute_server_warmup`` sending lists, an item per DP rank) each server's
    warmup is one batch request line, at start-up and at the decode server's restart; from 0.5.18
    (one request per DP rank, ``routed_dp_rank``) no request line is a batch."""
    assert BATCHED and set(BATCHED) < {r for r in RELEASES if (ROOT / r).is_dir()}
    for release in (r for r in RELEASES if (ROOT / r / "text").is_dir()):
        prefill, decode = (_batches(ROOT / release / "text" / f"{role}-0.log") for role in ("prefill", "decode"))
        if release in BATCHED:
            # one item on the prefill (no DP), one per DP rank on decode, twice there (its restart)
            assert [len(rids) for rids, _ in prefill] == [1] and [len(rids) for rids, _ in decode] == [2, 2], release
        else:
            assert prefill == decode == [], release


@pytest.mark.parametrize("release", BATCHED)
def test_the_batched_warmup_is_the_servers_own_in_every_form(release: str, tmp_path: Path) -> None:
    """0.5.5, 0.5.7, 0.5.8, 0.5.11 and 0.5.12, every set the release has (text, JSON, text-ms, the
    rotated, hostile and reuse runs, the decode servers of other layouts): the warmup's batch
    line (``rid=[...]``, bootstrap host 2.2.2.2 for each item, the rooms ``i * 2**63 // dp_size +
    i % tp_size``) and its items' finish lines are no genuine line quarantined, no request, no
    record (by rid or by room): never exposed nor a victim, as the replay reads only records;
    each file that logs the batch counts its items apart in the note ``warmup``; and the batch's
    one HTTP answer (one POST, however many items) agrees with the access lines: no ``access``
    note."""
    folders = sorted(d for d in (ROOT / release).iterdir() if d.is_dir() and d.name != "lines")
    assert any(d.name == "text" for d in folders)
    for n, folder in enumerate(folders):
        files = sorted(folder.rglob("*.log*"))
        batches = {f: _batches(f) for f in files}
        items = {rid for found in batches.values() for rids, _ in found for rid in rids}
        rooms = {f"room-{room}" for found in batches.values() for _, rs in found for room in rs}
        assert items, folder
        everything = "".join(map(_read, files))
        for rid in items:  # (each item finishes on a line of its own)
            assert re.search(rf"Finish: obj=GenerateReqInput\(.*?rid='{rid}'|\"request\.finished\", \"rid\": "
                             rf"\"{rid}\"", everything), (folder.name, rid)
        con, found, _ = _case([folder], tmp_path / f"{n}.duckdb")
        assert found.ingest.records.quarantined == 0, folder.name
        named = {r for (r,) in con.execute("SELECT DISTINCT request_id FROM records WHERE request_id IS NOT NULL")
                 .fetchall()} | {r for (r,) in con.execute("SELECT request_id FROM requests").fetchall()}
        assert not named & (items | rooms), (folder.name, named & (items | rooms))
        notes = {(p, k): c for p, k, c in con.execute(
            "SELECT f.path, n.key, n.count FROM file_notes n JOIN files f USING (file_id)").fetchall()}
        for f, found_here in batches.items():
            if found_here and not f.name.endswith(".gz"):  # (a gzipped piece is read with the current one)
                # (with the file's health checks, which some runs probe: the server's own requests too)
                own = sum(len(rids) for rids, _ in found_here) + len(set(HEALTH_RID.findall(_read(f))))
                assert notes.get((str(f), "warmup")) == own, (folder.name, f)
        assert not [k for (_, k) in notes if k == "access"], folder.name
        con.close()


#: A health check's rid as a request line prints it (text or JSON)
HEALTH_RID = re.compile(r"""(?:rid=|"rid": )['"](HEALTH_CHECK_[^'"]+)['"]""")
#: The runs with health checks: the reuse runs (text, level 1) and the hostile ones (0.5.11 JSON to
#: target files at level 2, 0.5.23 text at level 3)
PROBED = [(r, _source(r)["reuse"]["folder"]) for r in ERAS if "reuse" in _source(r)] + HOSTILE


@pytest.mark.parametrize(("release", "folder"), PROBED, ids=[f"{r}-{f}" for r, f in PROBED])
def test_health_checks_are_the_servers_own_and_never_a_request(release: str, folder: str, tmp_path: Path) -> None:
    """Periodic probes of ``/health_generate`` (SOURCE.json ``health_checks``: the rid each server
    logged, whether it was busy), printed by the release's ``health_generate`` and request logger:
    a ``Receive`` line on each server (rid ``HEALTH_CHECK_...``, bootstrap host 2.2.2.2, room 0), a
    ``Finish`` line only where the scheduler was idle and ran it (one token), and uvicorn's ``GET
    /health_generate`` 200. Read: no line quarantined, no record or request of them (by rid or
    room), counted with the warmups in the note ``warmup`` of each file that logs them; the GET
    lines are no generate answer and their finishes none either (no ``access`` note); a busy
    probe, never finished, is no request in flight at the decode server's restart."""
    source = _source(release)
    run = source["reuse"] if folder == source.get("reuse", {}).get("folder") else next(
        s for s in source["hostile"]["sets"] if s["folder"] == folder)
    probes = run["health_checks"]
    assert probes and any(not p["busy"] for p in probes)
    root = ROOT / release / folder
    for node in ("prefill-0", "decode-0"):
        server = (root / f"{node}.log").read_text()
        requests = server + "".join(p.read_text() for p in (root / node).glob("*.log*")) if (root / node).is_dir() \
            else server
        assert server.count('"GET /health_generate HTTP/1.1" 200') == len(probes), node
        for p in probes:
            rid = p["rids"][node]
            received = re.findall(rf"Receive: obj=GenerateReqInput\(.*?\brid='{rid}'.*bootstrap_host='2\.2\.2\.2', "
                                  rf"bootstrap_port=None, bootstrap_room=0|\"request\.received\", \"rid\": \"{rid}\"",
                                  requests)
            finished = re.findall(rf"Finish: obj=GenerateReqInput\(.*?\brid='{rid}'|\"request\.finished\", \"rid\": "
                                  rf"\"{rid}\"", requests)
            assert (len(received), len(finished)) == (1, 0 if p["busy"] else 1), (node, p)
    con, found, findings = _case([root], tmp_path / "case.duckdb")
    assert found.ingest.records.quarantined == 0
    rids = {rid for p in probes for rid in p["rids"].values()}
    named = {r for (r,) in con.execute("SELECT DISTINCT request_id FROM records WHERE request_id IS NOT NULL")
             .fetchall()} | {r for (r,) in con.execute("SELECT request_id FROM requests").fetchall()}
    assert not named & (rids | {"room-0"})
    notes = {(Path(p).name, k): (c, t) for p, k, c, t in con.execute(
        "SELECT f.path, n.key, n.count, n.text FROM file_notes n JOIN files f USING (file_id)").fetchall()}
    assert not [k for (_, k) in notes if k == "access"] and "evidence.access_status_differs" not in findings
    scenario = run.get("scenario") or source["hostile"]["scenario"]
    restarts = sum(s["outcome"] == "decode_restart" for s in scenario)
    assert (("decode-0.log", "restart") in notes) == bool(restarts)
    if restarts:  # (in flight then: only the run's request, not the busy probe before it)
        assert notes[("decode-0.log", "restart")][1].endswith(f"left unfinished: {restarts}")
    for node in ("prefill-0", "decode-0"):
        text = (root / f"{node}.log").read_text()
        if (root / node).is_dir():
            continue  # (the target file's note is checked by the rotated and hostile tests' counts)
        own = set(re.findall(r"Finish: obj=GenerateReqInput\(.*?\brid='([^']+)'.*bootstrap_host='2\.2\.2\.2'", text))
        own |= {rid for rids, _ in _batches(root / f"{node}.log") for rid in rids} | set(HEALTH_RID.findall(text))
        assert notes[(f"{node}.log", "warmup")][0] == len(own), node
    con.close()
