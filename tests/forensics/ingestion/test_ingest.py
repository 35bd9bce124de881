"""Ingest: every record ends ingested, duplicate or quarantined, whatever the order or format."""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import example_dirs, write_jsonl
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import forensics
from forensics.errors import CaseError, CaseLocked, InputNotFound, UnrecognisedFile
from forensics.ingestion.pipeline import record_columns
from forensics.ingestion.readers import logfile
from forensics.schema import FIELDS, KIND_FIELDS, KINDS, VARIANTS
from forensics.store import SCHEMA_VERSION, connect

TS = "2026-08-27T10:00:00.000000Z"
CONFIG = {
    "kind": "config",
    "ts": TS,
    "node": "decode-0",
    "seq": 0,
    "role": "decode",
    "engine": "sglang",
    "engine_version": "0.5.21",
    "model": "glm-5.3",
    "context_length": 64,
    "page_size": 4,
    "pool_pages": 16,
}


def kv(
    seq: int, op: str = "alloc", pages: str = "1-3", rid: str = "r", **extra: Any
) -> dict[str, Any]:
    return {
        "kind": "kv",
        "ts": TS,
        "node": "decode-0",
        "seq": seq,
        "request_id": rid,
        "op": op,
        "pages": pages,
        **extra,
    }


def counts_add_up(result: forensics.IngestResult) -> None:
    for f in result.files:
        c = f.counts
        assert c.read == c.ingested + c.duplicates + c.quarantined
    r = result.records
    assert r.read == r.ingested + r.duplicates + r.quarantined


QUARANTINE_CASES = [
    ("not_json", '{"kind": "kv", "ts": '),
    ("not_json", '{"kind": "kv",}'),
    ("not_json", '{"kind": "kv", "ts": NaN}'),
    # DuckDB's parser takes these literals in any case; JSON has none of them
    ("not_json", json.dumps(kv(5))[:-1] + ', "note": nan}'),
    ("not_json", json.dumps(kv(5))[:-1] + ', "note": [-inf]}'),
    ("not_json", json.dumps(kv(5))[:-1] + ', "note":INFINITY}'),
    ("not_object", "[1, 2, 3]"),
    ("not_object", '"just a string"'),
    ("unknown_kind", json.dumps({**kv(5), "kind": "telemetry"})),
    ("unknown_op", json.dumps(kv(5, op="zero"))),
    (
        "unknown_event",
        json.dumps(
            {
                "kind": "request",
                "ts": TS,
                "node": "router",
                "request_id": "x",
                "event": "teleported",
            }
        ),
    ),
    (
        "unknown_event",
        json.dumps(
            {
                "kind": "transfer",
                "ts": TS,
                "node": "p",
                "transfer_id": "t",
                "request_id": "x",
                "event": "lost",
                "src_node": "p",
                "dst_node": "d",
            }
        ),
    ),
    ("missing_field", json.dumps({k: v for k, v in kv(5).items() if k != "seq"})),
    ("missing_field", json.dumps({k: v for k, v in kv(5).items() if k != "pages"})),
    (
        "missing_field",
        json.dumps(
            {
                "kind": "request",
                "ts": TS,
                "node": "router",
                "request_id": "x",
                "event": "received",
                "prompt_tokens": 3,
            }
        ),
    ),
    ("missing_field", json.dumps({**kv(5), "node": None})),
    ("wrong_type", json.dumps({**kv(5), "seq": "5"})),
    ("wrong_type", json.dumps({**kv(5), "seq": 5.0})),
    ("wrong_type", json.dumps({**kv(5), "request_id": 17})),
    ("wrong_type", json.dumps({**kv(5), "pages": [1, 2]})),
    ("bad_ts", json.dumps({**kv(5), "ts": "yesterday"})),
    ("bad_ts", json.dumps({**kv(5), "ts": "2026-02-30T00:00:00Z"})),
    ("bad_ts", json.dumps({**kv(5), "ts": "2026-08-27T10:00:00"})),
    ("negative_seq", json.dumps(kv(-1))),
    ("bad_pages", json.dumps(kv(5, pages="3-1"))),
    ("bad_pages", json.dumps(kv(5, pages=""))),
    ("bad_pages", json.dumps(kv(5, pages="1,,2"))),
    ("bad_pages", json.dumps(kv(5, pages="a-b"))),
    ("page_out_of_range", json.dumps(kv(5, pages="10-16"))),
    ("bad_value", json.dumps({**CONFIG, "seq": 9, "role": "janitor"})),
    ("bad_value", json.dumps({**kv(5), "boot": -1})),
]


