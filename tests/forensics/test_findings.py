"""Findings on simulated logs where the expected signatures and counts are known."""

from __future__ import annotations

import json
import re
from pathlib import Path

from skew import clock_skew_oracle, skewed_logs

import forensics
from replay.simulate import Deployment, SimResult, simulate_to

SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2)


def _found(logs: Path, db: Path) -> dict[str, forensics.Finding]:
    forensics.investigate([logs], db)
    with forensics.Case(db) as case:
        return {f.id: f for f in case.findings()}


def _sim(out: Path, deployment: Deployment = SMALL, **kw: object) -> SimResult:
    return simulate_to(out, deployment=deployment, requests=300, rate=3.0, **kw)  # type: ignore[arg-type]


def test_the_placeholder_incident_shows_its_signatures(tmp_path: Path) -> None:
    sim = _sim(tmp_path / "logs", seed=1, over_long=0.05)
    found = _found(tmp_path / "logs", tmp_path / "c.duckdb")
    # Over-long prompts that decode admitted: prefill logs their rejection, then hands them off.
    rejected = {json.loads(line)["request_id"] for f in (tmp_path / "logs").glob("prefill-*.jsonl")
                for line in f.read_text().splitlines() if '"event":"rejected"' in line}
    handed_off = len(rejected)
    assert 0 < handed_off <= sim.over_long
    assert found["config.context_exceeds_pool"].count == SMALL.prefill_nodes
    row = found["config.context_exceeds_pool"].evidence.row(0, named=True)
    assert (row["at_risk_from"], row["at_risk_to"]) == (40_954, 65_535)  # max_req_input_len itself is rejected (>=)
    assert found["handoff.rejected_but_transferred"].count == handed_off
    assert set(found["handoff.rejected_but_transferred"].evidence["request_id"].to_list()) == rejected
    assert found["response.delivered_after_reject"].count == handed_off
    assert found["handoff.coverage_mismatch"].count == handed_off
    assert set(found["handoff.coverage_mismatch"].evidence["tokens"].to_list()) == {1}
    assert not {"kv.late_write", "evidence.seq_gap", "evidence.clock_skew"} & set(found)
    assert list(found)[:2] == ["handoff.rejected_but_transferred", "response.delivered_after_reject"]
    with forensics.Case(tmp_path / "c.duckdb") as case:  # each finding's SQL re-runs by hand
        for f in found.values():
            assert case.sql(f.sql).height == f.count
        unread = case.sql("SELECT DISTINCT request_id, node, boot FROM uninitialized_reads").height
    assert found["kv.uninitialized_read"].count == unread


def test_a_clean_hardened_run_has_no_findings(tmp_path: Path) -> None:
    fits = Deployment(**{**SMALL.__dict__, "engine": "sglang-hardened", "prefill_pool_tokens": 65_536})
    _sim(tmp_path / "logs", fits, seed=2, over_long=0.05)
    assert _found(tmp_path / "logs", tmp_path / "c.duckdb") == {}
    hardened = Deployment(**{**SMALL.__dict__, "engine": "sglang-hardened"})
    _sim(tmp_path / "logs2", hardened, seed=2, over_long=0.05)
    assert set(_found(tmp_path / "logs2", tmp_path / "c2.duckdb")) == {"config.context_exceeds_pool"}


def test_late_writes_are_found_with_the_reads_they_tainted(tmp_path: Path) -> None:
    late_pool = Deployment(**{**SMALL.__dict__, "decode_pool_tokens": 65_600})
    _sim(tmp_path / "logs", late_pool, seed=9, over_long=0.0, late_writes=0.1)
    found = _found(tmp_path / "logs", tmp_path / "c.duckdb")
    timeouts = sum(
        1 for f in (tmp_path / "logs").glob("decode-*.jsonl") for line in f.read_text().splitlines()
        if '"finish_reason":"transfer_timeout"' in line
    )
    assert timeouts > 0
    assert found["kv.late_write"].count == timeouts
    assert found["kv.late_write"].evidence["tainted_readers"].sum() > 0


