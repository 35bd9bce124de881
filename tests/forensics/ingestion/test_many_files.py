"""Many small files (issue #44): read whole and put in a group at a time, one transaction and one
settling for the group, the case ends exactly as ingesting them one at a time leaves it, table by
table and row by row, whatever the grouping: with repeats and conflicts across files, received
records of one id naming two tenants, pages beyond a pool a later config shrinks, a damaged file
in the middle of a group (refused alone) and a copy of a file (there already)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import random
import threading
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from conftest import write_jsonl

import forensics
from forensics.ingestion import pipeline, readers
from forensics.ingestion.readers import discovery, logfile, opening, readahead
from forensics.ingestion.readers.lines import _line_blocks

TS = "2026-08-27T10:00:00.000000Z"
#: Every case table, with the columns that hold the time of the run left out.
TABLES = {
    "files": "* EXCLUDE (ingested_at)", "refused_files": "* EXCLUDE (refused_at)", "file_notes": "*",
    "config_records": "*", "request_records": "*", "kv_records": "*", "transfer_records": "*",
    "quarantine": "*", "duplicates": "*", "received_conflicts": "*", "source_lines": "*",
}


def config(seq: int, pool: int) -> dict[str, Any]:
    return {"kind": "config", "ts": TS, "node": "decode-0", "seq": seq, "role": "decode", "engine": "sglang",
            "engine_version": "0.5.21", "model": "glm-5.3", "context_length": 64, "page_size": 4,
            "pool_pages": pool}


def kv(seq: int, rid: str, pages: str = "1-3", node: str = "decode-0") -> dict[str, Any]:
    return {"kind": "kv", "ts": TS, "node": node, "seq": seq, "request_id": rid, "op": "alloc", "pages": pages}


def received(rid: str, tenant: str) -> dict[str, Any]:
    return {"kind": "request", "ts": TS, "node": "router", "request_id": rid, "event": "received",
            "tenant_id": tenant, "prompt_tokens": 12}


def log_set(folder: Path, seed: int, trouble: str) -> list[Path]:
    """A dozen small files of a node's rotated log and a router's, with what settling one file against
    the others can turn over (``trouble``: conflicts on keys, received records of one id naming two
    tenants, pages beyond a pool a later config shrinks, or all of them; ``seed``: where)."""
    rng = random.Random(seed)
    lines: list[list[str]] = []
    seq = 1
    for n in range(8):
        records: list[dict[str, Any]] = [received(f"r{n}-{i}", "acme") for i in range(3)]
        if n == 0:
            records.append(config(0, 16))
        for _ in range(rng.randint(2, 6)):
            records.append(kv(seq, f"r{n}", rng.choice(["1-3", "4", "5-6"])))
            seq += 1
        records.append(kv(n, f"q{n}", "2", node=f"decode-{n % 3 + 1}"))
        if trouble in ("conflicts", "all") and rng.random() < 0.3:
            records.append(kv(rng.randint(1, seq), "rival"))  # a conflict on a key, here or elsewhere
        if trouble in ("received", "all") and rng.random() < 0.3:
            records.append(received(f"r{rng.randint(0, n)}-0", rng.choice(["acme", "initech"])))
        if trouble in ("beyond", "all"):
            if rng.random() < 0.3:
                records.append(kv(seq, f"r{n}", "12-14"))  # beyond a pool of 12 a later config brings
                seq += 1
            if n == 5:
                records.append(config(seq, 12))
                seq += 1
        text = [json.dumps(r) for r in records]
        if n and rng.random() < 0.5:  # a repeat of an earlier file's line (a router's: one with a key conflicts)
            earlier = lines[rng.randrange(n)]
            text.append(rng.choice(earlier if trouble == "all" else [t for t in earlier if '"router"' in t]))
        if rng.random() < 0.2:
            text.append('{"kind": "kv", broken')
        rng.shuffle(text)
        lines.append(text)
    folder.mkdir(parents=True)
    files = []
    for n, text in enumerate(lines):
        path = folder / f"{n:02d}.jsonl"
        path.write_text("".join(line + "\n" for line in text))
        files.append(path)
    damaged = folder / "03b.jsonl.gz"
    damaged.write_bytes(gzip.compress(files[3].read_bytes())[:40] + b"\x00" * 20)
    copy = folder / "06b.jsonl"
    copy.write_bytes(files[rng.randrange(6)].read_bytes())
    table = folder / "04b.csv"
    with table.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["kind", "ts", "node", "request_id", "event", "tenant_id",
                                                "prompt_tokens"])
        writer.writeheader()
        writer.writerows([received("r3-1", "acme"), received(f"c{seed}", "initech")])
    return sorted([*files, damaged, copy, table])


def tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(f"SELECT {cols} FROM {t} ORDER BY ALL").fetchall() for t, cols in TABLES.items()}
    finally:
        con.close()


def one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file read and put in as a large one is: a transaction and a settling of its own."""
    monkeypatch.setattr(logfile, "SMALL_FILE", -1)