@pytest.mark.parametrize(("reason", "line"), QUARANTINE_CASES)
def test_each_quarantine_reason(reason: str, line: str, tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps(CONFIG) + "\n" + line + "\n\n" + json.dumps(kv(1)) + "\n")
    result = forensics.ingest([log], tmp_path / "case.duckdb")
    counts_add_up(result)
    assert result.records.read == 3  # the blank line is not counted
    assert result.records.quarantined == 1
    q = forensics.quarantined(tmp_path / "case.duckdb", with_raw=True).to_dicts()
    assert [(r["line"], r["reason"], r["raw"]) for r in q] == [(2, reason, line)]


def test_ts_forms_become_one_utc_column(tmp_path: Path) -> None:
    log = write_jsonl(
        tmp_path / "a.jsonl",
        [
            kv(1, ts="2026-08-27T12:00:00.5+02:00"),
            kv(
                2,
                ts=int(dt.datetime(2026, 8, 27, 10, tzinfo=dt.UTC).timestamp()) * 10**9
                + 500_000_000,
            ),
            kv(3, ts="2026-08-27T10:00:00.500000Z"),
        ],
    )
    forensics.ingest([log], tmp_path / "c.duckdb")
    con = duckdb.connect(str(tmp_path / "c.duckdb"))
    values = {
        str(v) for (v,) in con.execute("SELECT ts AT TIME ZONE 'UTC' FROM records").fetchall()
    }
    assert values == {"2026-08-27 10:00:00.500000"}
    assert con.execute("SELECT DISTINCT boot FROM records").fetchall() == [(0,)]


def test_conflict_keeps_the_smaller_canonical_json_whatever_the_order(tmp_path: Path) -> None:
    a, b = kv(7, rid="aaa"), kv(7, rid="bbb")
    outcomes = set()
    for order in ([a, b], [b, a]):
        for split in (True, False):
            d = tmp_path / f"{order[0]['request_id']}{split}"
            files = (
                [write_jsonl(d / "1.jsonl", order[:1]), write_jsonl(d / "2.jsonl", order[1:])]
                if split
                else [write_jsonl(d / "1.jsonl", order)]
            )
            result = forensics.ingest(files, d / "case.duckdb")
            counts_add_up(result)
            con = duckdb.connect(str(d / "case.duckdb"))
            kept = con.execute("SELECT request_id FROM records").fetchall()
            lost = con.execute("SELECT reason, raw FROM quarantine").fetchall()
            con.close()
            outcomes.add((tuple(kept), tuple((r, json.loads(x)["request_id"]) for r, x in lost)))
    assert outcomes == {((("aaa",),), (("conflict", "bbb"),))}


def test_duplicates_within_and_across_files_and_key_order(tmp_path: Path) -> None:
    rec = kv(3)
    reordered = json.dumps(dict(reversed(list(rec.items()))), indent=None, separators=(", ", ": "))
    one = tmp_path / "1.jsonl"
    one.write_text(json.dumps(rec) + "\n" + reordered + "\n")
    two = write_jsonl(tmp_path / "2.jsonl", [rec, kv(4)])
    result = forensics.ingest([one, two], tmp_path / "case.duckdb")
    counts_add_up(result)
    assert result.records.as_dict() == {"read": 4, "ingested": 2, "duplicates": 2, "quarantined": 0}


