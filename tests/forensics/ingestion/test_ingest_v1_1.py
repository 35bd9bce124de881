"""Schema v1.1's additions in: ``step_log_interval``, ``cached_tokens``, ``retractions`` and ``step`` records are
kept, checked like every field, read alike by the fast path and the SQL validator, and change
nothing a v1 log gives (docs/schema-v1.1.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import SAMPLE, example_dirs, write_jsonl
from test_ingest import CONFIG, TS, counts_add_up, kv
from test_jsonlines import both_ways

import forensics

DECODE_CONFIG = {**CONFIG, "step_log_interval": 40}
PREFILL_STARTED = {"kind": "request", "ts": TS, "node": "prefill-0", "request_id": "r", "event": "prefill_started",
                   "cached_tokens": 128}
RETRACTED = {"kind": "request", "ts": TS, "node": "decode-1", "request_id": "r", "event": "finished", "status": 200,
             "output_tokens": 12, "retractions": 2}


def step(seq: int | None, running: int = 3, **extra: Any) -> dict[str, Any]:
    return {"kind": "step", "ts": TS, "node": "decode-0", **({"seq": seq} if seq is not None else {}),
            "running": running, **extra}


#: Malformed v1.1 values, each quarantined with its reason like any other field's.
V1_1_QUARANTINE_CASES = [
    ("bad_value", json.dumps({**PREFILL_STARTED, "cached_tokens": -1})),
    ("wrong_type", json.dumps({**PREFILL_STARTED, "cached_tokens": "128"})),
    ("wrong_type", json.dumps({**PREFILL_STARTED, "cached_tokens": 1.5})),
    ("bad_value", json.dumps({**PREFILL_STARTED, "cached_tokens": 2**41})),
    ("bad_value", json.dumps({**RETRACTED, "retractions": -1})),
    ("wrong_type", json.dumps({**RETRACTED, "retractions": "2"})),
    ("wrong_type", json.dumps({**RETRACTED, "retractions": 2.5})),
    ("bad_value", json.dumps({**DECODE_CONFIG, "seq": 9, "step_log_interval": 0})),
    ("wrong_type", json.dumps({**DECODE_CONFIG, "seq": 9, "step_log_interval": True})),
    ("missing_field", json.dumps({k: v for k, v in step(5).items() if k != "running"})),
    ("missing_field", json.dumps(step(5, running=None))),
    ("bad_value", json.dumps(step(5, running=-1))),
    ("wrong_type", json.dumps(step(5, running="3"))),
    ("bad_value", json.dumps(step(5, steps=0))),
    ("wrong_type", json.dumps(step(5, steps=[40]))),
    ("negative_seq", json.dumps(step(-1))),
    ("bad_ts", json.dumps(step(5, ts="yesterday"))),
    ("unknown_kind", json.dumps({**step(5), "kind": "steps"})),
    ("bad_value", json.dumps(step(5, running=0, cache="emptied"))),  # (a flush is the one value)
    ("wrong_type", json.dumps(step(5, running=0, cache=True))),
]


@pytest.mark.parametrize(("reason", "line"), V1_1_QUARANTINE_CASES)
def test_each_malformed_v1_1_value_is_quarantined_with_its_reason(reason: str, line: str, tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text(json.dumps(CONFIG) + "\n" + line + "\n" + json.dumps(kv(1)) + "\n")
    result = forensics.ingest([log], tmp_path / "case.duckdb")
    counts_add_up(result)
    assert (result.records.read, result.records.quarantined) == (3, 1)
    q = forensics.quarantined(tmp_path / "case.duckdb", with_raw=True).to_dicts()
    assert [(r["line"], r["reason"], r["raw"]) for r in q] == [(2, reason, line)]


def test_the_fast_path_reads_v1_1_lines_as_the_sql_validator_does() -> None:
    """The new kind and fields, well formed and not, written plainly and not: the same stage rows."""
    good = [DECODE_CONFIG, PREFILL_STARTED, step(7), step(8, running=0, steps=1), step(None, steps=2**40),
            step(10, running=0, cache="flushed"), RETRACTED, {**RETRACTED, "retractions": 0},
            {**PREFILL_STARTED, "cached_tokens": 0}, {**step(9), "boot": 2}]
    lines = [json.dumps(r) for r in good] + [line for _, line in V1_1_QUARANTINE_CASES]
    lines += [json.dumps(r, separators=(",", ":")) for r in good] + [json.dumps({**step(3), "note": "x"})]
    reference, fast, plain = both_ways(lines)
    assert fast == reference
    assert plain >= len(good) * 2  # (the plain ones took the fast path)


@pytest.mark.parametrize("fast", [True, False])
def test_v1_1_records_are_kept_where_the_replay_reads_them(fast: bool, tmp_path: Path) -> None:
    """``step_log_interval`` a column of config_records, ``cached_tokens`` of request_records, each
    ``step`` a row of step_records with its node, boot and seq; ``decode_steps`` gives each its steps."""
    log = write_jsonl(tmp_path / "a.jsonl", [
        DECODE_CONFIG, kv(1), step(2), step(3, running=5, steps=7), kv(4, op="free"), PREFILL_STARTED,
        {**step(1), "boot": 1}, step(5, running=0, cache="flushed"), RETRACTED])
    db = tmp_path / "case.duckdb"
    result = forensics.ingest([log], db, fast=fast)
    assert result.records.as_dict() == {"read": 9, "ingested": 9, "duplicates": 0, "quarantined": 0}
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT step_log_interval FROM config_records").fetchall() == [(40,)]
        assert con.execute("SELECT event, cached_tokens, retractions FROM request_records ORDER BY event"
                           ).fetchall() == [("finished", None, 2), ("prefill_started", 128, None)]
        assert con.execute("SELECT node, boot, seq, running, steps, cache, line_no FROM step_records "
                           "ORDER BY boot, seq").fetchall() == [
            ("decode-0", 0, 2, 3, None, None, 3), ("decode-0", 0, 3, 5, 7, None, 4),
            ("decode-0", 0, 5, 0, None, "flushed", 8), ("decode-0", 1, 1, 3, None, None, 7)]
        # the boot's config in force gives a step its steps; boot 1 has none
        assert con.execute("SELECT boot, seq, steps, steps_from_config, cache FROM decode_steps ORDER BY boot, seq"
                           ).fetchall() == [(0, 2, 40, True, None), (0, 3, 7, False, None),
                                            (0, 5, 40, True, "flushed"), (1, 1, None, True, None)]
        # in node order with the others, as every record is
        assert con.execute("SELECT kind FROM records WHERE node = 'decode-0' AND boot = 0 ORDER BY seq"
                           ).fetchall() == [("config",), ("kv",), ("step",), ("step",), ("kv",), ("step",)]
    finally:
        con.close()


def test_a_step_record_settles_like_any_other_on_its_key(tmp_path: Path) -> None:
    """A repeated step line is a duplicate; a step and a page record on one (node, boot, seq)
    conflict, the smaller canonical JSON kept, whatever the order of the files."""
    outcomes = set()
    for order in ((step(2), kv(2)), (kv(2), step(2))):
        d = tmp_path / order[0]["kind"]
        files = [write_jsonl(d / "1.jsonl", [CONFIG, kv(1), order[0], step(3)]),
                 write_jsonl(d / "2.jsonl", [order[1], step(3)])]
        result = forensics.ingest(files, d / "case.duckdb")
        counts_add_up(result)
        con = duckdb.connect(str(d / "case.duckdb"), read_only=True)
        kept = con.execute("SELECT seq, kind FROM records ORDER BY seq").fetchall()
        lost = con.execute("SELECT reason FROM quarantine").fetchall()
        dups = con.execute("SELECT count(*) FROM duplicates").fetchall()
        con.close()
        outcomes.add((tuple(kept), tuple(lost), tuple(dups)))
    # {"kind":"kv",...} sorts before {"kind":"step",...}
    assert outcomes == {(((0, "config"), (1, "kv"), (2, "kv"), (3, "step")), (("conflict",),), ((1,),))}


def _with_v1_1(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A v1 log as v1.1 would write it: each decode config with its step interval, each prefill
    start with its cached tokens, and a step record (no seq) after every decode start."""
    out = []
    for r in records:
        if r.get("kind") == "config" and r.get("role") == "decode":
            r = {**r, "step_log_interval": 40}
        if r.get("event") == "prefill_started":
            r = {**r, "cached_tokens": 0}
        out.append(r)
        if r.get("event") == "decode_started":
            out.append({"kind": "step", "ts": r["ts"], "node": r["node"], "boot": r.get("boot", 0), "running": 1})
    return out


