"""Schema v1.1's fields from SGLang's logs as its releases print them (tests/adapters/releases/):
``step`` records from the decode batch lines, ``step_log_interval`` from ``server_args``, and a
prefill's ``cached_tokens`` (docs/schema-v1.1.md). What each line should give is read here from
the fixture lines themselves, not from the adapter. Every case is on lines as the releases
printed them, but one: a ``server_args`` without ``decode_log_interval``, which no release prints.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import pytest
from test_sglang_releases import ROOT, SETS, numbered

import forensics
from forensics.adapters import Notes, Options
from forensics.adapters.sglang import ADAPTERS as SGLANG
from forensics.ingestion.readers import translated

#: Every release the fixtures hold.
RELEASES = sorted({release for release, _ in SETS})
_BATCH = re.compile(r"^\[(?P<time>[\d\- :.]+?)(?: DP(?P<dp>\d+))?(?: TP(?P<tp>\d+))?\] Decode batch, "
                    r"#running-req: (?P<running>\d+),")
_SERVER_ARGS = re.compile(r"\[[\d\- :.]+\] server_args=")
_INTERVAL = re.compile(r"decode_log_interval'?[=:] ?(\d+)")


def _decode_logs() -> list[Path]:
    """Every decode server log of the fixtures that has a decode batch line."""
    return sorted(p for p in ROOT.glob("*/*/decode-0.log") if "Decode batch" in p.read_text())


def _translate(path: Path, text: list[str]) -> dict[int, Any]:
    """The adapter's outcome of each line of ``text`` (read as the file ``path``), by line number."""
    adapter = next(a for a in SGLANG if a.sniff(text[:64]))
    return {n: out for n, _, out in translated(adapter, numbered(text), path, Options(), Notes())}


def _time(text: str) -> str:
    at = dt.datetime.fromisoformat(text.replace(" ", "T") + "+00:00")
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _schedulers_per_dp_rank(text: list[str]) -> int:
    """The schedulers of each DP rank (the attention-TP size), as the ``server_args`` line says:
    with DP attention the TP ranks split among the DP ranks, without it one pool has them all."""
    args = next(t for t in text if _SERVER_ARGS.match(t))
    tp = int(re.findall(r"(?<![a-z_])'?tp_size'?[=:] ?(\d+)", args)[0])
    if re.search(r"enable_dp_attention'?[=:] ?True", args) is None:
        return tp
    dp = re.findall(r"attn_dp_size'?[=:] ?(\d+)", args) or re.findall(r"(?<![a-z_])'?dp_size'?[=:] ?(\d+)", args)
    return tp // int(dp[0])


def _expected_steps(text: list[str]) -> dict[int, list[dict[str, Any]] | None]:
    """What each batch line of a decode log should give, worked out from the lines alone: a line
    of a scheduler that is not its DP rank's first (its TP rank not a multiple of the attention-TP
    size) nothing; else the first of a run of lines alike of its scheduler (the same time and
    running batch, one after the other among that scheduler's lines) a ``step`` whose ``steps``
    counts the run's intervals (none said for a run of one), the rest of the run nothing."""
    interval = int(_INTERVAL.findall("\n".join(text))[0])
    per_rank = _schedulers_per_dp_rank(text)
    boot = -1
    records: dict[int, dict[str, Any]] = {}  # line -> the record of the run it starts
    lengths: dict[int, int] = {}  # line -> the lines of the run it starts
    last: dict[tuple[str | None, int], tuple[int, str, str]] = {}  # scheduler -> its run's start, time, running
    out: dict[int, list[dict[str, Any]] | None] = {}
    for n, line in enumerate(text, 1):
        boot += _SERVER_ARGS.match(line) is not None
        if (m := _BATCH.match(line)) is None:
            continue
        out[n] = None
        scheduler = (m["dp"], int(m["tp"] or 0))
        if scheduler[1] % per_rank:
            continue
        if (run := last.get(scheduler)) is not None and run[1:] == (m["time"], m["running"]):
            lengths[run[0]] += 1
            continue
        last[scheduler], lengths[n] = (n, m["time"], m["running"]), 1
        node = "decode-0" if m["dp"] is None else f"decode-0.dp{m['dp']}"
        records[n] = {"kind": "step", "ts": _time(m["time"]), "node": node, "running": int(m["running"]),
                      **({"boot": boot} if boot else {})}
    for n, record in records.items():
        out[n] = [{**record, "steps": lengths[n] * interval} if lengths[n] > 1 else record]
    return out