def test_repeats_of_records_without_seq_are_found_where_keys_are_unique(tmp_path: Path) -> None:
    """Records with a seq have unique keys here, so only those without one can repeat: found still."""
    admitted = {"kind": "request", "ts": TS, "node": "router", "request_id": "r", "event": "admitted"}
    one = write_jsonl(tmp_path / "1.jsonl", [CONFIG, kv(1), admitted, kv(2), admitted])
    two = write_jsonl(tmp_path / "2.jsonl", [admitted, kv(3)])
    result = forensics.ingest([one, two], tmp_path / "case.duckdb")
    counts_add_up(result)
    assert result.records.as_dict() == {"read": 7, "ingested": 5, "duplicates": 2, "quarantined": 0}
    con = duckdb.connect(str(tmp_path / "case.duckdb"))
    assert con.execute("SELECT file_id, line_no FROM duplicates ORDER BY ALL").fetchall() == [(1, 5), (2, 1)]
    con.close()


@st.composite
def noisy_logs(draw: st.DrawFn) -> list[str]:
    """Lines with repeats, conflicts on (node, boot, seq) and broken records."""
    lines = []
    for _ in range(draw(st.integers(1, 25))):
        seq = draw(st.integers(0, 6))
        rid = draw(st.sampled_from(["a", "b", "c"]))
        choice = draw(st.integers(0, 9))
        if choice == 0:
            lines.append('{"kind": "kv", broken')
        elif choice == 1:
            lines.append(json.dumps(kv(-seq - 1, rid=rid)))
        else:
            lines.append(json.dumps(kv(seq, rid=rid, op=draw(st.sampled_from(["alloc", "free"])))))
    return lines


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(lines=noisy_logs(), seed=st.integers(0, 2**32))
def test_outcome_does_not_depend_on_file_order(
    lines: list[str], seed: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Totals and the set of ingested records are the same for any split and order of files."""
    tmp = tmp_path_factory.mktemp("order")
    outcomes = []
    for attempt in range(2):
        rng = random.Random(seed + attempt)
        shuffled = lines[:]
        rng.shuffle(shuffled)
        n = rng.randint(1, 3)
        d = tmp / str(attempt)
        d.mkdir()
        files = []
        contents = ["".join(x + "\n" for x in shuffled[i::n]) for i in range(n)]
        assume(len(set(contents)) == n)  # identical files are one piece of evidence
        for i, text in enumerate(contents):
            f = d / f"{i}.jsonl"
            f.write_text(text)
            files.append(f)
        rng.shuffle(files)
        result = forensics.ingest(files, d / "case.duckdb")
        counts_add_up(result)
        con = duckdb.connect(str(d / "case.duckdb"))
        kept = sorted(con.execute("SELECT node, boot, seq, request_id, op FROM records").fetchall())
        reasons = sorted(con.execute("SELECT reason FROM quarantine").fetchall())
        con.close()
        outcomes.append((result.records, kept, reasons))
    assert outcomes[0] == outcomes[1]
    keys = [k[:3] for k in outcomes[0][1]]
    assert len(keys) == len(set(keys))


def _case_rows(db: Path) -> tuple[list[Any], list[Any], int]:
    con = duckdb.connect(str(db))
    records = sorted(
        con.execute(
            "SELECT kind, node, boot, seq, request_id, op, pages, ts, tenant_id FROM records"
        ).fetchall(),
        key=repr,
    )
    quarantine = sorted(con.execute("SELECT line_no, reason FROM quarantine").fetchall())
    dups = con.execute("SELECT count(*) FROM duplicates").fetchall()[0][0]
    con.close()
    return records, quarantine, dups


def test_compressed_csv_and_parquet_give_the_same_case(tmp_path: Path) -> None:
    records = [
        CONFIG,
        {
            "kind": "request",
            "ts": TS,
            "node": "router",
            "request_id": "r",
            "event": "received",
            "tenant_id": "acme",
            "prompt_tokens": 12,
        },
        kv(1),
        kv(2, op="write", source="transfer"),
        kv(3, op="read"),
        kv(3, op="read"),
    ]
    plain = write_jsonl(tmp_path / "plain" / "log.jsonl", records)
    (tmp_path / "gz").mkdir()
    (tmp_path / "gz" / "log.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    (tmp_path / "zst").mkdir()
    (tmp_path / "zst" / "log.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(plain.read_bytes())
    )
    fields = sorted({k for r in records for k in r})
    (tmp_path / "csv").mkdir()
    with (tmp_path / "csv" / "log.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(records)
    (tmp_path / "pq").mkdir()
    rows = [{k: r.get(k) for k in fields} for r in records]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "log.parquet")
    cases = {}
    for name in ("plain", "gz", "zst", "csv", "pq"):
        result = forensics.ingest([tmp_path / name], tmp_path / f"{name}.duckdb")
        counts_add_up(result)
        assert result.records.as_dict() == {
            "read": 6,
            "ingested": 5,
            "duplicates": 1,
            "quarantined": 0,
        }
        cases[name] = _case_rows(tmp_path / f"{name}.duckdb")
    assert all(c == cases["plain"] for c in cases.values())


def test_reingest_changes_nothing_and_says_so(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [CONFIG, kv(1), kv(1)])
    first = forensics.ingest([log], tmp_path / "case.duckdb")
    again = forensics.ingest([log], tmp_path / "case.duckdb")
    assert [f.status for f in again.files] == ["already_in_case"]
    assert again.records == first.records and again.case == first.case
    more = write_jsonl(tmp_path / "b.jsonl", [kv(1), kv(2, op="free")])
    extended = forensics.ingest([more], tmp_path / "case.duckdb")
    assert extended.case.as_dict() == {"read": 5, "ingested": 3, "duplicates": 2, "quarantined": 0}


def test_manifest_records_each_file(tmp_path: Path) -> None:
    log = write_jsonl(tmp_path / "a.jsonl", [CONFIG, kv(1)])
    forensics.ingest([log], tmp_path / "case.duckdb")
    con = duckdb.connect(str(tmp_path / "case.duckdb"))
    row = con.execute(
        "SELECT path, size, sha256, toolkit_version, read, ingested FROM file_counts"
    ).fetchall()
    import hashlib

    assert row == [
        (
            str(log),
            log.stat().st_size,
            hashlib.sha256(log.read_bytes()).hexdigest(),
            forensics.__version__,
            2,
            2,
        )
    ]


def test_killed_ingest_leaves_a_consistent_case_and_a_rerun_completes_it(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    for i in range(6):
        write_jsonl(logs / f"{i}.jsonl", [kv(i * 100_000 + j, rid=f"r{i}") for j in range(40_000)])
    db = tmp_path / "case.duckdb"
    script = "import sys, forensics; forensics.ingest([sys.argv[1]], sys.argv[2])"
    proc = subprocess.Popen([sys.executable, "-c", script, str(logs), str(db)])
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        try:
            con = duckdb.connect(str(db), read_only=True)
        except duckdb.Error:
            time.sleep(0.05)
            continue
        con.close()
        break
    time.sleep(0.5)
    proc.kill()
    proc.wait()
    con = duckdb.connect(str(db))
    per_file = con.execute(
        "SELECT read, ingested + duplicates + quarantined FROM file_counts"
    ).fetchall()
    orphans = con.execute(
        "SELECT count(*) FROM records WHERE file_id NOT IN (SELECT file_id FROM files)"
    ).fetchall()
    con.close()
    assert all(a == b for a, b in per_file) and orphans == [(0,)]
    rerun = forensics.ingest([logs], db)
    assert rerun.case.as_dict() == {
        "read": 240_000,
        "ingested": 240_000,
        "duplicates": 0,
        "quarantined": 0,
    }


def test_examples_ingest_without_quarantine(tmp_path: Path) -> None:
    for i, example in enumerate(example_dirs()):
        result = forensics.ingest([example / "events.jsonl"], tmp_path / f"{i}.duckdb")
        assert result.records.quarantined == 0 and result.records.read > 0


def test_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(InputNotFound):
        forensics.ingest([tmp_path / "missing.jsonl"], tmp_path / "c.duckdb")
    odd = tmp_path / "notes.txt"
    odd.write_text("hello\n")
    with pytest.raises(UnrecognisedFile):
        forensics.ingest([odd], tmp_path / "c.duckdb")
    log = write_jsonl(tmp_path / "a.jsonl", [kv(1)])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('ready', flush=True); time.sleep(30)",
            str(tmp_path / "locked.duckdb"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(CaseLocked):
            forensics.ingest([log], tmp_path / "locked.duckdb")
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.parametrize(
    ("second", "unique"),
    [
        ([5, 6, 7], True),  # the next rotated file of the node: a range of its own
        ([2, 4, 9], False),  # within the first file's range (and seq 2 in both): checked in full
        ([7, 8, 7], False),  # a seq twice in the file
        ([1000, 1001, 1002], True),
    ],
)
def test_keys_are_unique_when_the_files_seqs_are_and_lie_outside_the_others(
    second: list[int], unique: bool, tmp_path: Path
) -> None:
    """The shortcut past the full repeat and conflict checks: taken only when it is safe. Its
    answer False only sends the file through the full checks, which the order tests hold."""
    from forensics.ingestion.settle import keys_unique

    con = _case_and_a_second_file(tmp_path, [("decode-0", seq) for seq in second])
    try:
        assert keys_unique(con, 2) is unique
    finally:
        con.close()


def _case_and_a_second_file(tmp_path: Path, keys: list[tuple[str, int]]) -> duckdb.DuckDBPyConnection:
    """A case of decode-0's seqs 1 to 3 (file 1), and a file 2 of page records at ``keys`` (node,
    seq; boot 0) put in by hand, not yet settled: the case as keys_unique sees a file come in."""
    db = tmp_path / "case.duckdb"
    forensics.ingest([write_jsonl(tmp_path / "1.jsonl", [kv(seq) for seq in (1, 2, 3)])], db)
    con = connect(db)
    con.execute("INSERT INTO files SELECT 2, 'x', size, 'other', format, compression, ingested_at, "
                "toolkit_version, records_read, adapter, lines_ignored FROM files")
    con.executemany("INSERT INTO kv_records (file_id, line_no, part, ts, node, boot, seq, rec_hash) "
                    "VALUES (2, ?, 0, now(), ?, 0, ?, ?)",
                    [(line, node, seq, 1000 + line) for line, (node, seq) in enumerate(keys, 1)])
    return con


@pytest.mark.parametrize("repeat", [False, True])
def test_keys_of_a_file_of_many_nodes_are_checked_in_one_query(repeat: bool, tmp_path: Path) -> None:
    """Past BITMAP_GROUPS (node, boot)s a file's keys are checked by one query (not a bitmap a
    node): a seq on two records of one of its 100 nodes is found there too."""
    from forensics.ingestion.settle import BITMAP_GROUPS, keys_unique

    keys = [(f"decode-{n + 1}", seq) for n in range(100) for seq in (1, 2, 3)] + ([("decode-58", 2)] if repeat else [])
    assert len({n for n, _ in keys}) > BITMAP_GROUPS
    con = _case_and_a_second_file(tmp_path, keys)
    try:
        assert keys_unique(con, 2) is not repeat
    finally:
        con.close()


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "sql path"])
def test_a_file_written_while_it_is_read_is_refused_and_left_out(
        tmp_path: Path, fast: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live log appended to (or truncated) during its ingest: what was read is not what was
    hashed, so the file is refused with a clear error and nothing of it stays in the case (and
    the reader stops where the file ended when opened, however fast it grows). On the fast path
    the file is read as a large one is, in blocks (a small one is read and hashed in one read,
    checked on the open file: test_many_files.py)."""
    if fast:
        monkeypatch.setattr(logfile, "SMALL_FILE", -1)
    log = write_jsonl(tmp_path / "a.jsonl", [kv(seq) for seq in range(1, 40)])
    db = tmp_path / "case.duckdb"

    def append(path: Path, done: int, total: int) -> None:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(kv(1000 + done)) + "\n")

    result = forensics.ingest([log], db, progress=append, fast=fast)
    assert [(f.status, f.why) for f in result.files] == [
        ("refused", "changed while it was read; ingest it again once nothing writes to it")]
    assert result.records.read == 0
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT (SELECT count(*) FROM files), (SELECT count(*) FROM records), "
                       "(SELECT count(*) FROM source_lines), (SELECT count(*) FROM refused_files)"
                       ).fetchone() == (0, 0, 0, 1)
    con.close()
    again = forensics.ingest([log], db)  # once nothing writes to it, it goes in whole
    assert again.records.ingested == len(log.read_text().splitlines()) > 39


