"""The whole investigation on Spark (local mode) against the DuckDB path: the same files numbered
the same, every record ingested, duplicate or quarantined on the same line for the same reason
(with the same detail and text), the same analysis tables and figures, and a Parquet case that
Case, the query commands and the report open as they open the DuckDB case.

Needs the ``spark`` extra and Java; the test command installs both when it runs as root."""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from conftest import unreadable, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logsets import log_sets, namespaced
from skew import clock_skew_oracle, skewed_logs
from typer.testing import CliRunner

import forensics
from forensics.errors import CaseError, QueryError
from forensics.exposure import reference
from forensics.store import connect, export_parquet_case

pytest.importorskip("pyspark", reason="the spark extra is not installed (pip install -e '.[spark]')")
if shutil.which("java") is None:
    pytest.skip("no Java here (Debian: openjdk-17-jre-headless)", allow_module_level=True)

from pyspark.sql import SparkSession  # noqa: E402

from forensics import spark as on_spark  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TS = "2026-08-27T10:00:00.000000Z"

#: Every table of a case, as rows named by file path (not file_id) where they name a file.
_LEDGER = {
    "files": "SELECT path, size, sha256, format, compression, records_read, adapter, lines_ignored FROM files",
    "file_counts": "SELECT path, read, ingested, duplicates, quarantined FROM file_counts",
    "refused": "SELECT path, size, sha256, why FROM refused_files",
    "notes": "SELECT f.path, n.key, n.count, n.text FROM file_notes n JOIN files f USING (file_id)",
    "records": "SELECT f.path, r.line_no, r.part, r.kind, r.node, r.boot, r.seq, r.rec_hash::VARCHAR, r.doc "
               "FROM records r JOIN files f USING (file_id)",
    "duplicates": "SELECT f.path, d.line_no, d.rec_hash::VARCHAR, d.doc FROM duplicates d JOIN files f USING (file_id)",
    # (a conflict's detail names the winner's file_id: the files are numbered alike, or it differs)
    "quarantine": "SELECT f.path, q.line_no, q.reason, q.detail, q.raw, q.rec_hash::VARCHAR "
                  "FROM quarantine q JOIN files f USING (file_id)",
    "received_conflicts": "SELECT f.path, r.line_no, r.part, r.duplicate, r.request_id, r.tenant_id, "
                          "r.prompt_tokens, r.kept_tenant_id, r.kept_prompt_tokens, r.canon, r.rec_hash::VARCHAR "
                          "FROM received_conflicts r JOIN files f USING (file_id)",
    "source_lines": "SELECT f.path, s.first_line, s.line_count, md5(s.text) "
                    "FROM source_lines s JOIN files f USING (file_id)",
    "requests": "SELECT * FROM requests",
    "exposures": "SELECT * FROM exposures",
    "uninitialized_reads": "SELECT * FROM uninitialized_reads",
    "page_reads": "SELECT * FROM page_reads",
    "exposure_summary": "SELECT * FROM exposure_summary",
    "case_meta": "SELECT key, value FROM case_meta",
}


def ledger(case: Path) -> dict[str, list[tuple[Any, ...]]]:
    con = connect(case, read_only=True, create=False)
    try:
        return {name: sorted(con.execute(sql).fetchall(), key=repr) for name, sql in _LEDGER.items()}
    finally:
        con.close()


def both(spark: SparkSession, paths: list[Path], tmp: Path, **options: Any) -> tuple[Any, Any, Path, Path]:
    """The DuckDB path's and the Spark path's investigations of ``paths``; their ledgers asserted equal."""
    db = tmp / "case.duckdb"
    on_duckdb = forensics.investigate(paths, db, **options)
    out = tmp / "spark-case"
    found = on_spark.investigate(paths, out, spark=spark, **options)
    want, got = ledger(db), ledger(out)
    for table in _LEDGER:
        assert got[table] == want[table], table
    assert found.exposure == on_duckdb.exposure
    assert found.ingest.records == on_duckdb.ingest.records
    assert [(f.path, f.status, f.counts, f.sha256, f.notes, f.ignored, f.why) for f in found.ingest.files] == [
        (f.path, f.status, f.counts, f.sha256, f.notes, f.ignored, f.why) for f in on_duckdb.ingest.files]
    assert findings_of(out) == findings_of(db)
    return on_duckdb, found, db, out