def settled_together(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each group's settling together answered, as it answers."""
    answers: list[bool] = []

    def recorded(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> bool:
        answers.append(settle_together(con, lo, hi))
        return answers[-1]

    settle_together = pipeline.settle_together
    monkeypatch.setattr(pipeline, "settle_together", recorded)
    return answers


@pytest.mark.parametrize(("fast", "troubles"), [(True, ["received", "beyond", "all"]), (False, ["beyond"])],
                         ids=["fast path", "sql path"])
def test_groups_of_small_files_end_as_one_file_at_a_time(fast: bool, troubles: list[str], tmp_path: Path) -> None:
    """For several log sets and groupings, grouped and one at a time give the same case, table by
    table and row by row, and the same results per file; groups are settled together where
    nothing turns over, one file at a time where something does."""
    answers: list[bool] = []
    for seed, trouble in enumerate(troubles):
        logs = log_set(tmp_path / str(seed), seed, trouble)
        with pytest.MonkeyPatch.context() as patch:
            one_at_a_time(patch)
            alone = forensics.ingest(logs, tmp_path / f"{seed}-alone.duckdb", fast=fast)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pipeline, "GROUP_FILES", random.Random(seed).choice([3, 5, 1000]))
            together = settled_together(patch)
            grouped = forensics.ingest(logs, tmp_path / f"{seed}-grouped.duckdb", fast=fast)
        answers += together
        assert [f.as_dict() for f in grouped.files] == [f.as_dict() for f in alone.files]
        assert (grouped.records, grouped.case) == (alone.records, alone.case)
        assert tables(tmp_path / f"{seed}-grouped.duckdb") == tables(tmp_path / f"{seed}-alone.duckdb")
        statuses = {Path(f.path).name: f.status for f in grouped.files}
        assert statuses["03b.jsonl.gz"] == "refused" and statuses["06b.jsonl"] == "already_in_case"
        assert [s for name, s in statuses.items() if name not in ("03b.jsonl.gz", "06b.jsonl")] == ["ingested"] * 9
    assert True in answers and False in answers  # (both ways were taken)


def test_a_group_stopped_midway_leaves_nothing_of_it_and_a_rerun_completes_the_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group is all in or all out: stopped while it settles, the case holds the groups before it,
    and running the same ingest again ends with the case of an ingest never stopped."""
    logs = log_set(tmp_path / "logs", 2, "all")
    forensics.ingest(logs, tmp_path / "whole.duckdb")
    monkeypatch.setattr(pipeline, "GROUP_FILES", 4)
    calls = []
    settle_together = pipeline.settle_together

    def stopped(con: duckdb.DuckDBPyConnection, lo: int, hi: int) -> bool:
        calls.append(lo)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return settle_together(con, lo, hi)

    monkeypatch.setattr(pipeline, "settle_together", stopped)
    with pytest.raises(KeyboardInterrupt):
        forensics.ingest(logs, tmp_path / "case.duckdb")
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM files").fetchone() == (4,)
    assert con.execute("SELECT count(*) FROM records WHERE file_id > 4").fetchone() == (0,)
    con.close()
    monkeypatch.setattr(pipeline, "settle_together", settle_together)
    forensics.ingest(logs, tmp_path / "case.duckdb")
    whole, rerun = tables(tmp_path / "whole.duckdb"), tables(tmp_path / "case.duckdb")
    assert {t: rows for t, rows in rerun.items() if t != "refused_files"} == \
        {t: rows for t, rows in whole.items() if t != "refused_files"}
    assert [r[:4] for r in rerun["refused_files"]] == [r[:4] for r in whole["refused_files"]]


def test_the_progress_is_told_the_files_done_and_left(tmp_path: Path) -> None:
    """A progress that takes files (FilesProgress) is told how many are read of how many, up to all
    of them, as well as each file's bytes."""
    logs = [write_jsonl(tmp_path / f"{i}.jsonl", [kv(i + 1, f"r{i}")]) for i in range(7)]

    class Seen:
        def __init__(self) -> None:
            self.done: list[tuple[int, int]] = []
            self.read: list[Path] = []

        def __call__(self, path: Path, done: int, total: int) -> None:
            self.read.append(path)

        def files(self, done: int, total: int) -> None:
            self.done.append((done, total))

    seen = Seen()
    assert isinstance(seen, pipeline.FilesProgress)
    forensics.ingest(logs, tmp_path / "case.duckdb", progress=seen)
    assert seen.done == [(n, 7) for n in range(8)]
    assert sorted(set(seen.read)) == sorted(logs)


def test_a_small_file_read_in_one_go_gives_the_blocks_the_reading_loop_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader's one read of a small file gives the very blocks its loop gives, and the hash of
    the bytes as stored: with a byte-order mark, no last newline, CRLF, blank lines, long lines,
    nothing, compressed; as one block for a split with other files wherever the loop gives one."""
    bodies = [b"", b"\n", b"\xef\xbb\xbf", b'{"a": 1}', b'{"a": 1}\n{"b": 2}', b"\xef\xbb\xbf{}\r\n{}\r\n",
              b"\n\n\n" * 2000, b"x" * 5000 + b"\n" + b"y" * 10, b"y" * 10 + b"\n" + b"x" * 5000,
              b"\xef\xbb\xbf" + b"x" * 5000, b"z" * 9000 + b"\n"]
    for n, body in enumerate(bodies):
        for compression, stored in (("none", body), ("gzip", gzip.compress(body))):
            path = tmp_path / f"{n}.jsonl{'.gz' if compression == 'gzip' else ''}"
            path.write_bytes(stored)
            for limit in (4096, 16 << 20):
                for lines in (3, 1000):
                    monkeypatch.setattr(readahead, "PLAIN_BLOCK_LINES", lines)
                    log = readers.LogFile(path, "jsonl", compression, limits=readers.Limits(max_line_bytes=limit))
                    hashed, once = readahead.read_small(log)
                    assert (hashed.sha256, hashed.size) == (hashlib.sha256(stored).hexdigest(), len(stored))
                    looped = list(_line_blocks(log, lines, readahead.SMALL_READ_BYTES))
                    if isinstance(once, tuple):  # one block: where its lines end is found in the split
                        data = bytes(once[0])
                        blocks = [(once[0], 1, np.flatnonzero(np.frombuffer(data, np.uint8) == 10), once[1])]
                    else:
                        blocks = list(once)
                    assert len(blocks) == len(looped), (n, compression, limit, lines)
                    for a, b in zip(blocks, looped, strict=True):
                        assert (bytes(a[0]), a[1], a[2].tolist(), a[3]) == (bytes(b[0]), b[1], b[2].tolist(), b[3])


def test_a_small_file_written_while_it_is_read_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one read of a small file is checked on the open file: appended to or truncated while read,
    or grown past what a small file is read whole up to since it was found, it is refused as
    changed, alone, and the files around it go in."""
    logs = [write_jsonl(tmp_path / "logs" / f"{i}.jsonl", [kv(i + 1, f"r{i}")]) for i in range(3)]
    real_read = readahead._read_fd
    for trouble in ("appended", "truncated", "grown"):
        def read(fd: int, size: int, trouble: str = trouble) -> bytes:
            if os.fstat(fd).st_ino == logs[1].stat().st_ino:
                with logs[1].open("ab") as fh:
                    if trouble == "truncated":
                        fh.truncate(5)
                    else:
                        fh.write(b"\n")
            return real_read(fd, size)

        if trouble == "grown":  # (grown after it was found small, before the reader opens it)
            monkeypatch.setattr(readahead, "_open_regular_fd", _grown_first(readahead._open_regular_fd, logs[1]))
        else:
            monkeypatch.setattr(readahead, "_read_fd", read)
        result = forensics.ingest(logs, tmp_path / f"{trouble}.duckdb", fast=True)
        assert [(Path(f.path).name, f.status, f.why) for f in result.files] == [
            ("0.jsonl", "ingested", None),
            ("1.jsonl", "refused", "changed while it was read; ingest it again once nothing writes to it"),
            ("2.jsonl", "ingested", None)], trouble
        assert result.records.read == 2
        monkeypatch.undo()
        logs[1].write_text(json.dumps(kv(2, "r1")) + "\n")


def _grown_first(open_fd: Any, grows: Path) -> Any:
    """:func:`opening._open_regular_fd` that makes ``grows`` past a small file's read before the
    reader opens it (not before it is found)."""
    def opened(path: Path) -> Any:
        if path == grows and threading.current_thread().name == "kvf-read":
            with grows.open("ab") as fh:
                fh.write(b"\n" * (readahead.SMALL_READ_BYTES + 1))
        return open_fd(path)
    return opened


def test_the_quick_look_at_a_file_head_finds_the_format_the_full_sniff_finds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of canonical, engine and other files: each is found the same format with the quick look
    at its first bytes as with the adapters' sniff of its head alone."""
    head = json.dumps(received("r1", "acme"))
    engine = json.dumps({"event": "request.received", "rid": "x"})
    bodies = {
        "a.jsonl": head + "\n", "b.jsonl": "\n\n  \n" + head + "\n", "c.jsonl": "\ufeff" + head + "\n",
        "d.jsonl": engine + "\n" + head + "\n", "e.jsonl": head, "f.jsonl": "x" * 40000 + "\n" + head + "\n",
        "g.jsonl": '{"kind": 1}\n', "h.log": head + "\n", "i.log": "[2026-11-02 08:00:00] server_args=ServerArgs(x)\n",
        "j.jsonl": '{"no": "kind"}\n' + head + "\n", "k.jsonl": "[1, 2]\n", "l.txt": head + "\r\n",
        "m.jsonl": "\n" * 70 + head + "\n", "n.jsonl": head + "\u2028" + engine + "\n",
        "o.jsonl": " " * 20000 + head + "\n", "p.jsonl": "\u2028" + head + "\n", "q.jsonl": "  \r" + engine + "\n",
        "r.jsonl": "\ufeff\n" + head + "\n", "s.jsonl": "\x1c" + head + "\r\n" + engine + "\n",
        "t.jsonl": engine + "\r" + head + "\n", "u.jsonl": "\t\n\u3000\n" + head,
    }
    for name, body in bodies.items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    quick, _ = readers.discover([tmp_path])
    monkeypatch.setattr(discovery, "_canonical_head", lambda head: None)
    full, _ = readers.discover([tmp_path])
    assert [(log.path.name, log.format, log.adapter) for log in quick] == \
        [(log.path.name, log.format, log.adapter) for log in full]
    assert {log.adapter for log in quick} >= {"canonical"}


def test_a_small_file_is_opened_once_after_it_is_found_and_hashed_from_that_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small canonical files are opened twice in all: once when found (their head), once by the reader,
    which hashes the very bytes it splits; they are not hashed apart. A CSV beside them still is."""
    logs = [write_jsonl(tmp_path / f"{i}.jsonl", [kv(i + 1, f"r{i}")]) for i in range(6)]
    table = tmp_path / "t.csv"
    table.write_text("kind,ts,node,request_id,event,tenant_id,prompt_tokens\n"
                     f"request,{TS},router,c1,received,acme,3\n")
    opened: list[Path] = []
    open_fd = opening._open_regular_fd

    def counted(path: Path) -> Any:
        opened.append(Path(path))
        return open_fd(path)

    hashed_apart: list[Path] = []
    sha256_of = pipeline.sha256_of

    def counted_hash(path: Path) -> Any:
        hashed_apart.append(path)
        return sha256_of(path)

    for module in (discovery, opening, readahead):  # (each looks it up in its own namespace)
        monkeypatch.setattr(module, "_open_regular_fd", counted)
    monkeypatch.setattr(pipeline, "sha256_of", counted_hash)
    result = forensics.ingest([*logs, table], tmp_path / "case.duckdb", fast=True)
    assert [f.status for f in result.files] == ["ingested"] * 7
    assert {log: opened.count(log) for log in logs} == {log: 2 for log in logs}
    assert hashed_apart == [table]
    assert [f.sha256 for f in result.files] == [hashlib.sha256(p.read_bytes()).hexdigest() for p in [*logs, table]]


def test_groups_start_small_and_grow_then_are_even() -> None:
    """The first groups double from FIRST_GROUP_FILES up to GROUP_FILES; then the small files left go in
    groups as even as they can be, none larger than GROUP_FILES and none a runt."""
    sizes = []
    left = 20_002
    while left > 0:
        sizes.append(min(pipeline._group_files(len(sizes), left), left))
        left -= sizes[-1]
    first = pipeline.FIRST_GROUP_FILES
    assert sizes[:3] == [first, 2 * first, 4 * first]
    assert sum(sizes) == 20_002 and max(sizes) <= pipeline.GROUP_FILES
    rest = sizes[sizes.index(max(sizes)) :]
    assert max(rest) - min(rest) <= 2
    assert pipeline._group_files(40, 7) == 7 and pipeline._group_files(40, 10_000) == 5_000


def test_a_small_file_of_many_blocks_is_taken_as_it_comes_among_files_split_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small file that decompresses to more than one block comes block by block, as a large file's
    do, between small files split together; one damaged past its first blocks is refused alone; the
    case is the one a file at a time leaves."""
    monkeypatch.setattr(readahead, "PLAIN_BLOCK_LINES", 5)
    folder = tmp_path / "logs"
    write_jsonl(folder / "a.jsonl", [kv(s, "ra") for s in range(1, 4)])
    for name, node in (("b", "decode-2"), ("c", "decode-3")):
        packed = gzip.compress("".join(json.dumps(kv(s, f"r{name}", node=node)) + "\n" for s in range(1, 400)).encode())
        (folder / f"{name}.jsonl.gz").write_bytes(packed if name == "b" else packed[: len(packed) * 2 // 3])
    write_jsonl(folder / "d.jsonl", [kv(s, "rd", node="decode-4") for s in range(1, 4)])
    grouped = forensics.ingest([folder], tmp_path / "grouped.duckdb", fast=True)
    with pytest.MonkeyPatch.context() as patch:
        one_at_a_time(patch)
        alone = forensics.ingest([folder], tmp_path / "alone.duckdb", fast=True)
    assert [(Path(f.path).name, f.status) for f in grouped.files] == [
        ("a.jsonl", "ingested"), ("b.jsonl.gz", "ingested"), ("c.jsonl.gz", "refused"), ("d.jsonl", "ingested")]
    assert grouped.records.ingested == 3 + 399 + 3
    assert [f.as_dict() for f in grouped.files] == [f.as_dict() for f in alone.files]
    assert tables(tmp_path / "grouped.duckdb") == tables(tmp_path / "alone.duckdb")
    assert not [t for t in threading.enumerate() if t.name.startswith("kvf-")]