@pytest.mark.parametrize("fails", [False, True])
def test_numpys_huge_pages_are_off_while_ingesting_and_back_after(tmp_path: Path, fails: bool) -> None:
    """Ingest keeps numpy's arrays on ordinary pages (no wait for the kernel to make huge ones), and
    gives numpy its setting back afterwards, whether the ingest succeeds or fails."""
    from forensics.ingestion.pipeline import huge_page_switch

    toggle = huge_page_switch()
    assert toggle is not None  # numpy 1.26 and later have it

    def current() -> bool:
        before = toggle(False)
        toggle(before)
        return bool(before)

    log = write_jsonl(tmp_path / "a.jsonl", [kv(seq) for seq in range(1, 40)])
    seen: list[bool] = []
    original = current()

    def watch(path: Path, done: int, total: int) -> None:
        seen.append(current())
        if fails:
            raise KeyboardInterrupt

    for setting in (True, False):
        toggle(setting)
        seen.clear()
        try:
            if fails:
                with pytest.raises(KeyboardInterrupt):
                    forensics.ingest([log], tmp_path / f"{setting}.duckdb", progress=watch)
            else:
                forensics.ingest([log], tmp_path / f"{setting}.duckdb", progress=watch)
            assert seen and not any(seen)
            assert current() is setting
        finally:
            toggle(original)