@pytest.mark.parametrize("example", [*example_dirs(), SAMPLE], ids=lambda p: p.name)
def test_a_log_with_the_v1_1_fields_gives_the_v1_logs_figures(example: Path, tmp_path: Path) -> None:
    """The exposure analysis never reads v1.1's additions: the same figures and exposures (the
    spec's examples and the shipped sample incident)."""
    found = []
    for name, change in (("v1", lambda rs: rs), ("v1.1", _with_v1_1)):
        files = []
        for path in sorted(example.rglob("*.jsonl")):
            records = [json.loads(t) for t in path.read_text().splitlines() if t.strip()]
            files.append(write_jsonl(tmp_path / name / path.relative_to(example), change(records)))
        db = tmp_path / name / "case.duckdb"
        investigation = forensics.investigate(files, db)
        assert investigation.ingest.records.quarantined == 0
        logged = sum(json.loads(t)["kind"] == "step" for path in example.rglob("*.jsonl")
                     for t in path.read_text().splitlines() if t.strip())  # (the sample's own, from the simulator)
        added = sum(r["kind"] == "step" for f in files for r in map(json.loads, f.read_text().splitlines())) - logged
        assert (added > 0) == (name == "v1.1" and example.name in ("boots-and-inferred-reads", SAMPLE.name))
        con = duckdb.connect(str(db), read_only=True)
        exposures = con.execute("SELECT * EXCLUDE (first_ts) FROM exposures ORDER BY ALL").fetchall()
        con.close()
        found.append((investigation.exposure, exposures))
    assert found[0] == found[1]
