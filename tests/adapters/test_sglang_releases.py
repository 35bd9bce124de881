"""SGLang's logs as its releases print them: the fixtures of tests/adapters/releases/.

Each folder there was printed by one release's own code (scripts/make_sglang_fixtures.py runs
the wheel's logging code on a scripted prefill/decode run; SOURCE.json names the release, the
wheel's SHA-256 and the source line behind each line type). Releases covered: 0.5.5, 0.5.7,
0.5.8, 0.5.11, 0.5.12, 0.5.18, 0.5.19, 0.5.20, 0.5.21, 0.5.22 and 0.5.23, text request logs for all,
JSON for those that have it (0.5.7 on: on stdout to 0.5.7, in --log-requests-target files from
0.5.8), and the text form with SGLANG_LOG_MS=1 (milliseconds in each time; 0.5.7 on); and in
lines/ the queues' capacity check, which the scripted run never reaches, printed outside it.

What each request should become is worked out here from the scenario in SOURCE.json and what
the release does (what it does with a length-rejected prompt: sends its stub up to 0.5.19, aborts
it after its forward in 0.5.20, retires it at intake from 0.5.21; which integrity checks it has),
not from the adapter. With DP attention only DP0's first scheduler prints the pool line, as every
release does; each DP rank still gets a config.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest

import forensics
from forensics.adapters import Lines, Notes, Options, Untranslatable, sniff
from forensics.adapters.sglang import ADAPTERS as SGLANG
from forensics.adapters.sglang.eras import RELEASES, releases_of
from forensics.ingestion.readers import translated

#: The fixtures; scripts/check_sglang_releases.py points this at sets made for other releases and runs.
ROOT = Path(os.environ.get("KVFORENSICS_SGLANG_RELEASES") or Path(__file__).parent / "releases")
SETS = sorted(((d.name, form) for d in ROOT.iterdir() if d.is_dir() for form in ("text", "json", "text-ms")
               if (d / form).is_dir()), key=lambda s: (RELEASES.index(s[0]), s[1]))
#: Lines a server prints that are no event of a request, and lines whose facts other lines'
#: records carry (the same rejection is in the request's finish line): these may give no record.
QUIET = [re.compile(p) for p in (
    r"^INFO: ",  # uvicorn
    r"\] (Prefill|Decode) batch",
    r"\] server_args=",
    r"\] KV pool holds \d+ tokens, fewer than",
    r"Input length \(\d+ tokens\) exceeds the maximum allowed length",  # its finish line records it
    # the start-up warmup's messages (the batched one's end with its answer, to 0.5.12; one per DP
    # rank from 0.5.18); its requests' own lines are recorded as nothing
    r"\] (Start of pd disaggregation warmup|Disaggregation warmup requests completed|End of disaggregation warmup"
    r"|Disaggregation warmup request completed with status|End of prefill disaggregation mode warmup with status)",
    # a prompt retired at the prefill bootstrap queue (0.5.21 on): its time stats are no transfer
    r"ReqTimeStats\(.*, output_len=0, attempts=0, type=prefill\)",
    r"\] \[http_server\] Error: The input",  # recorded with the receive line of the request it is tied to
    r"Context corruption detected|KV checksum mismatch req=",  # the finish line records the abort
    r"\] Some requests timed out when bootstrapping",  # a hint, once a process; the failure line says which
    # decode retracts a request (0.5.5 at INFO, then a warning): its finish's meta_info counts it, a
    # decode_retracted disagreement of the replay's
    r"\] KV cache pool is full\. Retract requests\. #retracted_reqs: ",
    r"Finish: obj=.*'finish_reason': \{'type': 'length'",  # a prefill's answer to the router
    r'"event": "request.finished".*"finish_reason": \{"type": "length"',
)]


def numbered(text: list[str]) -> Lines:
    """A file's lines as the readers give them to an adapter: numbered from 1, blank ones left out."""
    return lambda: ((n, t) for n, t in enumerate(text, 1) if t.strip())


def _source(release: str) -> dict[str, Any]:
    return json.loads((ROOT / release / "SOURCE.json").read_text())


def retractions(source: dict[str, Any]) -> set[tuple[str, str, str]]:
    """The ``decode_retracted`` disagreements a replay of the scripted run lists: (request, its decode
    DP rank's node, kind) of each request the run's decode scheduler retracted (SOURCE.json), by its
    finish's count; and ("", that node, kind) by the scheduler's line there (``KV cache pool is
    full. Retract requests.``, which names no request)."""
    rank = {s["rid"]: s["decode_dp_rank"] for s in source["scenario"]}
    nodes = {r["rid"]: f"decode-0.dp{rank[r['rid']]}" for r in source["retracted"]}
    return ({(rid, node, "decode_retracted") for rid, node in nodes.items()}
            | {("", node, "decode_retracted") for node in nodes.values()})


def _ingest(release: str, form: str, tmp_path: Path) -> tuple[duckdb.DuckDBPyConnection, Any, dict[str, Any]]:
    case = tmp_path / "case.duckdb"
    found = forensics.investigate([ROOT / release / form], case)
    findings = {f.id: f for f in forensics.Case(case).findings()}
    return duckdb.connect(str(case), read_only=True), found, findings


def _rows(con: duckdb.DuckDBPyConnection, sql: str, *args: Any) -> list[dict[str, Any]]:
    rel = con.execute(sql, list(args))
    cols = [d[0] for d in rel.description]
    return [dict(zip(cols, row, strict=True)) for row in rel.fetchall()]


@pytest.mark.parametrize(("release", "form"), SETS, ids=[f"{r}-{f}" for r, f in SETS])
def test_every_line_a_release_printed_is_read_and_none_is_quarantined(release: str, form: str) -> None:
    for path in sorted((ROOT / release / form).rglob("*.log")):
        text = path.read_text()
        adapter = next(a for a in SGLANG if a.sniff(text.splitlines()[:64]))
        lines = numbered(text.splitlines())
        quiet, recorded = [], 0
        assert adapter.translate is not None
        for _, raw, outcome in translated(adapter, lines, path, Options(), Notes()):
            assert not isinstance(outcome, Untranslatable), f"{path.name}: {outcome}: {raw[:120]}"
            if outcome is None:
                quiet.append(raw)
            else:
                recorded += 1
        assert recorded > 0
        loud = [q[:160] for q in quiet if not any(p.search(q) for p in QUIET)]
        assert loud == [], f"{path.name}: lines of SGLang's given no record"
        assert recorded + len(quiet) == len([t for t in text.splitlines() if t.strip()])


def _outcomes(path: Path, lines: Any) -> list[Any]:
    adapter = next(a for a in SGLANG if a.sniff(path.read_text().splitlines()[:64]))
    assert adapter.translate is not None
    return [(n, raw, repr(out)) for n, raw, out in translated(adapter, lines, path, Options(), Notes())]


