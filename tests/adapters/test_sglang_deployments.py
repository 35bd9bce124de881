"""SGLang deployments as they really run, printed by the releases' own code (tests/adapters/releases/).

- ``json-rotated`` (0.5.8, 0.5.23): the scripted run with its ``--log-requests-target`` files
  rolled over by SGLang's own ``TimedRotatingFileHandler`` on the run's clock and the older
  pieces gzipped (SOURCE.json ``rotated``);
- ``hostile-*`` (0.5.11 JSON at ``--log-requests-level 2``, 0.5.23 text at level 3): no client
  rid (each server assigns its own), prompts and outputs that look like log lines, with quotes,
  CR/LF, NUL, ANSI escapes, Unicode line separators and one ~150 KB output (SOURCE.json
  ``hostile``);
- the investigation of the server logs alone, no option, one release per era (0.5.11, 0.5.18,
  0.5.20, 0.5.23), with the replay that confirms it.

What each request should become comes from SOURCE.json's scenarios, not from the adapter.
"""

from __future__ import annotations

import gzip
import math
import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_sglang_releases import ROOT, _rows, _source, assert_as_scripted

import forensics

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
    receive, finish, time-stats, server_args, pool, length, integrity and transfer-failure lines
    naming the other requests' rids and rooms, at times in 2031, with quotes, CR/LF, NUL, ANSI
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


@pytest.mark.parametrize("release", ERAS)
def test_the_investigation_of_each_era_gives_what_the_run_did(release: str, tmp_path: Path) -> None:
    """``kvforensics.job.run`` on the two server logs alone (text form), no option: each
    request's outcome, nodes and boots and the findings are those of the scripted run
    (:func:`assert_as_scripted`), and the confirming replay follows the logs (no disagreement,
    every request placed) to what the run did with the pages: every DP pool starts empty at its
    boot, so where the release sends the one-token stub of the over-long prompt (0.5.11, 0.5.18)
    decode reads its whole reservation unwritten but the stub's page, ``ceil(prompt / page) - 1``
    pages, and no response is exposed to another request's content; where it does not (0.5.20,
    0.5.23) nothing is read unwritten."""
    from kvforensics.job import run

    source = _source(release)
    db = tmp_path / "case.duckdb"
    done = run([ROOT / release / "text"], db, None)
    assert done.investigation.ingest.records.quarantined == 0
    with forensics.Case(db) as c:
        findings = {f.id: f for f in c.findings()}
    con = duckdb.connect(str(db), read_only=True)
    assert_as_scripted(con, findings, source, source["scenario"], release)
    assert _rows(con, "SELECT * FROM replay_exposures") == []
    con.close()

    (confirm,) = done.replays
    assert confirm.mode == "confirm" and confirm.not_replayed == 0 and confirm.disagreements == ()
    over = next(s for s in source["scenario"] if s["outcome"] == "over_pool")
    stub_sent = source["over_long_prompt"] == "sent"
    unwritten = math.ceil(over["prompt_tokens"] / source["page_size"]) - 1 if stub_sent else 0
    assert confirm.exposure["exposed_responses"] == 0 and confirm.exposure["victim_requests"] == 0
    assert confirm.exposure["uninitialized_reads"] == unwritten
    replayed = duckdb.connect(str(confirm.out / "replay.duckdb"), read_only=True)
    readers = _rows(replayed, "SELECT DISTINCT request_id, node FROM uninitialized_reads")
    replayed.close()
    assert readers == ([{"request_id": over["rid"], "node": f"decode-0.dp{over['decode_dp_rank']}"}]
                       if stub_sent else [])