def test_a_case_of_another_schema_is_refused_not_extended(tmp_path: Path) -> None:
    """A case of another layout (schema 6: no ``cache`` of step records; 4: a verbatim line per
    record; 3: one records table) or whose records were hashed another way (schema 2: MD5) is not
    extended: it would be read wrong, or miss repeats."""
    db = tmp_path / "old.duckdb"
    forensics.ingest([write_jsonl(tmp_path / "a.jsonl", [kv(1)])], db)
    con = duckdb.connect(str(db))
    con.execute("UPDATE case_meta SET value = '4' WHERE key = 'schema_version'")
    con.execute("DROP VIEW kv_ops")  # what applying this version's schema would put back
    con.close()
    with pytest.raises(CaseError, match=f"case schema 4, this kvforensics reads schema {SCHEMA_VERSION}"):
        forensics.ingest([write_jsonl(tmp_path / "b.jsonl", [kv(2)])], db)
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM records").fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM duckdb_views() WHERE view_name = 'kv_ops'").fetchone() == (0,)
    con.close()


def test_a_duckdb_file_that_is_no_case_is_refused_read_only(tmp_path: Path) -> None:
    plain = tmp_path / "plain.duckdb"
    duckdb.connect(str(plain)).close()
    with pytest.raises(CaseError, match="not a kvforensics case"):
        forensics.Case(plain, read_only=True)