def test_the_lines_kept_between_the_passes_translate_as_lines_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second pass translates what the first kept of each line; past KEEP_LINES, and where
    a line is not the one the first pass saw, it reads the line again: the same records, line for
    line, on every fixture file of every release."""
    from forensics.adapters.sglang import adapter as sglang

    files = sorted(p for release, form in SETS for p in (ROOT / release / form).rglob("*.log"))
    assert len(files) > 30
    for path in files:
        text = path.read_text().splitlines()
        lines = numbered(text)
        kept = _outcomes(path, lines)
        with monkeypatch.context() as m:
            m.setattr(sglang, "KEEP_LINES", 5)
            assert _outcomes(path, lines) == kept, path
        # a file written to between the passes: its second line differs in length the second time
        calls: list[int] = []

        def changing(text: list[str] = text, calls: list[int] = calls) -> Any:
            calls.append(1)
            return ((n, t + (" x" if len(calls) > 1 and n == 2 else "")) for n, t in enumerate(text, 1)
                    if t.strip())

        changed = _outcomes(path, changing)
        assert [c for c in changed if c[0] != 2] == [c for c in kept if c[0] != 2], path


@pytest.mark.parametrize(("release", "form"), SETS, ids=[f"{r}-{f}" for r, f in SETS])
def test_each_request_becomes_what_the_release_did_with_it(release: str, form: str, tmp_path: Path) -> None:
    source = _source(release)
    con, found, found_ids = _ingest(release, form, tmp_path)
    assert found.ingest.records.quarantined == 0
    assert_as_scripted(con, found_ids, source, source["scenario"], release)
    con.close()


def assert_as_scripted(con: duckdb.DuckDBPyConnection, found_ids: dict[str, Any], source: dict[str, Any],
                       scenario: list[dict[str, Any]], release: str) -> None:
    """The case of a run of the scripted scenario holds what the release did with each request
    (its outcome, on its nodes and boots) and the findings that follow, worked out from
    ``scenario`` and ``source`` (SOURCE.json), not from the adapter."""
    page = source["page_size"]
    # what the release does with a prompt rejected at intake: sent (its stub, up to 0.5.19),
    # aborted (after the stub's forward, nothing sent: 0.5.20), retired (at intake: 0.5.21 on)
    over_long = source["over_long_prompt"]
    checks = {"room_mismatch": "room_mismatch" in source["sources"],
              "checksum_mismatch": "checksum_mismatch" in source["sources"]}

    # roles from the logs themselves (no --role), each DP rank a node with its own pool
    configs = {r["node"]: r for r in _rows(con, "SELECT * FROM configs")}
    assert set(configs) == {"prefill-0", "decode-0.dp0", "decode-0.dp1"}
    assert configs["prefill-0"]["role"] == "prefill"
    assert configs["prefill-0"]["pool_pages"] == source["pool_tokens"]["prefill"] // page + 1
    for dp in ("decode-0.dp0", "decode-0.dp1"):
        assert configs[dp]["role"] == "decode"
        assert configs[dp]["pool_pages"] == source["pool_tokens"]["decode"] // page + 1
    for c in configs.values():
        assert c["context_length"] == source["context_length"] and c["page_size"] == page
        era = releases_of(c["engine_version"])
        assert era is not None and release in era, c["engine_version"]

    events = _rows(con, "SELECT * FROM request_events ORDER BY ts")
    transfers = _rows(con, "SELECT * FROM transfers ORDER BY ts")
    requests = {r["request_id"]: r for r in _rows(con, "SELECT * FROM requests")}

    def on(rid: str, node: str, event: str) -> list[dict[str, Any]]:
        return [e for e in events if e["request_id"] == rid and e["node"] == node and e["event"] == event]

    def sent(rid: str, node: str, event: str = "completed") -> list[dict[str, Any]]:
        return [t for t in transfers if t["request_id"] == rid and t["node"] == node and t["event"] == event]

    for s in scenario:
        rid, prompt, output, outcome = s["rid"], s["prompt_tokens"], s["output_tokens"], s["outcome"]
        decode = f"decode-0.dp{s['decode_dp_rank']}"
        received = on(rid, "prefill-0", "received")
        assert len(received) == 1 and received[0]["prompt_tokens"] == prompt, rid
        assert received[0]["max_new_tokens"] == output
        served = outcome == "served" or (outcome in checks and not checks[outcome])
        if served:
            assert [t["tokens"] for t in sent(rid, "prefill-0")] == [prompt], rid
            assert len(sent(rid, decode)) == 1 and len(on(rid, decode, "decode_started")) == 1
            (fin,) = on(rid, decode, "finished")
            assert (fin["status"], fin["output_tokens"]) == (200, output)
            admitted, started = on(rid, decode, "admitted")[0]["ts"], on(rid, decode, "decode_started")[0]["ts"]
            assert admitted <= sent(rid, decode)[0]["ts"] <= started <= fin["ts"]
            assert requests[rid]["delivered"]
        elif outcome == "over_pool":
            (rejected,) = on(rid, "prefill-0", "rejected")
            assert (rejected["reason"], rejected["limit_tokens"]) == ("input_too_long", source["max_req_input_len"])
            if over_long == "retired":  # at the bootstrap queue: never prefilled nor sent, decode gives up
                assert sent(rid, "prefill-0") == [] and on(rid, decode, "decode_started") == []
                assert on(rid, "prefill-0", "prefill_started") == []  # (its time stats: a retirement)
                assert not requests[rid]["delivered"]
            elif over_long == "aborted":  # the stub's forward ran, its sender aborted: decode times out
                assert len(on(rid, "prefill-0", "prefill_done")) == 1 and sent(rid, "prefill-0") == []
                assert on(rid, decode, "decode_started") == [] and len(sent(rid, decode, "failed")) == 1
                assert [f["status"] for f in on(rid, decode, "finished")] == [500]
                assert not requests[rid]["delivered"]
            else:  # the incident: the one-token stub is sent, decode reads its whole reservation
                assert [t["tokens"] for t in sent(rid, "prefill-0")] == [1]
                assert len(on(rid, decode, "decode_started")) == 1
                assert [f["status"] for f in on(rid, decode, "finished")] == [200]
                assert requests[rid]["delivered"]
        elif outcome == "over_context":
            for node in ("prefill-0", "decode-0"):  # refused by each server's tokenizer, before any DP rank
                (rejected,) = on(rid, node, "rejected")
                assert (rejected["reason"], rejected["limit_tokens"]) == ("input_too_long", source["context_length"])
            assert not requests[rid]["delivered"] and sent(rid, "prefill-0") == []
        elif outcome == "decode_restart":  # in flight on decode when its process died: nothing more there
            assert [t["tokens"] for t in sent(rid, "prefill-0")] == [prompt], rid
            # (its decode receive line, with no scheduler line naming its DP rank: the server's node)
            assert [e["boot"] for e in on(rid, "decode-0", "admitted")] == [0]
            assert on(rid, decode, "finished") == [] and not requests[rid]["delivered"]
        elif outcome in ("transfer_failed", "bootstrap_failed"):
            # the transfer fails (or its bootstrap: decode's handshake, the prefill's wait timing
            # out), each side a failed record of the same room, the two sides named by it
            (ours,), (theirs,) = sent(rid, "prefill-0", "failed"), sent(rid, decode, "failed")
            assert ours["transfer_id"] == theirs["transfer_id"] and ours["transfer_id"].startswith("room-"), rid
            for side in (ours, theirs):
                assert (side["src_node"], side["dst_node"]) == ("prefill-0", decode), rid
            assert [f["status"] for f in on(rid, decode, "finished")] == [500]
            assert sent(rid, "prefill-0") == [] and on(rid, decode, "decode_started") == []
            assert not requests[rid]["delivered"]
        else:  # an integrity check of the release caught it
            reason = {"room_mismatch": "bootstrap_room_mismatch", "checksum_mismatch": "kv_checksum_mismatch"}[outcome]
            assert [(f["status"], f["finish_reason"]) for f in on(rid, decode, "finished")] == [(500, reason)]
            assert not requests[rid]["delivered"]

    # the scenario's requests and no other: the servers' warmups (0.5.18 on) are left out, said so
    assert set(requests) == {s["rid"] for s in scenario}
    # a request decode retracted under memory pressure: its finish's meta_info counts it (every release)
    retracted = {r["rid"]: r["retractions"] for r in source["retracted"] if r["rid"] in requests}
    assert retracted and dict(con.execute("SELECT request_id, retractions FROM request_records "
                                          "WHERE retractions IS NOT NULL").fetchall()) == retracted
    warmed = "Start of pd disaggregation warmup" in (ROOT / release / "text" / "decode-0.log").read_text()
    noted = {k for (k,) in con.execute("SELECT DISTINCT key FROM file_notes").fetchall()}
    assert ("warmup" in noted) == warmed

    # the decode server's second start-up in its file is a new boot of each of its pools, and what
    # came after it is on that boot; the prefill server never restarted
    boots = {(r["node"], r["boot"]) for r in _rows(con, "SELECT node, boot FROM configs")}
    assert boots == {("prefill-0", 0), *((f"decode-0.dp{d}", b) for d in (0, 1) for b in (0, 1))}
    restart = next(s["at_s"] for s in scenario if s["outcome"] == "decode_restart")
    for s in scenario:
        on_decode = [e["boot"] for e in events if e["request_id"] == s["rid"] and e["node"].startswith("decode-0")]
        assert set(on_decode) <= {0 if s["at_s"] <= restart else 1}, s["rid"]

    assert "config.context_exceeds_pool" in found_ids
    stubbed = {r["request_id"] for r in found_ids["handoff.rejected_but_transferred"].evidence.to_dicts()} \
        if "handoff.rejected_but_transferred" in found_ids else set()
    by_outcome = {s["outcome"]: s["rid"] for s in scenario}
    assert stubbed == ({by_outcome["over_pool"]} if over_long == "sent" else set())
    caught = found_ids.get("integrity.engine_caught_corruption")
    caught_ids = {r["request_id"] for r in caught.evidence.to_dicts()} if caught else set()
    assert caught_ids == {by_outcome[o] for o, has in checks.items() if has}
    assert "evidence.role_unknown" not in found_ids


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_the_capacity_check_each_release_prints_becomes_a_rejection(release: str) -> None:
    """The disaggregation queues' capacity check, printed by the release's f-string and logger
    on each scheduler of the request (lines/: outside the scripted run, which never reaches the
    check), becomes one ``rejected`` record with the pool as its limit, on the DP rank's node."""
    lines = _source(release)["lines"]
    assert {d["role"] for d in lines} == {"prefill", "decode"}
    adapter = next(a for a in SGLANG if a.name == "sglang-server")
    assert adapter.translate is not None
    for d in lines:
        path = ROOT / release / d["file"]
        text = path.read_text().splitlines()
        assert len(text) >= 1 and all(f" {d['tokens']} > {d['limit_tokens']}" in t for t in text)
        out = [{k: v for k, v in r.items() if k not in ("line_no",)}
               for _, _, o in translated(adapter, numbered(text), path, Options(role=d["role"]), Notes())
               for r in (o or [])]
        assert len(out) == len(text)  # (each scheduler's line: the same record, a duplicate at ingest)
        node = "prefill-0" if d["role"] == "prefill" else "decode-0.dp0"
        assert {(r["kind"], r["event"], r["request_id"], r["reason"], r["limit_tokens"], r["node"], r["ts"])
                for r in out} == {("request", "rejected", d["rid"], "input_too_long", d["limit_tokens"], node,
                                   "2026-11-02T08:00:01.000000Z")}


