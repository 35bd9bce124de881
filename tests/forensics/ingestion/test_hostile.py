"""Hostile and broken input: a bad record is quarantined with why and the ingest goes on, a bad
file is refused alone, nothing is held whole that could be unbounded, nothing outside the case is
touched, and the counts always add up."""

from __future__ import annotations

import datetime as dt
import decimal
import gzip
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import forensics
from forensics.errors import CaseError, UnreadableFile
from forensics.ingestion import readers
from forensics.ingestion.pipeline import _strict_json_ok
from forensics.ingestion.readers import KEPT_OF_LONG_LINE, Limits, readahead, tables
from forensics.ingestion.readers.lines import _line_blocks
from forensics.store import connect

TS = "2026-09-14T08:00:00Z"
PATHS = [pytest.param(True, id="fast path"), pytest.param(False, id="sql path")]


def config(node: str = "decode-0", **changes: Any) -> dict[str, Any]:
    return {"kind": "config", "ts": TS, "node": node, "seq": 0, "role": "decode", "engine": "e",
            "engine_version": "1", "model": "m", "context_length": 1024, "page_size": 16, "pool_pages": 64,
            **changes}


def kv(seq: int, node: str = "decode-0") -> dict[str, Any]:
    return {"kind": "kv", "ts": TS, "node": node, "seq": seq, "request_id": "r", "op": "alloc", "pages": "1-2"}


def assert_adds_up(result: forensics.IngestResult) -> None:
    for f in result.files:
        c = f.counts
        assert c.read == c.ingested + c.duplicates + c.quarantined, f
        if f.status == "refused":
            assert c.read == 0 and f.why
    r = result.records
    assert r.read == r.ingested + r.duplicates + r.quarantined


def quarantine(db: Path) -> list[tuple[int, str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT line_no, reason, detail FROM quarantine ORDER BY line_no").fetchall()
    finally:
        con.close()


# --- --db opens only a case --------------------------------------------------------------------


def test_a_log_given_as_the_case_is_refused_and_left_untouched(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "router.jsonl", [config()])
    before = log.read_bytes()
    with pytest.raises(CaseError, match="not a DuckDB file"):
        forensics.investigate([log], log)
    assert log.read_bytes() == before
    csv_file = tmp_path / "a.csv"
    csv_file.write_text("kind,ts,node\n")
    with pytest.raises(CaseError, match="not a DuckDB file"):
        forensics.ingest([log], csv_file)
    assert csv_file.read_text() == "kind,ts,node\n"


def test_a_duckdb_file_that_is_no_case_is_refused_and_left_untouched(tmp_path: Path) -> None:
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE mine (a INTEGER)")
    con.close()
    log = write_jsonl(tmp_path / "a.jsonl", [config()])
    with pytest.raises(CaseError, match="not a kvforensics case"):
        forensics.ingest([log], other)
    con = duckdb.connect(str(other), read_only=True)
    assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("mine",)]
    con.close()


def test_a_new_path_in_new_folders_becomes_a_case_and_an_empty_file_is_refused(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [config()])
    assert forensics.ingest([log], tmp_path / "new" / "deeper" / "case.duckdb").records.ingested == 1
    empty = tmp_path / "mktemp.duckdb"
    empty.touch()
    with pytest.raises(CaseError, match="an empty file, not a case"):
        forensics.ingest([log], empty)
    assert empty.stat().st_size == 0
    with pytest.raises(CaseError, match="not a regular file"):
        connect(Path("/dev/null"))


# --- one line never stops an ingest ----------------------------------------------------------


@pytest.mark.parametrize("fast", PATHS)
def test_deeply_nested_json_is_quarantined_and_the_ingest_goes_on(tmp_path: Path, fast: bool) -> None:
    deep = "[" * 1000 + "NaN" + "]" * 1000
    lines = [deep, json.dumps(config()), '{"kind": "config", "a": ' + "[" * 1000 + "1," + "]" * 1000 + "}",
             '{"kind": "config", "a": ' + "[" * 100_000 + "]" * 100_000 + "}", json.dumps(kv(1))]
    log = tmp_path / "a.jsonl"
    log.write_text("\n".join(lines) + "\n")
    result = forensics.ingest([log], tmp_path / "case.duckdb", fast=fast)
    assert_adds_up(result)
    assert (result.records.ingested, result.records.quarantined) == (2, 3)
    assert [(n, r) for n, r, _ in quarantine(tmp_path / "case.duckdb")] == [
        (1, "not_json"), (3, "not_json"), (4, "missing_field")]


JSON_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='ab", ]}nan\\', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="ab", max_size=2), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUE, st.sampled_from(["", ",", " , ", "NaN", "-Infinity"]), st.integers(0, 40))
def test_the_strict_json_scan_agrees_with_pythons_parser(value: Any, lenient: str, where: int) -> None:
    """The scan that replaced json.loads (which recurses) refuses exactly the lenient lines DuckDB takes."""
    text = json.dumps(value)
    if lenient and where < len(text):  # a lenient token put in somewhere: DuckDB decides if it is JSON at all
        text = text[:where] + lenient + text[where:]
    con = duckdb.connect()
    valid = con.execute("SELECT json_valid(?)", [text]).fetchone() == (True,)
    con.close()
    if not valid:
        return
    try:
        json.loads(text, parse_constant=lambda t: (_ for _ in ()).throw(ValueError(t)))
        strict = True
    except ValueError:
        strict = False
    assert _strict_json_ok(text) == strict, text