def test_each_decode_batch_line_of_a_dp_ranks_first_scheduler_is_a_step_record() -> None:
    """Every release (0.5.5, 0.5.7, 0.5.8, 0.5.11, 0.5.12, 0.5.18 to 0.5.23), every decode log the
    release printed (the scripted run in each form, the reuse, rotated and hostile runs, and the
    decode servers of other layouts): each ``Decode batch, #running-req: N`` line of a DP rank's
    first scheduler is a ``step`` with ``running`` N on its DP rank's pool at the line's time (on
    the boot of the process that printed it), lines alike one after the other one record; every
    other line nothing; and every decode config states the interval ``server_args`` prints."""
    covered: dict[str, set[str]] = {}
    for path in _decode_logs():
        text = path.read_text().splitlines()
        outcomes = _translate(path, text)
        intervals = {int(i) for i in _INTERVAL.findall("\n".join(text))}
        assert len(intervals) == 1, path
        configs = [r for out in outcomes.values() if isinstance(out, list) for r in out if r["kind"] == "config"]
        assert configs and {c.get("step_log_interval") for c in configs if c["role"] == "decode"} == intervals
        expected = _expected_steps(text)
        steps = {n: out for n, out in outcomes.items()  # (a retraction's or a flush's step says "cache")
                 if isinstance(out, list) and any(r["kind"] == "step" and "cache" not in r for r in out)}
        assert set(steps) <= set(expected), path  # (no other line gives a decode batch's step)
        for n, want in expected.items():
            assert outcomes[n] == want, (path, n, text[n - 1])
        covered.setdefault(path.parts[-3], set()).update(r["node"] for out in steps.values() for r in out)
    assert sorted(covered) == RELEASES
    # the scripted run's decode server: both DP ranks' first schedulers (DP0 TP0, DP1 TP1) print
    assert all({"decode-0.dp0", "decode-0.dp1"} <= nodes for nodes in covered.values())


@pytest.mark.parametrize("release", RELEASES)
def test_decode_batch_lines_alike_one_after_the_other_are_one_step_record_of_all_their_steps(release: str) -> None:
    """Every release, its text decode log as printed: req-a2's decode on DP1 crosses three
    ``decode_log_interval``s (40 steps, 12 ms each) inside one second, so DP1 TP1 prints three
    lines alike (the same time and running batch): one record whose ``steps`` is three intervals,
    so no step is lost as a duplicate, and nothing for the other two."""
    path = ROOT / release / "text" / "decode-0.log"
    text = path.read_text().splitlines()
    interval = json.loads((ROOT / release / "SOURCE.json").read_text())["decode_log_interval"]
    assert {int(i) for i in _INTERVAL.findall("\n".join(text))} == {interval}
    runs: list[list[int]] = []  # DP1's lines, in runs of lines alike
    for n, t in enumerate(text, 1):
        if (m := _BATCH.match(t)) is not None and m["dp"] == "1":
            if runs and _BATCH.match(text[runs[-1][-1] - 1])[0] == m[0]:  # type: ignore[index]
                runs[-1].append(n)
            else:
                runs.append([n])
    run = next((r for r in runs if len(r) > 1), [])
    assert len(run) >= 2, "the run should print lines alike on DP1"
    first = run[0]
    out = _translate(path, text)
    (record,) = out[first]
    assert record["node"] == "decode-0.dp1" and record["steps"] == len(run) * interval
    assert all(out[n] is None for n in run[1:])


def _version(release: str) -> tuple[int, ...]:
    return tuple(map(int, release.split(".")))


def _batch_runs(release: str) -> dict[str, dict[str, Any]]:
    return {r["folder"]: r for r in json.loads((ROOT / release / "SOURCE.json").read_text())["batch_runs"]}