#: The error lines a server prints about one request: the length and capacity checks', the
#: integrity checks'.
ERROR_LINE = re.compile(r"exceeds the maximum allowed length \(|exceeds the maximum number of tokens: "
                        r"|Context corruption detected: Request |KV checksum mismatch")


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_a_file_of_error_lines_alone_is_read_as_sglang(release: str, tmp_path: Path) -> None:
    """A piece of a server's log with nothing but the error lines the release printed (a rotated
    file need not start with ``server_args``) is recognised as SGLang's without ``--format``, and
    each line that names its request becomes that request's record: a rejection for the length
    and capacity checks, a 500 finish for the integrity checks."""
    lines = {d["role"]: (ROOT / release / d["file"]).read_text().splitlines() for d in _source(release)["lines"]}
    expected: dict[tuple[str, str], str] = {}
    for role in ("prefill", "decode"):
        text = [t for t in (ROOT / release / "text" / f"{role}-0.log").read_text().splitlines()
                if ERROR_LINE.search(t) and "Finish: obj=" not in t]  # (a finish line quotes its abort's message)
        text += lines[role]
        assert text and all(ERROR_LINE.search(t) for t in text)
        found = sniff(text[:64])
        assert found is not None and found.name == "sglang-server", role
        (tmp_path / f"{role}-0.log").write_text("\n".join(text) + "\n")
        for t in text:
            named = re.search(r"rid='([^']+)'|Request (\S+) |req=(\S+) ", t)
            assert named is not None, t  # (every release's checks name their request)
            rid = next(g for g in named.groups() if g)
            expected[role, rid] = "rejected" if "exceeds the maximum" in t else "finished"
    result = forensics.ingest([tmp_path / "prefill-0.log", tmp_path / "decode-0.log"], tmp_path / "case.duckdb")
    assert result.records.quarantined == 0
    assert result.records.read == result.records.ingested + result.records.duplicates
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    got = {(("prefill" if r["node"].startswith("prefill") else "decode"), r["request_id"]): r["event"]
           for r in _rows(con, "SELECT node, request_id, event FROM request_events "
                               "WHERE event = 'rejected' OR status = 500")}
    con.close()
    assert got == expected


