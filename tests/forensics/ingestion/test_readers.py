"""Reading JSON Lines in blocks of whole row groups, read ahead across the files of an ingest."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import duckdb
import numpy as np
import pytest
from conftest import write_jsonl
from hypothesis import given, settings
from hypothesis import strategies as st

import forensics
from forensics.ingestion import pipeline, readers
from forensics.ingestion.readers import LogFile, ReadAhead, readahead
from forensics.ingestion.readers.blocks import _split
from forensics.ingestion.readers.lines import _line_blocks

TS = "2026-08-27T10:00:00.000000Z"


def kv(node: str, seq: int) -> dict[str, object]:
    return {"kind": "kv", "ts": TS, "node": node, "seq": seq, "request_id": f"r{seq % 7}", "op": "alloc",
            "pages": f"{seq % 50}-{seq % 50 + 2}"}


def log_of(path: Path) -> LogFile:
    log = readers.identify(path, explicit=True)
    assert log is not None
    return log


def blocks_of(content: bytes, read_bytes: int, lines: int | None) -> list[tuple[bytes, int]]:
    """The blocks of a file of ``content``: the same whether it is plain or compressed."""
    found = []
    with tempfile.TemporaryDirectory() as tmp:
        for path, data in ((Path(tmp) / "a.jsonl", content), (Path(tmp) / "a.jsonl.gz", gzip.compress(content))):
            path.write_bytes(data)
            blocks = list(_line_blocks(log_of(path), lines, read_bytes))
            for block, _, ends, long in blocks:  # the line ends handed on are the block's newlines
                assert np.array_equal(ends, np.flatnonzero(block == 10))
                assert long == {}  # no line is longer than the reader's limit
            found.append([(bytes(block), first) for block, first, _, _ in blocks])
    plain, gzipped = found
    assert plain == gzipped
    return plain


def assert_whole_lines(blocks: list[tuple[bytes, int]], content: bytes) -> None:
    """The blocks are the file end to end (its BOM left out), each whole lines numbered on."""
    body = content.removeprefix(b"\xef\xbb\xbf")
    assert b"".join(b for b, _ in blocks) == (body if body.endswith(b"\n") or not body else body + b"\n")
    line = 1
    for data, first in blocks:
        assert data.endswith(b"\n") and first == line
        line += data.count(b"\n")


LINE = st.text(alphabet="ab{}\r", max_size=18).map(str.encode)


@settings(max_examples=200, deadline=None)
@given(st.lists(LINE, max_size=40), st.integers(1, 5), st.integers(128, 256), st.booleans(), st.booleans())
def test_blocks_hold_exactly_the_lines_asked_for(
    lines: list[bytes], per_block: int, read_bytes: int, bom: bool, last_newline: bool
) -> None:
    content = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines) + (b"\n" if last_newline else b"")
    blocks = blocks_of(content, read_bytes, per_block)
    assert_whole_lines(blocks, content)
    # lines of at most 19 bytes: 5 and what is left over never fill a read, so only the last is short
    assert all(data.count(b"\n") == per_block for data, _ in blocks[:-1])
    assert not blocks or 1 <= blocks[-1][0].count(b"\n") <= per_block


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=30), st.integers(1, 8), st.integers(4, 40))
def test_long_lines_cut_blocks_by_size(lengths: list[int], per_block: int, read_bytes: int) -> None:
    content = b"".join(b"x" * n + b"\n" for n in lengths)
    blocks = blocks_of(content, read_bytes, per_block)
    assert_whole_lines(blocks, content)
    # a block with fewer lines than asked is the last, or what is read ran past a read's size
    assert all(data.count(b"\n") == per_block or len(data) > read_bytes - 301 for data, _ in blocks[:-1])
    assert all(len(data) <= 2 * read_bytes + 301 for data, _ in blocks)  # what a block may hold is bounded


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=30), st.integers(4, 600), st.booleans())
def test_without_a_line_count_each_read_gives_its_whole_lines(
    lengths: list[int], read_bytes: int, last_newline: bool
) -> None:
    content = b"\n".join(b"x" * n for n in lengths) + (b"\n" if last_newline else b"")
    blocks = blocks_of(content, read_bytes, None)  # how the SQL path reads JSON Lines
    assert_whole_lines(blocks, content)
    assert all(len(data) <= read_bytes + 301 for data, _ in blocks)


def test_read_ahead_gives_each_file_its_blocks_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readahead, "PLAIN_READ_BYTES", 4096)
    monkeypatch.setattr(readahead, "PLAIN_BLOCK_LINES", 5)
    sizes = [23, 40, 1, 17]
    logs = [log_of(write_jsonl(tmp_path / f"{i}.jsonl", [kv(f"n{i}", s) for s in range(n)]))
            for i, n in enumerate(sizes)]
    with ReadAhead(logs, depth=1) as ahead:
        got = []
        for i, log in enumerate(logs):
            if i == 1:
                ahead.skip(log)
                continue
            blocks = list(ahead.blocks(log))
            assert all(sum(t.num_rows for _, t in b.kinds) == 5 for b in blocks[:-1])
            got.append([n for b in blocks for _, t in b.kinds for n in t["line_no"].to_pylist()])
    assert got == [list(range(1, n + 1)) for n in (sizes[0], sizes[2], sizes[3])]
    assert not [t for t in threading.enumerate() if t.name.startswith("kvf-")]


def mixed(node: str, seq: int) -> dict[str, object]:
    """A record of the kind seq picks: mostly page records, with requests, transfers, a config at
    seq 0, and now and then a kind the schema does not know."""
    common = {"ts": TS, "node": node, "seq": seq}
    if seq == 0:
        return {"kind": "config", **common, "role": "decode", "engine": "e", "engine_version": "1",
                "model": "m", "context_length": 4096, "page_size": 16, "pool_pages": 64}
    if seq % 5 == 1:
        return {"kind": "request", **common, "request_id": f"r{seq % 7}", "event": "admitted"}
    if seq % 11 == 2:
        return {"kind": "transfer", **common, "transfer_id": f"t{seq}", "request_id": f"r{seq % 7}",
                "event": "started", "src_node": "p0", "dst_node": node}
    if seq % 37 == 3:
        return {"kind": "kvv", **common, "request_id": "r0", "op": "alloc", "pages": "1-2"}
    return kv(node, seq)


def test_a_blocks_plain_rows_come_by_kind_in_file_order() -> None:
    """The fast path gives a block's plain rows kind by kind, each kind's in file order."""
    records = [mixed("d0", s) for s in range(120)]
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    block = _split(data, 1)
    assert sum(t.num_rows for _, t in block.kinds) == len(records)
    seen = []
    for kind, rows in block.kinds:
        lines = rows["line_no"].to_pylist()
        assert lines == sorted(lines)
        assert {records[n - 1]["kind"] for n in lines} == {kind if kind is not None else "kvv"}
        # the verbatim line comes only with the lines a check may quarantine: here, the unknown kind's
        assert rows["raw"].to_pylist() == [json.dumps(records[n - 1]) if kind is None else None for n in lines]
        seen += lines
    assert sorted(seen) == list(range(1, len(records) + 1))
    assert [k for k, _ in block.kinds] == ["config", "request", "kv", "transfer", None]


@pytest.mark.parametrize("ready", [None, False, True])
def test_small_blocks_give_the_same_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ready: bool | None
) -> None:
    """Row groups of 16 rows and blocks of 32 lines: each kind's rows wait for whole groups, across
    blocks, and the last go in at the file's end. The same records, each kind in file order,
    whether the loader finds the next block split already (``ready``; None: as it happens)."""
    lines = [json.dumps(mixed("d0", s)) for s in range(300)]
    lines[40] = lines[40].replace('"op": "alloc"', '"op": "al\\u006coc"')  # not plain: the SQL path
    lines[41] = ""
    lines[77] = '{"kind": "kv", "ts": '
    lines[150] = lines[149]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(lines) + "\n")

    def case(db: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
        forensics.ingest([path], db)
        con = duckdb.connect(str(db), read_only=True)
        try:
            records = con.execute("SELECT * EXCLUDE (file_id) FROM records").fetchall()
            others = con.execute(
                "SELECT line_no, reason FROM quarantine UNION ALL SELECT line_no, 'duplicate' FROM duplicates "
                "ORDER BY 1").fetchall()
        finally:
            con.close()
        return records, others

    whole = case(tmp_path / "whole.duckdb")
    for module in (readahead, pipeline):
        monkeypatch.setattr(module, "ROW_GROUP", 16)
    monkeypatch.setattr(readahead, "PLAIN_BLOCK_LINES", 32)
    monkeypatch.setattr(readahead, "PLAIN_READ_BYTES", 8192)
    if ready is not None:
        monkeypatch.setattr(ReadAhead, "next_ready", lambda self: ready)
    small = case(tmp_path / "small.duckdb")
    assert small == whole
    kinds = {r[2] for r in small[0]}
    assert kinds == {"config", "request", "kv", "transfer"}
    for kind in kinds:  # line 41 is validated by SQL and settled after the plain lines
        plain = [r[0] for r in small[0] if r[2] == kind and r[0] != 41]
        assert plain == sorted(plain)
    unknown = [(s + 1, "unknown_kind") for s in range(300) if mixed("d0", s)["kind"] == "kvv" and s != 77]
    assert len(unknown) == 6
    assert len(small[0]) == 300 - 3 - len(unknown)  # a blank line, one not JSON, a repeat
    assert small[1] == sorted([(78, "not_json"), (151, "duplicate"), *unknown])


def test_background_priority_is_only_set_where_nice_is_per_thread() -> None:
    """Elsewhere than Linux, setpriority on a thread id would name a process: nothing is set."""
    nice = readahead.background_nice()
    assert (nice is None) == (sys.platform != "linux")
    readahead.in_background(None)  # leaves the thread as it is, on any platform


@pytest.mark.skipif(sys.platform != "linux", reason="nice is per thread on Linux only; elsewhere it is left alone")
def test_the_reader_and_splitters_run_below_the_loaders_priority(tmp_path: Path) -> None:
    log = log_of(write_jsonl(tmp_path / "a.jsonl", [kv("n", s) for s in range(50)]))
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with ReadAhead([log]) as ahead:
        assert sum(t.num_rows for b in ahead.blocks(log) for _, t in b.kinds) == 50
        workers = [t for t in threading.enumerate() if t.name.startswith("kvf-split")]
        assert workers
        for t in workers:
            assert t.native_id is not None
            assert os.getpriority(os.PRIO_PROCESS, t.native_id) == min(19, mine + readahead.BACKGROUND_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine


def test_a_file_that_fails_mid_way_is_refused_and_the_others_are_ingested(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A truncated .gz between two good files: it is refused with why (nothing of it stays, and it is
    listed in refused_files), the files before and after it go in, and the counts add up."""
    monkeypatch.setattr(readahead, "PLAIN_READ_BYTES", 16384)
    monkeypatch.setattr(readahead, "PLAIN_BLOCK_LINES", 50)
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", [kv("a", s) for s in range(500)])
    packed = gzip.compress("".join(json.dumps(kv("b", s)) + "\n" for s in range(5000)).encode())
    (logs / "b.jsonl.gz").write_bytes(packed[: len(packed) // 2])  # cut short: fails after some blocks
    write_jsonl(logs / "c.jsonl", [kv("c", s) for s in range(500)])
    for fast in (True, False):
        db = tmp_path / f"case-{fast}.duckdb"
        result = forensics.ingest([logs], db, fast=fast)
        assert [(Path(f.path).name, f.status) for f in result.files] == [
            ("a.jsonl", "ingested"), ("b.jsonl.gz", "refused"), ("c.jsonl", "ingested")]
        refused = result.refused[0]
        assert refused.why is not None and "cannot be decoded" in refused.why and refused.counts.read == 0
        assert result.records.read == result.records.ingested == 1000
        con = duckdb.connect(str(db), read_only=True)
        try:
            assert con.execute("SELECT node, count(*) FROM records GROUP BY ALL ORDER BY 1").fetchall() == [
                ("a", 500), ("c", 500)]
            assert con.execute("SELECT count(*) FROM source_lines WHERE file_id NOT IN (SELECT file_id FROM files)"
                               ).fetchone() == (0,)
            assert [Path(p).name for (p,) in con.execute("SELECT path FROM refused_files").fetchall()] == [
                "b.jsonl.gz"]
        finally:
            con.close()
        assert not [t for t in threading.enumerate() if t.name.startswith("kvf-")]
        # the file mended, a re-run takes it in and off the refused list
        (logs / "b.jsonl.gz").write_bytes(packed)
        again = forensics.ingest([logs], db, fast=fast)
        assert [f.status for f in again.files] == ["already_in_case", "ingested", "already_in_case"]
        con = duckdb.connect(str(db), read_only=True)
        try:
            assert con.execute("SELECT count(*) FROM refused_files").fetchone() == (0,)
        finally:
            con.close()
        (logs / "b.jsonl.gz").write_bytes(packed[: len(packed) // 2])
