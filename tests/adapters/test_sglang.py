"""SGLang's logs in, canonical records out: fixtures written to SGLang's formats, and a
simulated run logged as SGLang would have logged it, replayed to the page logs' figures."""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import CommandRun

import forensics
from forensics.adapters import ADAPTERS, Adapter, Notes, Options, read_tenant_map, sniff, table
from forensics.adapters.sglang import ADAPTERS as SGLANG_ADAPTERS
from forensics.adapters.sglang.eras import releases_of
from forensics.adapters.sglang.log import py_value, split
from forensics.errors import BadOption, UnrecognisedFile
from forensics.ingestion.readers import translated
from replay.replay import replay
from replay.sglang_logs import write as write_sglang_logs
from replay.simulate import Deployment, shape, simulate
from replay.workload import synthetic

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2)


def _records(db: Path) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        rel = con.sql("SELECT f.path, r.* EXCLUDE (doc, rec_hash, page_ranges, max_page) "
                      "FROM records r JOIN files f USING (file_id) ORDER BY f.path, line_no, part")
        cols = rel.columns
        return [{k: v for k, v in zip(cols, row, strict=True) if v is not None} for row in rel.fetchall()]
    finally:
        con.close()


def _quarantine(db: Path) -> list[tuple[str, int, str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT f.path, line_no, reason, detail FROM quarantine JOIN files f USING (file_id) "
                           "ORDER BY f.path, line_no").fetchall()
    finally:
        con.close()


def _pick(records: list[dict[str, Any]], node: str, rid: str) -> list[tuple[Any, ...]]:
    return [(r["kind"], r.get("event"), r["ts"].strftime("%H:%M:%S.%f")) for r in records
            if r["node"] == node and r.get("request_id") == rid]


def test_a_prefill_and_a_decode_servers_logs_become_canonical_records(tmp_path: Path) -> None:
    db = tmp_path / "case.duckdb"
    result = forensics.ingest([FIXTURES], db, options=Options(tenant_from="custom_labels.tenant"))
    by_name = {Path(f.path).name: f for f in result.files}
    assert set(by_name) == {"prefill-0.log", "decode-0.log", "host_0.log"}
    assert {f.adapter for f in result.files} == {"sglang-server", "sglang-requests"}
    for f in result.files:  # the three counts add up, per file and in total
        c = f.counts
        assert c.read == c.ingested + c.duplicates + c.quarantined
    # ignored: server_args, weights, batch, uvicorn; the length error and the healthy finish
    # (read for what they say about the request, recorded through other lines)
    assert by_name["prefill-0.log"].ignored == 6
    records = _records(db)

    # the healthy request, end to end: prefill's view and decode's
    assert _pick(records, "prefill-0", "req-a") == [
        ("request", "received", "08:01:00.100000"), ("request", "prefill_started", "08:01:00.000000"),
        ("request", "prefill_done", "08:01:00.000000"), ("transfer", "completed", "08:01:00.000000")]
    received = next(r for r in records if r.get("event") == "received" and r["request_id"] == "req-a")
    assert (received["tenant_id"], received["prompt_tokens"], received["max_new_tokens"],
            received["prefill_node"]) == ("acme", 3000, 64, "prefill-0")
    # decode: landing and decode start counted back from the finish (text form: whole seconds)
    assert _pick(records, "decode-0", "req-a") == [
        ("request", "admitted", "08:01:00.000000"), ("transfer", "completed", "08:01:00.399700"),
        ("request", "decode_started", "08:01:00.400000"), ("request", "finished", "08:01:02.000000")]

    # the placeholder path: the prompt length comes from the length error, prefill sent 1 token
    b = [r for r in records if r.get("request_id") == "req-b"]
    got = {(r["node"], r["kind"], r.get("event")): r for r in b}
    assert got[("prefill-0", "request", "received")]["prompt_tokens"] == 900_000
    rejected = got[("prefill-0", "request", "rejected")]
    assert (rejected["reason"], rejected["limit_tokens"]) == ("input_too_long", 681_274)
    assert got[("prefill-0", "transfer", "completed")]["tokens"] == 1
    assert got[("decode-0", "request", "finished")]["status"] == 200  # the client got HTTP 200
    assert ("prefill-0", "request", "finished") not in got  # prefill's abort is not the client's answer

    # a failed transfer: both sides, one record per side however many ranks logged it
    c = {(r["node"], r["kind"], r.get("event")): r for r in records if r.get("request_id") == "req-c"}
    assert c[("prefill-0", "transfer", "failed")]["transfer_id"] == "room-1003"
    assert c[("decode-0", "transfer", "failed")]["dst_node"] == "decode-0"
    assert c[("decode-0", "request", "finished")]["status"] == 500
    assert ("decode-0", "request", "decode_started") not in c  # nothing landed, nothing read
    assert ("prefill-0", "transfer", "completed") not in c  # its time stats do not undo the failure
    assert ("prefill-0", "request", "prefill_done") in c
    assert by_name["prefill-0.log"].counts.duplicates == 1  # TP1's repeat of TP0's line

    # the pool lines become configs: 681,280 tokens of 64-token pages, page 0 reserved
    configs = {r["node"]: r for r in records if r["kind"] == "config"}
    assert (configs["prefill-0"]["pool_pages"], configs["prefill-0"]["role"]) == (10_646, "prefill")
    assert configs["decode-0"]["context_length"] == 1_048_576

    # lines recognised but not translatable are kept with their line and why
    assert [(Path(p).name, line, reason) for p, line, reason, _ in _quarantine(db)] == [
        ("decode-0.log", 13, "untranslatable"), ("prefill-0.log", 18, "untranslatable")]


def test_the_request_file_target_reads_like_the_servers_output(tmp_path: Path) -> None:
    """``--log-requests-target DIR`` files hold JSON request lines only; with --role and --node
    they give the decode records the server's output gives."""
    db = tmp_path / "case.duckdb"
    forensics.ingest([FIXTURES / "requests"], db, options=Options(node="decode-0", role="decode"))
    records = _records(db)
    assert [(r["request_id"], r["event"], r.get("status")) for r in records] == [
        ("req-a", "admitted", None), ("req-a", "finished", 200)]
    assert all(r["node"] == "decode-0" for r in records)


def test_tenants_come_from_a_map_or_a_field_and_unknown_ones_are_said(tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.csv"
    tenants.write_text("request_id,tenant_id\nreq-a,tenant-7\n")
    result = forensics.ingest([FIXTURES / "prefill-0.log"], tmp_path / "a.duckdb",
                              options=Options(tenants=read_tenant_map(tenants)))
    records = [r for r in _records(tmp_path / "a.duckdb") if r.get("event") == "received"]
    assert {r["request_id"]: r["tenant_id"] for r in records} == {
        "req-a": "tenant-7", "req-b": "unknown", "req-c": "unknown"}
    assert any("2 requests have no tenant" in n for n in result.files[0].notes)
    bad = tmp_path / "bad.csv"
    bad.write_text("rid;tenant\n")
    with pytest.raises(BadOption, match="request_id,tenant_id"):
        read_tenant_map(bad)


def test_json_and_text_request_lines_read_alike() -> None:
    from forensics.adapters.sglang.requests import parse

    text = split("[2026-09-14 08:01:02] Finish: obj=GenerateReqInput(text='a long prompt' ... 'its end', "
                 "input_ids=[1, 2] ... [8, 9], sampling_params={'max_new_tokens': 8}, rid='r1', "
                 "lora_path=<object at 0x7f00>), out={'meta_info': {'id': 'r1', 'finish_reason': "
                 "{'type': 'abort', 'message': 'x', 'status_code': <HTTPStatus.BAD_REQUEST: 400>}, "
                 "'prompt_tokens': 7, 'completion_tokens': 0}}", None)
    doc = {"timestamp": "2026-09-14T08:01:02.250000", "event": "request.finished", "rid": "r1",
           "obj": {"sampling_params": {"max_new_tokens": 8}, "rid": "r1"},
           "out": {"meta_info": {"id": "r1", "finish_reason": {"type": "abort", "message": "x", "status_code": 400},
                                 "prompt_tokens": 7, "completion_tokens": 0}}}
    as_json = split(json.dumps(doc), None)
    a, b = parse(text), parse(as_json)
    assert a is not None and b is not None
    assert (a.rid, a.meta["prompt_tokens"], a.aborted) == (b.rid, b.meta["prompt_tokens"], b.aborted) == ("r1", 7, True)
    assert as_json.ts == dt.datetime(2026, 9, 14, 8, 1, 2, 250000, tzinfo=dt.UTC)
    assert text.ts == dt.datetime(2026, 9, 14, 8, 1, 2, tzinfo=dt.UTC)
    assert py_value("f(a=-1, b=nan, c=(1, 2))") == {"__type__": "f", "a": -1, "b": "nan", "c": [1, 2]}


def test_times_without_a_year_need_one(tmp_path: Path) -> None:
    log = tmp_path / "decode-9.log"
    log.write_text("[09-14 08:01:02 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='r' "
                   "decode_req.req.bootstrap_room=5 with exception KVTransferError(bootstrap_room=5): gone\n")
    forensics.ingest([log], tmp_path / "a.duckdb")
    assert [q[2:] for q in _quarantine(tmp_path / "a.duckdb")] == [
        ("untranslatable", "the log time has no year; pass --year")]
    forensics.ingest([log], tmp_path / "b.duckdb", options=Options(year=2026))
    (failed,) = _records(tmp_path / "b.duckdb")
    assert failed["ts"] == dt.datetime(2026, 9, 14, 8, 1, 2, tzinfo=dt.UTC)
    assert (failed["event"], failed["node"]) == ("failed", "decode-9")


def test_the_registry_sniffs_each_format_and_refuses_a_name_twice(tmp_path: Path) -> None:
    assert list(ADAPTERS) == ["canonical", "sglang-requests", "sglang-server"]
    head = (FIXTURES / "prefill-0.log").read_text().splitlines()
    found = sniff(head)
    assert found is not None and found.name == "sglang-server"
    found = sniff((FIXTURES / "requests" / "host_0.log").read_text().splitlines())
    assert found is not None and found.name == "sglang-requests"
    found = sniff(['{"kind": "request", "ts": 0, "node": "n"}'])
    assert found is not None and found.name == "canonical"
    assert sniff(["just some text", "[2026-09-14 08:00:00] nothing of SGLang's"]) is None
    one = ADAPTERS["canonical"]
    with pytest.raises(ValueError, match="two adapters"):
        table(one, Adapter("canonical", "x", "y", lambda h: False, None))
    # a file no adapter recognises is refused by name; --format reads it anyway
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(UnrecognisedFile, match="--format"):
        forensics.ingest([other], tmp_path / "a.duckdb")
    forced = forensics.ingest([other], tmp_path / "a.duckdb", format="sglang-server")
    assert (forced.files[0].counts.read, forced.files[0].ignored) == (0, 1)
    with pytest.raises(BadOption, match="unknown --format"):
        forensics.ingest([other], tmp_path / "a.duckdb", format="vllm")


def _run(seed: int, n: int, tmp_path: Path) -> tuple[Path, dict[str, int]]:
    rng = random.Random(seed)
    arrivals = shape(synthetic(n, rng, rate=3.0), rng, SMALL, over_long=0.05, length_scale=0.5)
    full = tmp_path / "full"
    simulate(full, arrivals, deployment=SMALL, seed=seed)
    return full, forensics.investigate([full], tmp_path / "full.duckdb").exposure


@pytest.mark.parametrize("form", ["json", "text"])
@pytest.mark.parametrize(("seed", "n"), [(1, 400), (3, 600)])
def test_sglang_request_logs_plus_replay_give_the_page_logs_figures(
    seed: int, n: int, form: str, tmp_path: Path
) -> None:
    """JSON request logs have microseconds; text ones whole seconds, made precise by the
    decode time stats' clock (Facts.calibrate). Both give the page logs' figures."""
    full, logged = _run(seed, n, tmp_path)
    assert logged["exposed_responses"] > 0 and logged["cross_tenant_pairs"] > 0
    files, tenants = write_sglang_logs(full, tmp_path / "sglang", text=form == "text")
    case = tmp_path / "sglang.duckdb"
    found = forensics.investigate(files, case, options=Options(tenants=read_tenant_map(tenants)))
    assert found.ingest.records.quarantined == 0
    assert found.exposure["exposed_responses"] == 0  # request-level logs hold no page evidence
    result = replay(case, "sglang-placeholder", tmp_path / "replayed")
    assert result.not_replayed == 0
    assert result.exposure == logged
    assert replay(case, "sglang-hardened", tmp_path / "hardened").exposure["exposure_pairs"] == 0
    # the handoff's signature shows in the adapted records themselves
    found_ids = {f.id: f.count for f in forensics.Case(case).findings()}
    over_long = found_ids["handoff.rejected_but_transferred"]
    assert over_long > 0 and found_ids["handoff.coverage_mismatch"] == over_long
    assert "evidence.unknown_tenant" not in found_ids  # the map named every tenant


def test_text_logs_without_a_consistent_clock_fall_back_to_their_own_seconds() -> None:
    from forensics.adapters.sglang.log import Facts

    second = dt.datetime(2026, 9, 14, 8, 1, 2, tzinfo=dt.UTC)
    facts = Facts()
    facts.clock.steps = {"a": ((100.0, 0.0, 0.01, 0.0, 0.5), second), "b": ((200.25, 0.0, 0.01, 0.0, 0.5), second)}
    facts.calibrate()  # b ended 100 s after a, in the same logged second: a restart, not one clock
    assert facts.clock.offset is None and facts.clock.step_times("a") is None
    facts.clock.steps = {"a": ((100.0, 0.0, 0.01, 0.0, 0.5), second),
                   "b": ((101.2, 0.0, 0.01, 0.0, 0.5), second + dt.timedelta(seconds=1))}
    facts.calibrate()
    times = facts.clock.step_times("b")
    assert times is not None and second + dt.timedelta(seconds=1) <= times[3] < second + dt.timedelta(seconds=2)


def test_both_time_stats_formats_count_back_from_the_finish() -> None:
    """Older releases write ``prealloc_duration=...``, newer ones ``prealloc_queue_duration(...) = ...;``."""
    from forensics.adapters import Notes
    from forensics.adapters.sglang.log import Facts, Server
    from forensics.adapters.sglang.timestats import read, translate

    facts = Facts(Server(node="decode-1"))
    finish = dt.datetime(2026, 9, 14, 8, 1, 2, 500000, tzinfo=dt.UTC)
    facts.clock.finish_ts["r9"] = finish
    old = ("[2026-09-14 08:01:02 TP0] Req Time Stats(rid=r9, bootstrap_room=77, input len=5000, output len=8, "
           "type=decode): prealloc_duration=0.40ms, transfer_duration=18.00ms, queue_duration=0.25ms, "
           "forward_duration=200.00ms, start_time=81235.400")
    new = ("[2026-09-14 08:01:02 TP0] Req Time Stats(rid=r9, bootstrap_room=77, input len=5000, output len=8, "
           "type=decode): prealloc_queue_duration(0.40ms) = alloc_wait(0.10ms) + bootstrap(0.20ms) + other(0.10ms); "
           "transfer_duration=18.00ms; queue_duration=0.25ms, forward_duration=200.00ms, start=81235.400")
    for text in (old, new):
        line = split(text, None)
        stats = read(line, Options())
        assert stats is not None
        landed, started = translate(stats, line, facts, Options(), Notes())
        assert (landed["event"], landed["transfer_id"], landed["dst_node"]) == ("completed", "room-77", "decode-1")
        assert started["ts"] == "2026-09-14T08:01:02.300000Z"  # finish - forward
        assert landed["ts"] == "2026-09-14T08:01:02.299750Z"  # - queue


SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs"


def test_the_shipped_sglang_sample_is_the_sample_incident_as_sglang_0_5_19_logs_it(
        adapters_page_run: CommandRun, sample_case: Path) -> None:
    """sample_logs/glm53-incident-sglang was printed by SGLang 0.5.19's code (SOURCE.json; made
    by ``simulate --sglang-version 0.5.19``, which needs the wheel, so it is not remade here):
    read as that format era with nothing quarantined, its replay names the victims the sample's
    page records name, all eight figures, with no disagreement."""
    import gzip
    shipped = SAMPLE / "glm53-incident-sglang"
    source = json.loads((shipped / "SOURCE.json").read_text())
    assert (source["release"], source["sha256"][:12]) == ("0.5.19", "425e87377e72")
    logs = sorted(shipped.glob("*.log.gz"))
    assert [p.name for p in logs] == [f"{r}-{i}.log.gz" for r in ("decode", "prefill") for i in range(4)]
    for path in logs:
        lines = gzip.decompress(path.read_bytes()).decode().splitlines()
        adapter = next(a for a in SGLANG_ADAPTERS if a.sniff(lines[:64]))
        notes = Notes()
        assert adapter.translate is not None
        for _ in translated(adapter, lambda ls=lines: enumerate(ls, 1), path, Options(), notes):
            pass
        (era,) = [t for t in notes.lines() if "in the format of SGLang" in t]
        assert "0.5.19" in (releases_of(era.rsplit(" ", 1)[-1]) or []), (path.name, era)
    with forensics.Case(sample_case, read_only=True) as case:  # (forensics.investigate([SAMPLE / "glm53-incident"]))
        logged = dict(case.summary())
    # the whole job, as README's command runs it (docs/adapters.md's, once a session): ingest, replays, fill, report
    job, folder = adapters_page_run.job, adapters_page_run.folder
    found = job.investigation.ingest
    assert found.records.quarantined == 0
    assert {(folder / p.path).resolve() for p in found.skipped} == {
        shipped / n for n in ("README.md", "SOURCE.json", "tenants.json")}
    assert job.replays[0].exposure == logged
    assert job.replays[0].disagreements == ()
    with forensics.Case(folder / "sglang-case.duckdb", read_only=True) as case:
        rows = case.exposures(delivered_only=True)  # the replay's rows come with their evidence
        assert rows["reader_request"].n_unique() == logged["exposed_responses"]
        assert set(rows["evidence"]) == {"transfer records + replay"}  # the prefill side logged one token sent
        assert case.exposures(page_records_only=True).is_empty()
        reader = rows["reader_request"][0]
        assert not case.request(reader).saw.is_empty()
    # the report's summary says what the replay found, and on what it rests
    text = " ".join((folder / "sglang-report.html").read_text().split())
    assert (f"the replay names {logged['exposed_responses']} delivered responses that attended to other "
            f"requests' content</b>, from {logged['victim_requests']} other requests") in text



def test_a_request_line_whose_text_holds_an_access_line_is_read_as_a_request_line() -> None:
    """A prompt may hold anything, an access line's text too: a request line is read as one
    (not counted as an HTTP status a client got), and an access line still as an access line."""
    from forensics.adapters.sglang.formats import read_line
    from forensics.adapters.sglang.requests import RequestLine

    spoof = ('[2026-11-02 08:00:02] Receive: obj=GenerateReqInput(rid=\'r1\', text=\'x - "POST /generate '
             'HTTP/1.1" 500 Internal Server Error\', sampling_params={\'max_new_tokens\': 8})')
    _, k, value = read_line(spoof, Options())
    assert k == 0 and isinstance(value, RequestLine) and value.rid == "r1"
    _, k, value = read_line('INFO:     10.0.0.2:51822 - "POST /generate HTTP/1.1" 500 Internal Server Error',
                            Options())
    assert (k, value) == (-1, 500)


def test_record_times_are_rfc3339_utc_to_the_microsecond_from_any_zone() -> None:
    """rfc3339 against the standard library's isoformat, over random times and zones."""
    from forensics.adapters.sglang.log import rfc3339

    rng = random.Random(7)
    start = dt.datetime(1900, 1, 1, tzinfo=dt.UTC)
    for _ in range(5_000):
        ts = start + dt.timedelta(microseconds=rng.randrange(200 * 365 * 86_400 * 10**6))
        want = ts.isoformat(timespec="microseconds").removesuffix("+00:00") + "Z"
        zone = dt.timezone(dt.timedelta(minutes=rng.randrange(-720, 841)))
        assert rfc3339(ts) == rfc3339(ts.astimezone(zone)) == want


def test_user_text_is_looked_for_as_its_three_forms_say() -> None:
    """The one-scan test for user text against its definition: ``text='``, ``text="`` or
    ``'text': `` in the line, over random strings of the pieces that make them and near misses."""
    from forensics.adapters.sglang.requests import _has_text

    rng = random.Random(3)
    pieces = ["text", "'", '"', "=", ": ", " ", "x", "te", "xt", "'text'", "text=", ",", "con"]
    found = 0
    for _ in range(50_000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        want = "text='" in s or 'text="' in s or "'text': " in s
        assert _has_text(s) == want, s
        found += want
    assert 1_000 < found < 49_000