def test_decode_steps_are_counted_back_from_a_finish_known_to_the_microsecond(tmp_path: Path) -> None:
    """Up to 0.5.11 a decode's time stats give the steps from ``start`` (the scheduler's
    ``perf_counter``), which the adapter can only put on the wall clock to within what the
    file's seconds allow; a text finish line's ``response_sent_to_client_ts`` (0.5.6 on) gives
    the finish to the microsecond, and the steps are counted back from it, never a calibrated
    start mixed with a precise finish (the independent check found a decode that started 7 ms
    after its response was sent: scripts/check_sglang_releases.py --seeds 2, 0.5.7)."""
    checked = 0
    # (every one in the repo's fixtures; those of them a run of scripts/check_sglang_releases.py printed)
    present = [r for r in ("0.5.7", "0.5.8", "0.5.11") if (ROOT / r).is_dir()]
    assert present
    for release in present:
        log = (ROOT / release / "text" / "decode-0.log").read_text()
        forward = {m["rid"]: float(m["ms"]) for m in re.finditer(
            r"Req Time Stats\(rid=(?P<rid>[^,]+), .*?forward_duration=(?P<ms>[\d.]+)ms", log)}
        case = tmp_path / f"{release}.duckdb"
        forensics.investigate([ROOT / release / "text" / "decode-0.log"], case)
        con = duckdb.connect(str(case), read_only=True)
        rows = _rows(con, "SELECT s.request_id, s.ts AS started, f.ts AS finished FROM request_events s "
                          "JOIN request_events f USING (request_id) "
                          "WHERE s.event = 'decode_started' AND f.event = 'finished'")
        con.close()
        assert {r["request_id"] for r in rows} == set(forward), release
        for r in rows:
            assert (r["finished"] - r["started"]).total_seconds() * 1000 == pytest.approx(
                forward[r["request_id"]], abs=0.001), (release, r)
            checked += 1
    assert checked >= 5 * len(present)


def test_a_finish_line_with_no_year_is_kept_with_its_reason_not_a_crash() -> None:
    """The first pass reads a finish's response_sent_to_client_ts against the line's time; a
    line whose time has no year (``[11-02 ...]`` without --year) has none, and is quarantined
    by the second pass with the reason, as any other line of that kind."""
    text = (ROOT / "0.5.7" / "text" / "decode-0.log").read_text().splitlines()
    # (a client's: a line of the server's own warmup gives no record, whatever its time)
    at = next(i for i, t in enumerate(text) if "Finish: obj=" in t and "bootstrap_host='2.2.2.2'" not in t)
    text[at] = "[11-02" + text[at][len("[2026-11-02"):]
    adapter = next(a for a in SGLANG if a.name == "sglang-server")
    assert adapter.translate is not None
    out = {n: o for n, _, o in translated(adapter, numbered(text), Path("decode-0.log"), Options(), Notes())}
    assert isinstance(out[at + 1], Untranslatable) and "no year" in str(out[at + 1])
    assert len(out) == len(text)


def test_a_request_log_file_with_no_server_log_beside_it_is_said_and_found(tmp_path: Path) -> None:
    alone = tmp_path / "requests"
    alone.mkdir()
    source = ROOT / "0.5.23" / "json" / "decode-0"
    for f in source.iterdir():
        (alone / f.name).write_text(f.read_text())
    case = tmp_path / "case.duckdb"
    result = forensics.investigate([alone], case)
    (file,) = result.ingest.files
    assert any("say nothing of their server's role" in n for n in file.notes)
    found = {f.id: f for f in forensics.Case(case).findings()}
    assert found["evidence.role_unknown"].count == 1
    # and with --role the operator says it: no finding
    case2 = tmp_path / "case2.duckdb"
    forensics.investigate([alone], case2, options=Options(role="decode"))
    assert "evidence.role_unknown" not in {f.id for f in forensics.Case(case2).findings()}


def test_bare_request_lines_of_0_5_8_to_0_5_11_take_the_time_of_the_line_before(tmp_path: Path) -> None:
    case = tmp_path / "case.duckdb"
    result = forensics.investigate([ROOT / "0.5.11" / "text"], case)
    notes = [n for f in result.ingest.files for n in f.notes]
    assert any("have no time of their own" in n for n in notes)
    con = duckdb.connect(str(case), read_only=True)
    (row,) = con.execute("SELECT ts FROM request_events WHERE request_id = 'req-a3' AND event = 'received'").fetchall()
    # the Receive line follows the batch of req-sum's lines (08:00:14) and precedes req-a3's (08:00:16)
    assert row[0].strftime("%H:%M:%S") in ("08:00:14", "08:00:16")
    con.close()


def test_the_format_era_of_each_release_contains_it() -> None:
    for release, form in SETS:  # (the run's server logs; lines/ holds lines outside it)
        for path in (ROOT / release / form).rglob("*.log"):
            adapter = next(a for a in SGLANG if a.sniff(path.read_text().splitlines()[:64]))
            notes = Notes()
            lines = numbered(path.read_text().splitlines())
            assert adapter.translate is not None
            for _ in translated(adapter, lines, path, Options(), notes):
                pass
            (era,) = [t for t in notes.lines() if "in the format of SGLang" in t]
            named = releases_of(era.rsplit(" ", 1)[-1])
            assert named is not None and release in named, (path, era)


def _agree(line: str) -> bool | None:
    """Whether the fast read of a text request line says what the full parse says (None: it declined)."""
    from forensics.adapters.sglang.log import split, status_code
    from forensics.adapters.sglang.requests import _fast, parse

    msg = split(line, None).msg
    fast = _fast(msg)
    if fast is None:
        return None
    whole = parse(split(line, None), whole=True)
    assert whole is not None
    return ((fast.event, fast.rid) == (whole.event, whole.rid)
            and dig_max(fast.obj) == dig_max(whole.obj)
            and fast.obj.get("bootstrap_room") == _room(whole.obj.get("bootstrap_room"))
            and all(fast.meta.get(k) == whole.meta.get(k)
                    for k in ("prompt_tokens", "completion_tokens", "dp_rank", "response_sent_to_client_ts"))
            and fast.finish_reason.get("type") == whole.finish_reason.get("type")
            and fast.finish_reason.get("message") == whole.finish_reason.get("message")
            and fast.finish_reason.get("status_code") == status_code(whole.finish_reason.get("status_code")))


def _room(room: Any) -> Any:
    return None if room == "None" else room  # (the full parse keeps a None repr as the name None)


def dig_max(obj: dict[str, Any]) -> Any:
    return (obj.get("sampling_params") or {}).get("max_new_tokens")


def test_the_fast_read_of_text_request_lines_agrees_with_the_full_parse_on_every_fixture_line() -> None:
    # (the hostile sets log user text: tests/adapters/test_sglang_deployments.py)
    lines = [t for p in ROOT.rglob("*.log") if "hostile" not in str(p.relative_to(ROOT))
             for t in p.read_text().splitlines() if "Receive: obj=" in t or "Finish: obj=" in t]
    assert len(lines) > 200
    # level 1 holds no user text: all read fast, but a batch (the warmup before 0.5.18: ``rid=[...]``),
    # which the full parse reads
    batch = re.compile(r"(Receive|Finish): obj=GenerateReqInput\([^'\"]*?\brid=\[")
    assert all(_agree(t) is (None if batch.search(t) else True) for t in lines)
    assert any(batch.search(t) for t in lines)


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_TEXT = st.text(alphabet=st.sampled_from("ab'\"{}[](),=: \\rid_x"), max_size=30)