def test_a_late_write_that_request_level_logs_cannot_show_is_an_evidence_gap(tmp_path: Path) -> None:
    """Logged as SGLang logs it (no page records; decode's timeout a failed transfer, its late
    landing nowhere), each late write shows only as a transfer the prefill sent and the decode
    gave up on: handoff.sent_but_not_received lists exactly those of the page logs' late writes."""
    late_pool = Deployment(**{**SMALL.__dict__, "decode_pool_tokens": 65_600})
    _sim(tmp_path / "logs", late_pool, seed=9, over_long=0.0, late_writes=0.1)
    late = {r["request_id"] for r in _found(tmp_path / "logs", tmp_path / "a.duckdb")["kv.late_write"]
            .evidence.iter_rows(named=True)}
    out = tmp_path / "request-level"
    out.mkdir()
    for f in (tmp_path / "logs").glob("*.jsonl"):
        kept, timed_out = [], {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["kind"] == "kv":
                continue
            if r.get("finish_reason") == "transfer_timeout":
                timed_out[r["request_id"]] = r["ts"]
            if r["kind"] == "transfer" and r["request_id"] in timed_out and r["node"] == r["dst_node"]:
                r = {**r, "event": "failed", "ts": timed_out[r["request_id"]]}
                r.pop("dst_pages", None)
            kept.append(json.dumps(r))
        (out / f.name).write_text("\n".join(kept) + "\n")
    found = _found(out, tmp_path / "b.duckdb")
    assert "kv.late_write" not in found
    gap = found["handoff.sent_but_not_received"].evidence
    assert set(gap["request_id"]) == late and len(late) > 0
    assert (gap["sent_at"] < gap["failed_at"]).all()
    # the job's summary says it beside the replay's figures (no node here logged page records)
    from kvforensics.job import run
    job = run([out], tmp_path / "c.duckdb", None)
    assert job.replays and job.unseen_late_writes == len(late)
    assert job.as_dict()["unseen_late_writes"] == len(late)
    # ... and so do the notebook's summary and the report's first section
    import forensics
    from reports.render import report
    with forensics.Case(tmp_path / "c.duckdb", read_only=True) as case:
        summary = case.summary()
    assert summary.unseen_late_writes == len(late)
    assert f"{len(late):,} transfer(s) sent by prefill" in summary._repr_html_()
    html = report(tmp_path / "c.duckdb", tmp_path / "c.html").out.read_text()
    first = " ".join(html[html.index('id="summary"'):html.index('id="timeline"')].split())
    assert f"{len(late):,} transfer(s) were sent by prefill and given up by one of these nodes" in first
    assert run([tmp_path / "logs"], tmp_path / "d.duckdb", None).unseen_late_writes == 0  # (page records show them)


def test_missing_records_and_shifted_clocks_are_evidence_findings(tmp_path: Path) -> None:
    skewed_logs(tmp_path / "logs", _sim)
    found = _found(tmp_path / "logs", tmp_path / "c.duckdb")
    gaps = found["evidence.seq_gap"].evidence
    assert gaps.select("node", "missing_from", "missing_to").rows() == [
        ("decode-0", 40, 41), ("decode-0", 100, 100), ("decode-0", 250, 250)]
    skew = found["evidence.clock_skew"].evidence
    links = skew.filter(skew["signal"] == "transfer")
    assert set(links["node_b"].to_list()) == {"decode-1"}
    assert links["min_seconds"].min() < -59
    assert all(re.search(r"behind .* by at least", b) for b in links["bound"].to_list())
    assert "decode-0" in skew.filter(skew["signal"] == "ts_before_previous_seq")["node_a"].to_list()
    assert skew.drop("bound").rows() == clock_skew_oracle(tmp_path / "c.duckdb")


def test_case_sql_runs_selects_only_on_a_writable_case(tmp_path: Path) -> None:
    _sim(tmp_path / "logs", seed=4, over_long=0.0)
    forensics.investigate([tmp_path / "logs"], tmp_path / "c.duckdb")
    with forensics.Case(tmp_path / "c.duckdb") as case:
        assert case.sql("SELECT count(*) AS n FROM records")["n"][0] > 0
        for query in ("DELETE FROM records", "SELECT 1; DROP TABLE records", "CREATE TABLE x AS SELECT 1"):
            try:
                case.sql(query)
            except forensics.KvfError as exc:
                assert "SELECT" in str(exc)
            else:
                raise AssertionError(f"ran {query!r}")
        assert case.sql("SELECT count(*) AS n FROM records")["n"][0] > 0
