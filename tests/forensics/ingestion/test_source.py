"""The case keeps every input line as read: each record's, duplicate's and quarantined line reads back."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import write_jsonl

import forensics
from forensics.ingestion import source
from forensics.ingestion.source import PIECE_BYTES

TS = "2026-08-27T10:00:00.000000Z"


def kv(seq: int, rid: str = "r", pages: str = "1-3", **extra: object) -> dict[str, object]:
    return {"kind": "kv", "ts": TS, "node": "decode-0", "seq": seq, "request_id": rid, "op": "alloc",
            "pages": pages, **extra}


def every_line(db: Path) -> dict[tuple[str, int], str]:
    """Every line the case accounts for (records, duplicates, quarantine), read back as its text."""
    with forensics.Case(db) as case:
        rows = case.sql(
            "SELECT file_id, line_no FROM records UNION SELECT file_id, line_no FROM duplicates "
            "UNION SELECT file_id, line_no FROM quarantine"
        )
        back = case.verbatim(rows)
    assert back.height == rows.height
    return {(Path(p).name, n): t for p, n, t in back.select("path", "line_no", "text").iter_rows()}


def jsonl_lines(data: bytes) -> dict[int, str]:
    """The oracle: a JSON Lines file's non-blank lines by number, as the spec reads them."""
    data = data.removeprefix(b"\xef\xbb\xbf")
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return {n: line.removesuffix(b"\r").decode("utf-8", "backslashreplace")
            for n, line in enumerate(lines, 1) if line.strip()}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("piece", [64, PIECE_BYTES])
def test_every_json_line_reads_back_as_written(fast: bool, piece: int, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Whichever path read it and however the file is cut into pieces: CRLF and LF, a BOM, blank
    lines, a line separator inside a string, bad UTF-8, duplicates, and no newline at the end."""
    monkeypatch.setattr(source, "PIECE_BYTES", piece)
    lines = [json.dumps(kv(1)), json.dumps(kv(2, rid="a\u2028b"), ensure_ascii=False), "", json.dumps(kv(1)),
             '{"kind": "kv", "node": "\xff"}', "   ", json.dumps(kv(3)) + "\r", "not json", json.dumps(kv(4))]
    # the fifth line's \xff becomes a lone byte, which is no UTF-8
    data = b"\xef\xbb\xbf" + "\n".join(lines).encode().replace("\xff".encode(), b"\xff")
    plain = tmp_path / "a.jsonl"
    plain.write_bytes(data)
    packed = tmp_path / "b.jsonl.gz"
    packed.write_bytes(gzip.compress(data + b"\n" + json.dumps(kv(9)).encode()))
    result = forensics.ingest([plain, packed], tmp_path / "case.duckdb", fast=fast)
    assert result.records.read == 15
    back = every_line(tmp_path / "case.duckdb")
    expected = {("a.jsonl", n): t for n, t in jsonl_lines(data).items()}
    expected |= {("b.jsonl.gz", n): t for n, t in jsonl_lines(gzip.decompress(packed.read_bytes())).items()}
    assert back == expected


def test_a_csv_row_over_several_lines_reads_back_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quoted cell may hold line ends: the row's text is every line it spans, across pieces too."""
    monkeypatch.setattr(source, "PIECE_BYTES", 40)
    rows = [
        ["kind", "ts", "node", "seq", "request_id", "op", "pages", "note"],
        ["kv", TS, "decode-0", 1, "r", "alloc", "1-3", "one line"],
        ["kv", TS, "decode-0", 2, "r", "alloc", "4", "two\nlines and\r\nthree"],
        ["kv", TS, "decode-0", 3, "r", "free", "1-3,4", ""],
    ]
    texts = []
    for row in rows:
        out = io.StringIO()
        csv.writer(out, lineterminator="\r\n").writerow(row)
        texts.append(out.getvalue())
    path = tmp_path / "a.csv"
    path.write_bytes("".join(texts).encode())
    forensics.ingest([path], tmp_path / "case.duckdb")
    back = every_line(tmp_path / "case.duckdb")
    # the header is line 1; the second record's row takes lines 3 to 5
    assert back == {("a.csv", 2): texts[1][:-2], ("a.csv", 3): texts[2][:-2], ("a.csv", 6): texts[3][:-2]}


def test_a_parquet_row_reads_back_as_the_json_made_of_it(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_pylist([kv(1), kv(2)]), path)
    forensics.ingest([path], tmp_path / "case.duckdb")
    back = every_line(tmp_path / "case.duckdb")
    assert {k: json.loads(t) for k, t in back.items()} == {("a.parquet", 1): kv(1), ("a.parquet", 2): kv(2)}


def test_an_engine_log_line_reads_back_as_the_engines_line(tmp_path: Path) -> None:
    """An adapted record's text is the engine's line it came from; lines that are no event are kept too."""
    log = Path(__file__).resolve().parents[2] / "adapters" / "fixtures" / "decode-0.log"
    forensics.ingest([log], tmp_path / "case.duckdb")
    lines = log.read_text(encoding="utf-8").splitlines()
    with forensics.Case(tmp_path / "case.duckdb") as case:
        records = case.sql("SELECT DISTINCT file_id, line_no FROM records")
        back = case.verbatim(records)
        everything = case.verbatim([(1, n) for n in range(1, len(lines) + 1)])
    assert back.height == records.height > 0
    assert all(text == lines[n - 1] for n, text in back.select("line_no", "text").iter_rows())
    assert everything["text"].to_list() == lines


def test_a_request_lines_are_its_records_lines(tmp_path: Path) -> None:
    records = [kv(1, rid="a"), kv(2, rid="b"), kv(3, rid="a", pages="7")]
    db = tmp_path / "case.duckdb"
    forensics.ingest([write_jsonl(tmp_path / "a.jsonl", records)], db)
    with forensics.Case(db) as case:
        lines = case.request_lines("a")
    assert lines.select("line_no", "text").rows() == [(1, json.dumps(records[0])), (3, json.dumps(records[2]))]