@settings(max_examples=300, deadline=None)
@given(rid=st.text(alphabet="abc-_0123456789", min_size=1, max_size=12), stop=st.lists(_TEXT, max_size=3),
       message=_TEXT, max_new=st.integers(0, 10**6), prompt=st.integers(0, 10**7), status=st.sampled_from([400, 500]),
       text=st.none() | _TEXT, aborted=st.booleans())
def test_the_fast_read_never_disagrees_with_the_full_parse(rid: str, stop: list[str], message: str, max_new: int,
                                                          prompt: int, status: int, text: str | None,
                                                          aborted: bool) -> None:
    """Lines as SGLang's _dataclass_to_string_truncated prints them (Python reprs), with user
    strings where they may appear (stop strings, text at levels 2 and 3, an abort message): the
    fast read agrees, or declines (only where text is logged)."""
    sp = {"max_new_tokens": max_new, **({"stop": stop} if stop else {})}
    shown = "" if text is None else f"text={text!r}, "
    head = f"GenerateReqInput({shown}rid={rid!r}, sampling_params={sp!r}, stream=False)"
    reason: dict[str, Any] = ({"type": "abort", "message": message, "status_code": status} if aborted
                              else {"type": "length", "length": 3})
    out = {"meta_info": {"id": rid, "finish_reason": reason, "prompt_tokens": prompt, "completion_tokens": 3}}
    at = "[2026-11-02 08:00:00]"
    for line in (f"{at} Receive: obj={head}", f"{at} Finish: obj={head}, out={out!r}"):
        result = _agree(line)
        # no user text before the rid (levels 0 and 1): read fast, stop strings and all
        assert (result is True) if text is None else (result in (True, None)), line


@pytest.mark.parametrize(("release", "form"), SETS, ids=[f"{r}-{f}" for r, f in SETS])
def test_the_replay_of_each_release_run_follows_its_logs_without_disagreement(release: str, form: str,
                                                                              tmp_path: Path) -> None:
    from replay.replay import logged_engine_of, replay

    case = tmp_path / "case.duckdb"
    forensics.investigate([ROOT / release / form], case)
    result = replay(case, logged_engine_of(case) or "sglang-placeholder", tmp_path / "replay")
    assert result.mode == "confirm" and result.not_replayed == 0
    # only what the run's logs say the replay does not model: the request decode retracted, on its DP rank
    assert {(d.request_id, d.node, d.kind) for d in result.disagreements} == retractions(_source(release)), \
        [d.as_dict() for d in result.disagreements]
    assert result.outcomes_changed == 0
    # every decode batch line's step record is held to the replay's steps (none disagrees: above)
    with duckdb.connect(str(case), read_only=True) as con:
        logged = con.execute("SELECT count(*) FROM step_records WHERE cache IS NULL").fetchone()
    assert logged is not None and result.step_records == logged[0] > 0 and result.step_records_unchecked == 0


@pytest.mark.parametrize("release", ["0.5.5", "0.5.11", "0.5.23"])
def test_a_decode_servers_log_alone_leaves_its_step_records_unchecked(release: str, tmp_path: Path) -> None:
    """A decode server's log alone (0.5.5, 0.5.11 and 0.5.23 with ``--enable-metrics-for-all-schedulers``):
    no router logged its requests, so the replay passes them through without running their steps;
    its batch is not the node's, and its step records are counted unchecked, not disagreeing."""
    from replay.replay import replay

    case = tmp_path / "case.duckdb"
    forensics.investigate([ROOT / release / "text-all-schedulers"], case)
    result = replay(case, "sglang-placeholder", tmp_path / "replay")
    with duckdb.connect(str(case), read_only=True) as con:
        logged = con.execute("SELECT count(*) FROM step_records WHERE cache IS NULL").fetchone()
    assert logged is not None and result.step_records_unchecked == logged[0] > 0
    assert result.step_records == 0
    assert {(d.request_id, d.node, d.kind) for d in result.disagreements} == retractions(_source(release))


def _own_rids(release: str, form: str, out: Path, sides: tuple[str, ...] = ("decode",)) -> dict[str, str]:
    """A copy of a set whose decode server (or each of ``sides``) assigned its own rids (as SGLang
    does where neither the client nor the router gives one): each scenario rid replaced in that
    server's files by another id, a uuid4-like hex of its own on each side. The rest of each line
    is as the release printed it. The new id of each rid on decode."""
    import hashlib
    import shutil

    shutil.copytree(ROOT / release / form, out)
    rids = [s["rid"] for s in _source(release)["scenario"]]
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, rids)) + r")(?![\w-])")
    for side in sides:
        new = {rid: hashlib.sha256(f"{side}:{rid}".encode() if side != "decode" else rid.encode()).hexdigest()[:32]
               for rid in rids}
        for path in out.rglob("*.log"):
            if path.name.startswith(side) or path.parent.name.startswith(side):
                path.write_text(pattern.sub(lambda m, new=new: new[m[1]], path.read_text()))
    return {rid: hashlib.sha256(rid.encode()).hexdigest()[:32] for rid in rids}


@pytest.mark.parametrize(("release", "form"), [("0.5.11", "text"), ("0.5.19", "json"), ("0.5.23", "text")])
def test_servers_that_assign_their_own_rids_are_tied_by_bootstrap_room(release: str, form: str,
                                                                      tmp_path: Path) -> None:
    """Each server its own rid: read by rid, a finding lists every transfer whose two sides
    disagree on the request; read with --request-ids room, the case holds what the set with
    shared rids gives (same records, request ids aside), each side's far node named, and the
    replay confirms it with no disagreement."""
    from replay.replay import logged_engine_of, replay

    _own_rids(release, form, tmp_path / "own")
    by_rid = tmp_path / "by_rid.duckdb"
    forensics.investigate([tmp_path / "own"], by_rid)
    with forensics.Case(by_rid) as c:
        (differ,) = [f for f in c.findings() if f.id == "evidence.request_ids_differ"]
    con = duckdb.connect(str(by_rid), read_only=True)
    both_sides = con.execute("SELECT count(DISTINCT transfer_id) FROM transfer_records GROUP BY transfer_id "
                             "HAVING count(DISTINCT node) > 1").fetchall()
    assert differ.count == len(both_sides) > 0
    con.close()

    room = Options(request_ids="room")
    cases = {}
    for name, folder in (("shared", ROOT / release / form), ("own", tmp_path / "own")):
        cases[name] = tmp_path / f"{name}.duckdb"
        forensics.investigate([folder], cases[name], options=room)
    kept = ("kind, node, ts, request_id, event, status, finish_reason, tokens, prompt_tokens, output_tokens, "
            "transfer_id, src_node, dst_node, tenant_id")
    rows = {}
    for name, case in cases.items():
        with forensics.Case(case) as c:
            assert not any(f.id == "evidence.request_ids_differ" for f in c.findings())
        con = duckdb.connect(str(case), read_only=True)
        rows[name] = sorted(map(str, con.execute(f"SELECT {kept} FROM records").fetchall()))
        named = _rows(con, "SELECT src_node, dst_node FROM transfers WHERE transfer_id IN (SELECT transfer_id "
                           "FROM transfer_records GROUP BY transfer_id HAVING count(DISTINCT node) > 1)")
        assert named and all("unknown" not in (t["src_node"], t["dst_node"]) for t in named)
        con.close()
    assert rows["own"] == rows["shared"]
    result = replay(cases["own"], logged_engine_of(cases["own"]) or "sglang-placeholder", tmp_path / "replay")
    assert result.not_replayed == 0  # (the request decode retracted, its id the room's here: its node and kind)
    assert sorted((d.node, d.kind) for d in result.disagreements) == sorted(
        (node, kind) for _, node, kind in retractions(_source(release)))
    assert result.exposure == replay(cases["shared"], logged_engine_of(cases["shared"]) or "sglang-placeholder",
                                     tmp_path / "replay2").exposure