# --- bounds: the longest line, the largest expansion ---------------------------------------------


@pytest.mark.parametrize("fast", PATHS)
@pytest.mark.parametrize("crlf", [False, True])
def test_a_line_past_the_limit_is_quarantined_with_its_start_kept(
    tmp_path: Path, fast: bool, crlf: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(readahead, "PLAIN_READ_BYTES", 20_000)
    monkeypatch.setattr(tables, "CHUNK_BYTES", 20_000)
    end = "\r\n" if crlf else "\n"
    huge = '{"kind": "kv", "pad": "' + "x" * 100_000 + '"}'  # past several reads
    long = '{"kind": "kv", "pad": "' + "y" * 9_000 + '"}'  # past the limit, inside one read
    lines = [json.dumps(config()), huge, json.dumps(kv(1)), long, json.dumps(kv(2))]
    log = tmp_path / "a.jsonl"
    log.write_bytes(end.join(lines).encode() + end.encode())
    db = tmp_path / "case.duckdb"
    result = forensics.investigate([log], db, fast=fast, limits=Limits(max_line_bytes=8192)).ingest
    assert_adds_up(result)
    assert (result.records.read, result.records.ingested) == (5, 3)
    found = quarantine(db)
    assert [(n, r) for n, r, _ in found] == [(2, "unreadable"), (4, "unreadable")]
    assert f"a line of {len(huge):,} bytes" in found[0][2] and f"a line of {len(long):,} bytes" in found[1][2]
    case = forensics.Case(db, read_only=True)
    kept = case.verbatim([(1, 2), (1, 4), (1, 5)])["text"].to_list()
    case.close()
    assert kept == [huge[:KEPT_OF_LONG_LINE], long[:KEPT_OF_LONG_LINE], lines[4]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 12_000), min_size=1, max_size=12), st.integers(4_000, 30_000), st.booleans(),
       st.sampled_from([None, 3]))
def test_blocks_keep_every_line_and_cut_only_the_long_ones(
    tmp_path: Path, lengths: list[int], read_bytes: int, last_newline: bool, per_block: int | None,
) -> None:
    limit = 8192
    body = [bytes([97 + i % 26]) * n for i, n in enumerate(lengths)]
    content = b"\n".join(body) + (b"\n" if last_newline else b"")
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    log = readers.LogFile(path, "jsonl", "none", fast=False, limits=Limits(max_line_bytes=limit))
    got, longs, line = b"", {}, 1
    for data, first, ends, long in _line_blocks(log, per_block, read_bytes):
        assert first == line and np.array_equal(ends, np.flatnonzero(data == 10))
        longs.update({first + i: n for i, n in long.items()})
        got += bytes(data)
        line += len(ends)
    lines = body if last_newline else (body[:-1] if body[-1] == b"" else body)
    assert got == b"".join((x if len(x) <= limit else x[:KEPT_OF_LONG_LINE]) + b"\n" for x in lines)
    assert longs == {i + 1: len(x) for i, x in enumerate(lines) if len(x) > limit}


def _bomb(path: Path, size: int, compress: str) -> Path:
    data = b"\0" * size
    path.write_bytes(gzip.compress(data, 1) if compress == "gzip" else zstandard.ZstdCompressor(level=3).compress(data))
    return path