def test_each_kind_has_a_table_of_its_fields_and_records_has_them_all(tmp_path: Path) -> None:
    """The case's tables (sql/schema.sql) follow the schema's declaration (forensics/schema.py)."""
    con = connect(tmp_path / "case.duckdb")
    try:
        columns = record_columns(con)
        for kind in KINDS:
            fields = {*KIND_FIELDS[kind].required, *KIND_FIELDS[kind].optional}
            for variant in VARIANTS[kind].values():
                fields |= {*variant.required, *variant.optional}
            ranges = {"page_ranges", "max_page"} if kind == "kv" else set()
            assert set(columns[kind]) == {"ts", "node", "boot", "seq", "rec_hash", "doc"} | fields | ranges
        view = {c for (c,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'records'").fetchall()}
        assert view == set(FIELDS) | {"file_id", "line_no", "part", "page_ranges", "max_page", "rec_hash", "doc"}
    finally:
        con.close()


def test_a_kind_filter_on_records_reads_only_that_kinds_table(tmp_path: Path) -> None:
    db = tmp_path / "case.duckdb"
    forensics.ingest([write_jsonl(tmp_path / "a.jsonl", [kv(1), kv(2)])], db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        explain = con.execute("EXPLAIN SELECT count(*) FROM records WHERE kind = 'kv'").fetchall()
        plan = "\n".join(row[1] for row in explain)
        assert "kv_records" in plan
        assert not any(t in plan for t in ("config_records", "request_records", "transfer_records"))
        assert con.execute("SELECT kind, count(*) FROM records GROUP BY ALL").fetchall() == [("kv", 2)]
    finally:
        con.close()