@pytest.mark.parametrize(("release", "form"), [("0.5.11", "text"), ("0.5.19", "json"), ("0.5.23", "text")])
def test_servers_that_each_assigned_every_rid_are_tied_by_room_without_being_told(release: str, form: str,
                                                                                  tmp_path: Path) -> None:
    """No client's or router's rid at all: both servers logged ids of their own (uuid4 hex) for
    every request. With no option the adapter names each request by its bootstrap room, as
    --request-ids room does, says so in a note, and no transfer is left untied; --request-ids rid
    still forces the rids (and the finding then says the sides are not tied)."""
    _own_rids(release, form, tmp_path / "own", sides=("prefill", "decode"))
    auto, forced, by_rid = (tmp_path / f"{n}.duckdb" for n in ("auto", "forced", "by_rid"))
    forensics.investigate([tmp_path / "own"], auto)
    forensics.investigate([tmp_path / "own"], forced, options=Options(request_ids="room"))
    forensics.investigate([tmp_path / "own"], by_rid, options=Options(request_ids="rid"))
    kept = "kind, node, ts, request_id, event, status, tokens, prompt_tokens, output_tokens, transfer_id"
    rows = {}
    for case in (auto, forced):
        with forensics.Case(case) as c:
            assert not any(f.id == "evidence.request_ids_differ" for f in c.findings())
        con = duckdb.connect(str(case), read_only=True)
        rows[case] = sorted(map(str, con.execute(f"SELECT {kept} FROM records").fetchall()))
        noted = {k for (k,) in con.execute("SELECT DISTINCT key FROM file_notes").fetchall()}
        assert ("request_ids" in noted) == (case == auto)
        served = con.execute("SELECT count(*) FROM requests WHERE delivered AND request_id LIKE 'room-%'").fetchone()
        assert served is not None and served[0] > 0
        con.close()
    assert rows[auto] == rows[forced]
    with forensics.Case(by_rid) as c:
        assert any(f.id == "evidence.request_ids_differ" for f in c.findings())


def test_what_clients_got_is_held_to_the_finish_lines(tmp_path: Path) -> None:
    """uvicorn's access lines (the status each client got) agree, status by status, with the
    finish lines and the tokenizer's 400s in every server log of every release; a server whose
    access lines say otherwise gets the finding, with both counts."""
    from forensics.adapters.sglang.adapter import _learn
    from forensics.adapters.sglang.log import Facts, Server

    counted = 0
    for path in sorted(p for p in ROOT.rglob("*.log") if p.parent.name in ("text", "json", "text-ms")):
        text = path.read_text()
        lines = lambda text=text: enumerate(text.splitlines(), 1)  # noqa: E731
        facts = _learn(lines, Facts(Server(node="n")), Options())
        assert sum(facts.seen.access.values()) == text.count('"POST /generate HTTP/1.1"'), path
        counted += bool(facts.seen.access)
        notes = Notes()
        adapter = next(a for a in SGLANG if a.sniff(text.splitlines()[:64]))
        assert adapter.translate is not None
        for _ in translated(adapter, lines, path, Options(), notes):
            pass
        assert not [t for t in notes.lines() if "HTTP statuses" in t], path
    assert counted == len(SETS) * 2  # (both servers of every set print them)

    log = (ROOT / "0.5.23" / "text" / "decode-0.log").read_text()
    served = log.rindex('"POST /generate HTTP/1.1" 200 OK')
    (tmp_path / "decode-0.log").write_text(log[:served] + '"POST /generate HTTP/1.1" 502 Bad Gateway'
                                           + log[served + len('"POST /generate HTTP/1.1" 200 OK'):])
    forensics.investigate([tmp_path / "decode-0.log"], tmp_path / "case.duckdb")
    with forensics.Case(tmp_path / "case.duckdb") as case:
        (differs,) = [f for f in case.findings() if f.id == "evidence.access_status_differs"]
    (text,) = differs.evidence["text"].to_list()
    # (4 of the 200s each side: the warmup of each DP rank, at start-up and at the restart)
    assert "access lines 7 x 200, 1 x 400, 5 x 500, 1 x 502; finish lines 8 x 200, 1 x 400, 5 x 500" in text


@pytest.mark.parametrize("release", [r for r, f in SETS if f == "text"])
def test_a_text_finish_takes_the_time_its_response_was_sent(release: str, tmp_path: Path) -> None:
    """meta_info's response_sent_to_client_ts (where the release's tokenizer sets it) makes a
    text finish line's whole second precise: each finished record is at that time exactly."""
    sent = {m[1]: float(m[2]) for m in re.finditer(
        r"'id': '([^']+)'.*?'response_sent_to_client_ts': ([0-9.e+]+)",
        (ROOT / release / "text" / "decode-0.log").read_text())}
    con, _, _ = _ingest(release, "text", tmp_path)
    finished = {r["request_id"]: r["ts"] for r in _rows(
        con, "SELECT request_id, ts FROM records WHERE event = 'finished' AND node LIKE 'decode-0%'")}
    log = (ROOT / release / "text" / "decode-0.log").read_text()
    has = "response_sent_to_client_ts" in log
    assert bool(sent) == has
    # the server's own warmup requests (bootstrap host 2.2.2.2; each finishes on its own line, where
    # before 0.5.18 they arrived as one batch) are no client's: no record
    warmups = set(re.findall(r"Finish: obj=GenerateReqInput\(.*?\brid='([^']+)'.*bootstrap_host='2\.2\.2\.2'", log))
    assert bool(warmups) == ("Start of pd disaggregation warmup" in log)
    assert not warmups & finished.keys()
    for rid, at in sent.items():
        if rid not in warmups:
            assert abs(finished[rid].timestamp() - at) < 1e-6, rid