@pytest.mark.parametrize("release", RELEASES)
def test_a_batch_line_of_a_dp_ranks_other_scheduler_is_no_record(release: str) -> None:
    """The decode servers started with --enable-metrics-for-all-schedulers (SOURCE.json
    ``batch_runs``): in 0.5.5, 0.5.7 and 0.5.8 every scheduler prints its batch line (the
    release's ``logger.info(msg)`` unguarded): at TP4 with DP attention DP2, DP0 TP1's and DP1
    TP3's lines repeat their DP rank's first (TP0, TP2) and give nothing, TP0's and TP2's each
    a record of its DP rank's pool; at TP2 without DP attention, TP1's gives nothing and TP0's a
    record of the server's one pool. From 0.5.11 the line is printed only by a DP rank's first
    scheduler (attention-TP rank 0) whatever the flag: none other is in the log."""
    runs = _batch_runs(release)
    every = release in ("0.5.5", "0.5.7", "0.5.8")
    layouts: list[tuple[str, dict[tuple[str | None, int], str], set[tuple[str | None, int]]]] = [
        ("text-all-schedulers", {("0", 0): "decode-0.dp0", ("1", 2): "decode-0.dp1"}, {("0", 1), ("1", 3)}),
        ("text-no-dp-attention", {(None, 0): "decode-0"}, {(None, 1)})]
    for folder, firsts, others in layouts:
        assert runs[folder]["every_scheduler_prints"] is every
        path = ROOT / release / folder / "decode-0.log"
        text = path.read_text().splitlines()
        out = _translate(path, text)
        lines = {n: m for n, t in enumerate(text, 1) if (m := _BATCH.match(t)) is not None}
        by = {(m["dp"], int(m["tp"])) for m in lines.values()}
        assert by == set(firsts) | (others if every else set()), (folder, by)
        for n, m in lines.items():
            scheduler = (m["dp"], int(m["tp"]))
            if scheduler in others:
                assert out[n] is None, (folder, n)
            elif out[n] is not None:  # (the first of a run of lines alike)
                (record,) = out[n]
                assert record["kind"] == "step" and record["node"] == firsts[scheduler], (folder, n)
        recorded = {r["node"] for o in out.values() if isinstance(o, list) for r in o if r["kind"] == "step"}
        assert recorded == set(firsts.values()), folder


def test_a_server_log_without_its_decode_log_interval_gives_each_batch_line_its_record(tmp_path: Path) -> None:
    """A foreign or hostile input, not any release's output: every release (0.5.5 to 0.5.23) has
    ``decode_log_interval`` among its ServerArgs and prints it in its ``server_args`` line, so no
    release prints this case. 0.5.23's text decode log with ``decode_log_interval`` cut out of
    its ``server_args``: the lines alike one after the other that it printed (three on DP1 in one
    second) are a record each (the repeats duplicates at ingest), and a note says why."""
    source = ROOT / "0.5.23" / "text" / "decode-0.log"
    text = source.read_text().splitlines()
    said = [(m["dp"], m["time"], m["running"]) for t in text if (m := _BATCH.match(t)) is not None]
    records = len(set(said))  # (a record a line: the lines alike give records alike, kept once)
    unsaid = [re.sub(r"'decode_log_interval': \d+, ", "", t) for t in text]
    assert not any(_INTERVAL.search(t) for t in unsaid) and records < len(said)
    log = tmp_path / "decode-0.log"
    log.write_text("\n".join(unsaid) + "\n")
    result = forensics.ingest([log], tmp_path / "case.duckdb")
    (f,) = result.files
    assert any("decode_log_interval is unknown" in note for note in f.notes)
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*), count(steps) FROM step_records WHERE cache IS NULL").fetchall() == [
            (records, 0)]
        repeats = con.execute("SELECT count(*) FROM duplicates d JOIN step_records s USING (rec_hash)").fetchall()
        assert repeats == [(len(said) - records,)]
        assert con.execute("SELECT DISTINCT steps FROM decode_steps").fetchall() == [(None,)]
    finally:
        con.close()


_STATS_CACHED = re.compile(r"ReqTimeStats\(rid=(?P<rid>[^,]+), .*?cached_input_len=(?P<n>\d+), .*type=prefill\)")
_TEXT_FINISH = re.compile(r"Finish: obj=GenerateReqInput\(.*?\brid='(?P<rid>[^']+)'.*'cached_tokens': (?P<n>\d+)")