def findings_of(case: Path) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """Each finding's id, count and rows in order (on Spark: computed there, stored in the case)."""
    with forensics.Case(case) as opened:
        return [(f.id, f.count, f.evidence.to_dicts()) for f in opened.findings()]


def _kv(node: str, seq: int, op: str = "alloc", pages: str = "1-3", rid: str = "r", **extra: Any) -> dict[str, Any]:
    return {"kind": "kv", "ts": TS, "node": node, "seq": seq, "request_id": rid, "op": op, "pages": pages, **extra}


def _received(rid: str, tenant: str, node: str = "router", **extra: Any) -> dict[str, Any]:
    return {"kind": "request", "ts": TS, "node": node, "request_id": rid, "event": "received", "tenant_id": tenant,
            "prompt_tokens": 10, **extra}


def _config(node: str, seq: int = 0, pool: int = 16) -> dict[str, Any]:
    return {"kind": "config", "ts": TS, "node": node, "seq": seq, "role": "decode", "engine": "sglang",
            "engine_version": "0.5.21", "model": "glm-5.3", "context_length": 64, "page_size": 4, "pool_pages": pool}


def test_hostile_files_end_alike_line_for_line(spark: SparkSession, tmp_path: Path) -> None:
    """Broken lines, repeats within and across files, a conflict whose winner comes in a later
    file, a page beyond a pool whose config comes in a later file, the same bytes twice, a damaged
    file, and every format (JSON Lines plain, .gz and .zst, CSV, Parquet); and a request id received
    for two tenants, the router's record (and its repeat) losing to another tenant's in a later
    file and coming back when an engine's record agreeing with it comes in a file after that."""
    logs = tmp_path / "logs"
    a = [_config("decode-0"), _kv("decode-0", 1), _kv("decode-0", 2, "write", source="transfer"),
         _kv("decode-0", 3, rid="zz"), _kv("decode-0", 2, "write", source="transfer"), _kv("decode-0", 4, "free"),
         _received("zz", "acme"), _received("zz", "acme"), _received("yy", "acme")]
    write_jsonl(logs / "a.jsonl", a)
    with (logs / "a.jsonl").open("a") as fh:
        fh.write('{"kind": "kv", broken\n' + json.dumps(_kv("decode-0", -1)) + "\n")
    shutil.copy(logs / "a.jsonl", logs / "a2.jsonl")  # the same bytes: one piece of evidence
    b = [_received("zz", "initech", seq=1), _received("yy", "initech", seq=2),  # they beat a.jsonl's
         _kv("decode-0", 3, rid="aa"),  # beats a.jsonl's seq 3 (its canonical JSON sorts first)
         _kv("decode-0", 1), _kv("decode-1", 1, pages="20"), _kv("decode-1", 2, "read", pages="1")]
    (logs / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in b).encode()))
    c = [_config("decode-1"), _kv("decode-1", 3, "free", pages="1")]
    fields = sorted({k for r in c for k in r})
    (logs / "c.csv").write_text(",".join(fields) + "\n" + "".join(
        ",".join(str(r.get(k, "")) for k in fields) + "\n" for r in c))
    d = [_kv("decode-0", 4, "free"), _kv("decode-1", 4, "alloc", pages="2-5"), _kv("decode-0", 9, rid="pq")]
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in sorted({k for x in d for k in x})} for r in d]),
                   logs / "d.parquet")
    (logs / "e.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(_kv("decode-2", i, "alloc", pages=str(i))) + "\n" for i in range(5)).encode()))
    (logs / "f.jsonl.gz").write_bytes(gzip.compress(b'{"kind": "kv"}\n' * 50)[:40])  # damaged: refused
    write_jsonl(logs / "g.jsonl", [_received("zz", "acme", node="engine")])  # sorts first: acme's back
    partial = tmp_path / ".spark-case.partial"  # what a run killed mid-way left
    (partial / "kv_records").mkdir(parents=True)
    (partial / "kv_records" / "part-00000.parquet").write_bytes(b"half a file")
    on_duckdb, found, _, _ = both(spark, [logs], tmp_path)
    assert not partial.exists()
    reasons = {f.path.rsplit("/", 1)[-1]: (f.status, f.counts) for f in found.ingest.files}
    assert reasons["a2.jsonl"][0] == "already_in_case" and reasons["f.jsonl.gz"][0] == "refused"
    c_ = found.ingest.records
    assert c_.read == c_.ingested + c_.duplicates + c_.quarantined
    assert c_.duplicates >= 3 and c_.quarantined >= 4  # (repeats; broken, negative seq, conflict, beyond the pool)
    con = connect(found.case, read_only=True, create=False)
    try:
        why = dict(con.execute("SELECT reason, count(*) FROM quarantine GROUP BY ALL").fetchall())
    finally:
        con.close()
    assert {"not_json", "negative_seq", "conflict", "page_out_of_range"} <= set(why)
    assert [(f["request_id"], f["kept_tenant_id"], f["quarantined_records"]) for f in dict(
        (i, rows) for i, _, rows in findings_of(found.case))["evidence.request_id_conflict"]] == [
        ("yy", "initech", 1), ("zz", "acme", 1)]


def test_a_file_and_a_folder_that_cannot_be_read_are_refused_alike(spark: SparkSession, tmp_path: Path) -> None:
    """A file without read permission and a folder that cannot be listed: refused on Spark as on
    DuckDB (in refused_files with why, listed as refused, not passed over)."""
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    write_jsonl(logs / "a.jsonl", [_config("decode-0"), _kv("decode-0", 1)])
    write_jsonl(logs / "b.jsonl", [_config("decode-1"), _kv("decode-1", 1)])
    write_jsonl(logs / "sub" / "c.jsonl", [_kv("decode-2", 1)])
    with unreadable(logs / "b.jsonl", logs / "sub"):
        _, found, _, _ = both(spark, [logs], tmp_path)
    assert sorted((f.path.rsplit("/", 1)[-1], f.status) for f in found.ingest.files) == [
        ("a.jsonl", "ingested"), ("b.jsonl", "refused"), ("sub", "refused")]
    assert not found.ingest.skipped


def test_the_sample_incident_by_the_cli_is_the_duckdb_case_and_its_report(spark: SparkSession, sample_case: Path,
                                                                         tmp_path: Path) -> None:
    from kvforensics.cli import app

    sample = ROOT / "sample_logs" / "glm53-incident"
    out = tmp_path / "spark-case"
    earlier = tmp_path / "earlier.duckdb"  # an earlier Parquet case there, of other logs: replaced whole
    forensics.ingest([write_jsonl(tmp_path / "other.jsonl", [_config("other-0")])], earlier)
    export_parquet_case(earlier, out)
    result = CliRunner().invoke(app, ["investigate", str(sample), "--engine", "spark", "--master", "local[2]",
                                      "--out-dir", str(out), "--out", str(tmp_path / "spark.html"),
                                      "--generated-at", "2026-12-01T00:00:00Z", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["exposure"]["exposed_responses"] == 9 and data["engine"] == "spark"
    db = sample_case
    assert ledger(out) == ledger(db)
    with forensics.Case(out) as case, forensics.Case(db) as same:
        assert dict(case.summary()) == dict(same.summary()) == data["exposure"]
        assert [(f.id, f.count) for f in case.findings()] == [(f.id, f.count) for f in same.findings()]
        seen, want = case.request("req-2026-000182"), same.request("req-2026-000182")
        assert seen.saw.height > 0 and seen.saw.equals(want.saw) and seen.seen_by.equals(want.seen_by)
        assert seen.lifecycle.equals(want.lifecycle) and seen.pages.equals(want.pages)
    assert findings_of(out) == findings_of(db) and {f[0] for f in findings_of(out)} >= {
        "handoff.rejected_but_transferred", "handoff.coverage_mismatch", "response.delivered_after_reject"}
    with open(out / "manifest.json") as fh:
        stored = json.load(fh)["findings"]
    assert stored["handoff.rejected_but_transferred"]["rows"] == 13  # (rows Spark's tasks wrote)
    forensics_report = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "duckdb.html"),
                                                "--generated-at", "2026-12-01T00:00:00Z"])
    assert forensics_report.exit_code == 0
    # the same report but for when each file was ingested
    stamp = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ UTC \(kvforensics")
    spark_html = stamp.sub("TIME", (tmp_path / "spark.html").read_text())
    assert spark_html == stamp.sub("TIME", (tmp_path / "duckdb.html").read_text())
    assert spark_html.count("TIME") == 9
    queried = CliRunner().invoke(app, ["sql", "--db", str(out), "SELECT count(*) AS n FROM records"])
    lines = sum(len(f.read_text().splitlines()) for f in sample.glob("*.jsonl"))  # (every record, one a line)
    assert queried.exit_code == 0 and f"{lines:,}" in queried.output  # (a table groups digits)


def test_engine_logs_are_adapted_on_spark_as_on_duckdb(spark: SparkSession, tmp_path: Path) -> None:
    """SGLang 0.5.19's own log lines (the shipped sample), through the adapters in the file tasks."""
    both(spark, [ROOT / "sample_logs" / "glm53-incident-sglang"], tmp_path)


def test_clock_skew_is_summed_from_its_parts_in_the_tasks(spark: SparkSession, tmp_path: Path) -> None:
    """evidence.clock_skew's parts run in the transfer-bucket and node tasks (two buckets: a link's
    transfers in both), and the driver sums their rows: the DuckDB path's rows, and the oracle's."""
    from replay.simulate import Deployment, simulate_to

    small = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                       page_size=64, prefill_nodes=2, decode_nodes=2)
    skewed_logs(tmp_path / "logs", lambda out, **kw: simulate_to(out, deployment=small, requests=300, rate=3.0, **kw))
    _, _, db, out = both(spark, [tmp_path / "logs"], tmp_path)
    skew = {f[0]: f for f in findings_of(out)}["evidence.clock_skew"][2]
    assert {r["signal"] for r in skew} == {"transfer", "ts_before_previous_seq"}
    assert [tuple(r.values())[:6] for r in skew] == clock_skew_oracle(db)
    assert len(list((out / "findings" / "evidence.clock_skew").glob("*.parquet"))) == 2  # (rows, columns)
    assert not (out / ".parts").exists()