def test_the_collector_is_given_back_as_it_was_however_the_translation_ends() -> None:
    """The first pass pauses Python's garbage collector and freezes what it kept; the collector
    is running and nothing is left frozen once the file is translated, or the translation is
    abandoned half way; where the caller had frozen objects of its own, they stay frozen."""
    import gc

    path = ROOT / "0.5.23" / "text" / "prefill-0.log"
    text = path.read_text().splitlines()
    lines = numbered(text)
    adapter = next(a for a in SGLANG if a.name == "sglang-server")
    assert adapter.translate is not None and gc.isenabled() and gc.get_freeze_count() == 0
    outcomes = translated(adapter, lines, path, Options(), Notes())
    next(outcomes)
    assert gc.isenabled() and gc.get_freeze_count() > 0  # (between the passes' lines: frozen, collecting)
    assert sum(1 for _ in outcomes) == len(text) - 1
    assert gc.isenabled() and gc.get_freeze_count() == 0
    abandoned = translated(adapter, lines, path, Options(), Notes())
    next(abandoned)
    abandoned.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    keep = [[1]]
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        assert sum(1 for _ in translated(adapter, lines, path, Options(), Notes())) == len(text)
        assert gc.get_freeze_count() == theirs and gc.isenabled()
    finally:
        gc.unfreeze()
    assert keep


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_the_scheduling_flags_each_release_prints_are_stated_on_its_configs(release: str, tmp_path: Path) -> None:
    """Schema v1.1's ``overlap_schedule`` and ``prefix_cache`` come from the ``server_args`` line as
    the release prints it: the run's servers with SGLang's defaults (overlap on, the prefix cache on
    prefill and off on decode), and servers started with ``--disable-overlap-schedule``,
    ``--disable-radix-cache`` and, where the release has it, the decode radix cache, with speculative
    decoding and the decode KV offloaded to host (lines/, printed by the release's code with those
    arguments). Every config of the server (each DP pool) states
    them, and the replay reads them back."""
    from replay.configs import assumptions, eviction_undecided
    from replay.configs import node_configs as _configs

    flagged = _source(release)["flag_lines"]
    assert {d["role"] for d in flagged} == {"prefill", "decode"}
    expected = {}
    for d in flagged:
        node = "prefill-0" if d["role"] == "prefill" else "decode-0"
        expected[node] = d["expected"]
    assert expected["decode-0"]["overlap_schedule"] is False and expected["decode-0"]["kv_offload"] is True
    for name, files, want in (
        ("defaults", [ROOT / release / "text" / f"{r}-0.log" for r in ("prefill", "decode")],
         {"prefill-0": {"prefix_cache": True, "hybrid_pool": False, "recurrent_state": False},
          "decode-0": {"overlap_schedule": True, "prefix_cache": False, "kv_offload": False, "hybrid_pool": False,
                       "recurrent_state": False}}),
        ("flags", [ROOT / release / d["file"] for d in flagged], expected),
    ):
        case = tmp_path / f"{name}.duckdb"
        forensics.ingest(files, case)
        con = duckdb.connect(str(case), read_only=True)
        docs = [(node, json.loads(doc)) for node, doc in con.execute(
            "SELECT node, doc FROM config_records ORDER BY node, file_id, line_no").fetchall()]
        configs = _configs(con)
        con.close()
        server = {n: n.split(".")[0].removesuffix("-flags") for n, _ in docs}  # (a node is named after its file)
        assert docs and set(server.values()) == {"prefill-0", "decode-0"}
        for node, doc in docs:
            assert {k: doc.get(k) for k in want[server[node]]} == want[server[node]], (name, node)
        for per in configs.values():
            for _, _, _, config in per:
                if config.role == "decode":
                    assert config.overlap_schedule is want["decode-0"]["overlap_schedule"]
                    assert "overlap_schedule" in config.said
        # (what the logs leave open is said: the 0.5.18 logs give releases 0.5.16-0.5.18, on both
        # sides of the change in how much prefill's prefix cache evicts, 0.5.17)
        spanning = any(c.role == "prefill" and c.caches_prefixes and eviction_undecided(c.engine, c.engine_version)
                       for per in configs.values() for _, _, _, c in per)
        assert spanning == (release == "0.5.18" and name == "defaults")
        said = assumptions(configs)
        assert len(said) == spanning
        assert all(a.startswith("the prefix cache evicting as its release range's last release does") for a in said)


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_a_kv_pool_of_another_layout_each_release_prints_is_stated_on_its_configs(release: str,
                                                                                 tmp_path: Path) -> None:
    """The lines a release's model runner prints as it makes a KV pool of another layout (lines/,
    printed by the release's own strings and loggers before the pool line): a hybrid sliding-window
    model's pools, from 0.5.11 an all-sliding-window model's and from 0.5.18 the unified memory pool
    give ``hybrid_pool: true`` on every config of the server; a hybrid linear-attention model's Mamba
    cache gives ``recurrent_state: true``. The
    replay lists a decode node's hybrid pool as a disagreement (its victims possible) and says what it
    assumed of the others."""
    from replay.configs import assumptions
    from replay.configs import node_configs as _configs
    from replay.drive import _unmodelled
    from replay.sglang_print.servers import LAYOUTS

    layouts = _source(release)["layout_lines"]
    has_unified = RELEASES.index(release) >= RELEASES.index("0.5.18")  # (--enable-unified-memory: 0.5.18 on)
    has_swa_only = RELEASES.index(release) >= RELEASES.index("0.5.11")  # (its pool configurator's all-SWA line)
    assert sorted({d["layout"] for d in layouts}) == ["linear", "swa", *(["swa_only"] if has_swa_only else []),
                                                      *(["unified"] if has_unified else [])]
    # (every line of a layout printed, in every release: its sizing line and its pool's for a hybrid one)
    assert all(d["printed"] == [m for _, m, _ in LAYOUTS[d["layout"]]] for d in layouts), layouts
    for d in layouts:
        path = ROOT / release / d["file"]
        lines = path.read_text().splitlines()
        pool = next(i for i, line in enumerate(lines) if "] max_total_num_tokens=" in line)
        assert all(any(m in line for line in lines[:pool]) for m in d["printed"]), d  # (before the pool line)
        case = tmp_path / f"{d['role']}-{d['layout']}.duckdb"
        result = forensics.ingest([path], case)
        assert result.records.quarantined == 0
        con = duckdb.connect(str(case), read_only=True)
        docs = [json.loads(doc) for (doc,) in con.execute("SELECT doc FROM config_records").fetchall()]
        configs = _configs(con)
        con.close()
        assert docs and all({k: doc.get(k) for k in d["expected"]} == d["expected"] for doc in docs), d
        kinds = [kind for per in configs.values() for _, _, _, c in per for kind, _ in _unmodelled(c)]
        said = assumptions(configs)
        hybrid, recurrent = d["expected"]["hybrid_pool"], d["expected"]["recurrent_state"]
        assert kinds == (["decode_hybrid_pool"] * len(docs) if hybrid and d["role"] == "decode" else [])
        assert any(a.startswith("a plain paged KV pool on") for a in said) == (hybrid and d["role"] == "prefill")
        assert any(a.startswith("the KV pages alone on") for a in said) == recurrent


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_a_cache_flush_each_release_prints_is_a_flush_record_on_each_pool(release: str, tmp_path: Path) -> None:
    """``flush_cache``'s lines as the release prints them (lines/, after each server's start-up):
    its "Cache flushed successfully!" from every scheduler to 0.5.12 and from each DP rank's
    stats-logging rank from 0.5.18, and first, asked while busy, its warning that it did not flush.
    Each pool the flush emptied (a DP rank's is a node of its own) gets one ``step`` record with
    ``running`` 0 and ``cache: "flushed"`` at the line's time; the warning gives none, nor does a
    second scheduler's repeat."""
    flushed = _source(release)["flush_lines"]
    assert {d["role"] for d in flushed} == {"prefill", "decode"}
    assert {d["printed_by"] for d in flushed} == {
        "every scheduler" if RELEASES.index(release) <= RELEASES.index("0.5.12") else "each DP rank's first scheduler"}
    for d in flushed:
        path = ROOT / release / d["file"]
        text = path.read_text()
        printed = text.count("] Cache flushed successfully!")
        assert printed >= len(d["flushed"]) and "] Cache not flushed because there are pending requests." in text
        case = tmp_path / f"{d['role']}.duckdb"
        result = forensics.ingest([path], case)
        assert result.records.quarantined == 0
        con = duckdb.connect(str(case), read_only=True)
        steps = con.execute("SELECT node, ts, running, steps, cache FROM step_records ORDER BY node").fetchall()
        con.close()
        file_node = path.name.removesuffix(".log")  # (a node is named after its file)
        assert [(node.replace(file_node, d["flushed"][0].split(".")[0]), running, n, cache)
                for node, _, running, n, cache in steps] == [(node, 0, None, "flushed") for node in d["flushed"]]
        assert {ts.strftime("%H:%M:%S") for _, ts, *_ in steps} == {"08:00:02"}