def _cached_said(folder: Path) -> dict[str, int]:
    """What a set's prefill logs say each request took from the prefix cache: its time stats'
    ``cached_input_len``, else its finish line's ``meta_info.cached_tokens``."""
    stats: dict[str, int] = {}
    finishes: dict[str, int] = {}
    for path in sorted(folder.rglob("*.log")):
        if not (path.name.startswith("prefill") or path.parent.name.startswith("prefill")):
            continue
        for line in path.read_text().splitlines():
            if (m := _STATS_CACHED.search(line)) is not None:
                stats.setdefault(m["rid"], int(m["n"]))
            elif (m := _TEXT_FINISH.search(line)) is not None:
                finishes.setdefault(m["rid"], int(m["n"]))
            elif '"request.finished"' in line:
                doc = json.loads(line[line.index("{"):])
                meta = doc["out"]["meta_info"]
                if "cached_tokens" in meta:
                    finishes.setdefault(doc["rid"], meta["cached_tokens"])
    return {**finishes, **stats}


def _prefill_started(db: Path) -> dict[str, int | None]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return dict(con.execute("SELECT request_id, cached_tokens FROM request_records "
                                "WHERE event = 'prefill_started'").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize(("release", "form"), SETS, ids=[f"{r}-{f}" for r, f in SETS])
def test_a_prefill_start_says_what_the_prefix_cache_gave_it(release: str, form: str, tmp_path: Path) -> None:
    """Every release and form: ``cached_tokens`` from the time stats' ``cached_input_len`` (0.5.12
    on), else from the request log's finish (``meta_info.cached_tokens``: 0.5.5 to 0.5.11, in the
    text form and the JSON one, in --log-requests-target files from 0.5.8)."""
    folder = ROOT / release / form
    said = _cached_said(folder)
    started = _prefill_started(Path(forensics.ingest([folder], tmp_path / "case.duckdb").db))
    assert started
    assert started == {rid: said.get(rid) for rid in started}
    assert all(n is not None for n in started.values())  # (every release logs one or the other)


@pytest.mark.parametrize(("release", "form"), SETS, ids=[f"{r}-{f}" for r, f in SETS])
def test_a_prefix_cache_hit_is_the_prefill_starts_cached_tokens(release: str, form: str, tmp_path: Path) -> None:
    """Every release and form: req-a3's prompt begins with req-a1's first 640 tokens (SOURCE.json
    ``prefix_cache_hits``), so the release's prefill takes ten 64-token pages from its prefix
    cache (at most ``input_len - 1`` tokens, page-aligned) and prints that non-zero count: in
    its time stats' ``cached_input_len`` (0.5.12 on) and its finish's ``meta_info.cached_tokens``
    (every release); the prefill start record says it, and every other request's says 0."""
    hits = {h["rid"]: h["cached_tokens"] for h in json.loads((ROOT / release / "SOURCE.json").read_text())
            ["prefix_cache_hits"]}
    assert hits == {"req-a3": 640}
    folder = ROOT / release / form
    prefill = "\n".join(p.read_text() for p in sorted(folder.rglob("*.log"))
                        if p.name.startswith("prefill") or p.parent.name.startswith("prefill"))
    finish = re.compile(r"Finish: obj=GenerateReqInput\(.*?\brid='req-a3'.*'cached_tokens': 640\b|"
                        r'"request.finished", "rid": "req-a3".*"cached_tokens": 640\b')
    assert finish.search(prefill)
    stats = re.findall(r"ReqTimeStats\(rid=req-a3, .*?cached_input_len=(\d+), .*type=prefill\)", prefill)
    assert stats == (["640"] * len(stats)) and (len(stats) > 0) is ("cached_input_len=" in prefill)
    assert bool(stats) is (_version(release) >= (0, 5, 12))
    started = _prefill_started(Path(forensics.ingest([folder], tmp_path / "case.duckdb").db))
    assert started["req-a3"] == 640
    assert {n for rid, n in started.items() if rid != "req-a3"} == {0}