@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_a_decompression_bomb_is_refused_and_the_other_files_go_in(tmp_path: Path, compress: str) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", [config()])
    _bomb(logs / ("b.jsonl.gz" if compress == "gzip" else "b.jsonl.zst"), 40 << 20, compress)
    write_jsonl(logs / "c.jsonl", [kv(1)])
    result = forensics.ingest([logs], tmp_path / "case.duckdb", limits=Limits(max_expansion=2))
    assert_adds_up(result)
    assert [f.status for f in result.files] == ["ingested", "refused", "ingested"]
    assert "decompression bomb" in (result.refused[0].why or "")
    # within the bound, the same file is read: one line of zeros, too long, quarantined
    again = forensics.ingest([logs], tmp_path / "case.duckdb", limits=Limits(max_expansion=100_000))
    assert [f.status for f in again.files] == ["already_in_case", "ingested", "already_in_case"]
    assert again.files[1].counts.quarantined == 1


# --- files that are not regular, and names that are hostile -----------------------------------


def test_special_files_are_refused_by_name_and_passed_over_in_folders(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", [config()])
    os.mkfifo(logs / "fifo.jsonl")
    (logs / "zero.jsonl").symlink_to("/dev/zero")
    (logs / "broken.jsonl").symlink_to(logs / "nowhere")
    result = forensics.ingest([logs], tmp_path / "case.duckdb")
    assert result.records.ingested == 1
    assert {(Path(p.path).name, p.why) for p in result.skipped} == {
        ("fifo.jsonl", "not a regular file (a FIFO)"), ("zero.jsonl", "not a regular file (a character device)"),
        ("broken.jsonl", "a broken symbolic link")}
    for named in (logs / "fifo.jsonl", logs / "zero.jsonl", Path("/dev/urandom")):
        with pytest.raises(UnreadableFile, match="only regular files are read"):
            forensics.ingest([named], tmp_path / "case.duckdb")


def test_file_names_that_are_not_utf8_or_hold_newlines_are_read_and_kept_escaped(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    odd = os.fsdecode(b"bad\xff.jsonl")
    forged = "x\ntotal: 9 read.jsonl"
    write_jsonl(logs / odd, [config()])
    write_jsonl(logs / forged, [kv(1)])
    result = forensics.ingest([logs], tmp_path / "case.duckdb")
    assert result.records.ingested == 2
    names = sorted(Path(f.path).name for f in result.files)
    assert names == ["bad\\xff.jsonl", forged]
    json.dumps(result.as_dict()).encode("utf-8")  # every path is valid text


# --- CSV and Parquet --------------------------------------------------------------------------


def test_a_csv_row_that_cannot_be_read_is_quarantined_alone(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(b"kind,ts,node,seq,role,engine,engine_version,model,context_length,page_size,pool_pages\n"
                     b"config,2026-09-14T08:00:00Z,n1,0,decode,e,1,m,10,1,10\n"
                     b"config,2026-09-14T08:00:00Z,n\xff2,0,decode,e,1,m,10,1,10\n"
                     b"config,2026-09-14T08:00:00Z,n3,0\n"
                     b"config,2026-09-14T08:00:00Z,n4,0,decode,e,1,m,10,1,10\n")
    result = forensics.ingest([path], tmp_path / "case.duckdb")
    assert_adds_up(result)
    assert (result.records.read, result.records.ingested) == (4, 2)
    found = quarantine(tmp_path / "case.duckdb")
    assert [(n, r) for n, r, _ in found] == [(3, "unreadable"), (4, "unreadable")]
    assert "not valid UTF-8" in found[0][2] and "4 cells, its header has 11" in found[1][2]


def test_parquet_columns_of_any_type_are_read(tmp_path: Path) -> None:
    table = pa.table({
        "kind": ["config", "config"], "ts": ["2026-09-14T08:00:00Z"] * 2, "node": ["a", "b"], "seq": [0, 0],
        "role": ["decode"] * 2, "engine": ["e"] * 2, "engine_version": ["1"] * 2, "model": ["m"] * 2,
        "context_length": pa.array([decimal.Decimal(10), decimal.Decimal("10.5")], pa.decimal128(5, 1)),
        "page_size": [1, 1], "pool_pages": [10, 10],
        "blob": pa.array([b"\x00\xff", b"ok"], pa.binary()),
        "day": pa.array([dt.date(2026, 9, 14)] * 2, pa.date32()),
        "took": pa.array([dt.timedelta(seconds=1)] * 2, pa.duration("ms")),
    })
    pq.write_table(table, tmp_path / "a.parquet")
    result = forensics.ingest([tmp_path / "a.parquet"], tmp_path / "case.duckdb")
    assert_adds_up(result)
    assert (result.records.ingested, result.records.quarantined) == (1, 1)  # 10.5 is no integer
    assert [r for _, r, _ in quarantine(tmp_path / "case.duckdb")] == ["wrong_type"]


# --- times and values -------------------------------------------------------------------------

TIMES = [
    ("2026-09-14T08:00:00Z", "2026-09-14 08:00:00+00"),
    ("2026-09-14t08:00:00z", "2026-09-14 08:00:00+00"),
    ("2026-09-14 08:00:00.5+02:00", "2026-09-14 06:00:00.5+00"),
    ("2016-12-31T23:59:60Z", "2017-01-01 00:00:00+00"),  # a leap second: the next second, with a note
    ("2026-09-14T24:00:00Z", "bad_ts"),
    ("2026-09-14T08:00:00+25:00", "bad_ts"),
    ("2026-09-14T08:00:00+05:60", "bad_ts"),
    ("2016-12-31T23:58:60Z", "bad_ts"),
    ("2026-02-30T00:00:00Z", "bad_ts"),
    ("0000-01-01T00:00:00Z", "bad_ts"),
    ("0001-01-01T00:00:00+14:00", "bad_ts"),
    ("1969-12-31T23:59:59Z", "bad_ts"),
    ("1970-01-01T00:30:00+01:00", "bad_ts"),
    ("2201-01-01T00:00:00Z", "bad_ts"),
    (9_223_372_036_854_775_807, "bad_ts"),
    (1_757_836_800_000_000_000, "2025-09-14 08:00:00+00"),
]


@pytest.mark.parametrize("fast", PATHS)
def test_times_are_rfc_3339_as_written_and_plausible(tmp_path: Path, fast: bool) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [config(f"n{i}", ts=t) for i, (t, _) in enumerate(TIMES)])
    result = forensics.ingest([log], tmp_path / "case.duckdb", fast=fast)
    assert_adds_up(result)
    assert result.files[0].notes == ("1 times at a leap second (hh:59:60) read as the next second",)
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    con.execute("SET TimeZone = 'UTC'")
    got = dict(con.execute("SELECT line_no, ts::VARCHAR FROM records").fetchall())
    got.update(dict(con.execute("SELECT line_no, reason FROM quarantine").fetchall()))
    assert con.execute("SELECT count(*) FROM quarantine WHERE raw IS NULL").fetchone() == (0,)  # kept verbatim
    con.close()
    assert [got[i + 1] for i in range(len(TIMES))] == [want for _, want in TIMES]


@pytest.mark.parametrize("fast", PATHS)
def test_values_no_deployment_has_are_quarantined_before_they_break_an_analysis(tmp_path: Path, fast: bool) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [
        config("a", pool_pages=2**63 - 1), config("b", context_length=2**41), config("c", pool_pages=2**40),
        {"kind": "request", "ts": TS, "node": "router", "request_id": "r", "event": "finished", "status": 10_000},
    ])
    db = tmp_path / "case.duckdb"
    result = forensics.investigate([log], db, fast=fast)
    assert (result.ingest.records.ingested, result.ingest.records.quarantined) == (1, 3)
    assert {r for _, r, _ in quarantine(db)} == {"bad_value"}
    with forensics.Case(db) as case:  # what went in analyses and reports
        assert case.findings() is not None


@pytest.mark.parametrize("fast", PATHS)
def test_quarantine_details_never_echo_what_the_record_holds(tmp_path: Path, fast: bool) -> None:
    secret = "SECRET-of-the-user"
    log = write_jsonl(tmp_path / "a.jsonl", [
        {"kind": secret, "ts": TS, "node": "n"}, config("a", role=secret), config("b", ts=secret),
        {"kind": "kv", "ts": TS, "node": "n", "seq": 1, "request_id": "r", "op": secret, "pages": "1"},
        {"kind": "kv", "ts": TS, "node": "n", "seq": 2, "request_id": "r", "op": "read", "pages": secret},
        {"kind": "request", "ts": TS, "node": "n", "request_id": "r", "event": secret},
    ])
    forensics.ingest([log], tmp_path / "case.duckdb", fast=fast)
    found = quarantine(tmp_path / "case.duckdb")
    assert len(found) == 6
    assert not [d for _, _, d in found if secret in d]
    assert forensics.quarantined(tmp_path / "case.duckdb")["detail"].str.contains(secret).sum() == 0