@pytest.mark.parametrize("release", sorted({r for r, _ in SETS}, key=RELEASES.index))
def test_a_retraction_each_release_prints_is_a_retraction_record_on_its_pool(release: str, tmp_path: Path) -> None:
    """``update_running_batch``'s line where the decode scheduler retracts running requests under
    memory pressure, built and logged by the release's own statements (``KV cache pool is full.
    Retract requests. #retracted_reqs: 1, ...``: lines/, after the decode server's start-up; at INFO
    in 0.5.5, a warning from 0.5.7), on every scheduler of the DP rank. The pool it freed pages of
    gets one ``step`` record with ``cache: "retracted"`` and no ``running`` at the line's time; the
    scripted run's line, where req-a2 was retracted, one on req-a2's DP rank."""
    (d,) = _source(release)["retract_lines"]
    path = ROOT / release / d["file"]
    text = path.read_text()
    assert text.count("] KV cache pool is full. Retract requests. #retracted_reqs: 1, ") >= 1
    case = tmp_path / "lines.duckdb"
    result = forensics.ingest([path], case)
    assert result.records.quarantined == 0
    with duckdb.connect(str(case), read_only=True) as con:
        steps = con.execute("SELECT node, ts, running, steps, cache FROM step_records").fetchall()
    file_node = path.name.removesuffix(".log")  # (a node is named after its file)
    assert [(node.replace(file_node, "decode-0"), running, n, cache) for node, _, running, n, cache in steps] == [
        (node, None, None, "retracted") for node in d["retracted"]]
    assert {ts.strftime("%H:%M:%S") for _, ts, *_ in steps} == {"08:00:03"}
    con, _, _ = _ingest(release, "text", tmp_path)
    retracted = {(node, cache) for node, cache in con.execute("SELECT node, cache FROM step_records "
                                                              "WHERE cache IS NOT NULL").fetchall()}
    con.close()
    assert retracted == {(node, "retracted") for _, node, _ in retractions(_source(release))}


_DECODE_STATS = re.compile(r"rid=(?P<rid>[\w-]+),.*type=decode\): (?:prealloc_queue_duration=(?P<whole>[\d.]+)ms|"
                           r"bootstrap_duration=(?P<bootstrap>[\d.]+)ms, alloc_wait_duration=(?P<wait>[\d.]+)ms), "
                           r"transfer_duration=(?P<transfer>[\d.]+)ms, .*entry_time=(?P<entry>[\d.]+)")


#: The releases whose time stats carry ``entry_time`` (the wall clock), with a text set
ENTRY_TIME = [r for r, f in SETS if f == "text" and RELEASES.index(r) >= RELEASES.index("0.5.12")]


@pytest.mark.parametrize("release", ENTRY_TIME)
def test_decode_takes_a_prompts_pages_when_its_preallocation_ends(release: str, tmp_path: Path) -> None:
    """A decode request's pages are taken at the end of its preallocation (``_pre_alloc`` in
    ``pop_preallocated``; ``decode_transfer_queue_entry_time`` right after), not at its arrival in
    the queue (``entry_time``): its ``admitted`` is ``entry_time`` plus the preallocation, which a
    real run prints as ``bootstrap_duration`` and ``alloc_wait_duration`` (the handshake seen
    done: ``set_bootstrap_done_time``), and its transfer lands ``transfer_duration`` later. Every
    release with ``entry_time`` (0.5.12 on), lines printed by its own code."""
    text = (ROOT / release / "text" / "decode-0.log").read_text()
    stats = {m["rid"]: m for m in map(_DECODE_STATS.search, text.splitlines()) if m is not None}
    assert stats and all(m["bootstrap"] is not None for m in stats.values())  # (as a real run prints them)
    con, _, _ = _ingest(release, "text", tmp_path)
    rows = _rows(con, "SELECT request_id, kind, event, ts FROM records WHERE node LIKE 'decode-0%' "
                      "AND ((kind = 'request' AND event = 'admitted') OR (kind = 'transfer' AND event = 'completed'))")
    con.close()
    at = {(r["request_id"], r["event"]): r["ts"].timestamp() for r in rows}
    checked = 0
    for rid, m in stats.items():
        if (rid, "admitted") not in at or (rid, "completed") not in at:
            continue
        prealloc = float(m["bootstrap"]) + float(m["wait"])
        assert at[(rid, "admitted")] == pytest.approx(float(m["entry"]) + prealloc / 1000, abs=2e-6), rid
        assert at[(rid, "completed")] - at[(rid, "admitted")] == pytest.approx(float(m["transfer"]) / 1000,
                                                                                abs=2e-6), rid
        checked += 1
    assert checked >= 3