def test_a_parquet_case_is_read_only_and_a_duckdb_case_exported_reads_the_same(sample_case: Path,
                                                                               tmp_path: Path) -> None:
    db = sample_case
    out = tmp_path / "exported"
    export_parquet_case(db, out)
    assert ledger(out) == ledger(db)
    with pytest.raises(CaseError, match="read only"):
        forensics.ingest([ROOT / "sample_logs" / "glm53-incident"], out)
    from forensics.case import run_read_only

    with pytest.raises(QueryError, match="disabled"):
        run_read_only(out, "SELECT * FROM read_csv('/etc/hostname')")
    other = tmp_path / "not-a-case"
    (other / "keep").mkdir(parents=True)
    with pytest.raises(CaseError, match="not a Parquet case"):  # (refused before Spark starts)
        on_spark.investigate([ROOT / "sample_logs" / "glm53-incident"], other)
    assert (other / "keep").is_dir()


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(sets=st.lists(log_sets(), min_size=4, max_size=8), seed=st.integers(0, 2**32))
def test_random_log_sets_split_and_repeated_end_alike_and_match_the_oracle(
        spark: SparkSession, sets: list[list[dict[str, Any]]], seed: int,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Random log sets spread over files at random, with repeats across files, broken lines and
    conflicts on a node of their own (allocations and frees only, so the figures stay the oracle's)."""
    tmp = tmp_path_factory.mktemp("spark-ingest")
    rng = random.Random(seed)
    records = [r for i, one in enumerate(sets) for r in namespaced(i, one)]
    lines = [json.dumps(r) for r in records]
    lines += [rng.choice(lines) for _ in range(len(lines) // 10 + 1)]  # repeats
    lines += ['{"kind": "kv", "ts": ' for _ in range(3)]  # broken
    lines += [json.dumps(_kv("noise", rng.randrange(6), rng.choice(["alloc", "free"]), rid=rng.choice("abc")))
              for _ in range(12)]  # conflicts and repeats on (noise, 0, seq)
    rng.shuffle(lines)
    n = rng.randint(2, 5)
    files = []
    for k in range(n):
        path = tmp / "logs" / f"{k}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text("".join(x + "\n" for x in lines[k::n]))
        files.append(path)
    on_duckdb, found, _, _ = both(spark, files, tmp)
    assert found.exposure == reference.run(records).figures
