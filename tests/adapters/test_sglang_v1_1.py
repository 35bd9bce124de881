"""Schema v1.1's fields from SGLang's logs as its releases print them (tests/adapters/releases/):
``step`` records from the decode batch lines, ``step_log_interval`` from ``server_args``, and a
prefill's ``cached_tokens`` (docs/schema-v1.1.md). What each line should give is read here from
the fixture lines themselves, not from the adapter; lines changed for a case are the fixtures'
own lines, edited as the case says."""

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


def test_each_decode_batch_line_of_a_dp_ranks_first_scheduler_is_a_step_record() -> None:
    """Every release (0.5.5, 0.5.7, 0.5.8, 0.5.11, 0.5.12, 0.5.18 to 0.5.23: each prints the line
    in its decode logs): each ``Decode batch, #running-req: N`` line is a ``step`` with ``running``
    N on its DP rank's pool at the line's time (on the boot of the process that printed it), its
    steps the interval every decode config states."""
    covered = set()
    for path in _decode_logs():
        text = path.read_text().splitlines()
        outcomes = _translate(path, text)
        intervals = {int(i) for i in _INTERVAL.findall("\n".join(text))}
        assert len(intervals) == 1, path
        configs = [r for out in outcomes.values() if isinstance(out, list) for r in out if r["kind"] == "config"]
        assert configs and {c.get("step_log_interval") for c in configs if c["role"] == "decode"} == intervals
        boot = -1  # (each server_args line starts a process of the server: a boot)
        for n, line in enumerate(text, 1):
            boot += _SERVER_ARGS.match(line) is not None
            if (m := _BATCH.match(line)) is None:
                assert not any(r["kind"] == "step" for r in outcomes.get(n) or [] if isinstance(r, dict)), path
                continue
            node = "decode-0" if m["dp"] is None else f"decode-0.dp{m['dp']}"
            assert outcomes[n] == [{"kind": "step", "ts": _time(m["time"]), "node": node,
                                    "running": int(m["running"]), **({"boot": boot} if boot else {})}], (path, n)
            covered.add(path.parts[-3])
    assert sorted(covered) == RELEASES


@pytest.mark.parametrize("path", _decode_logs(), ids=lambda p: f"{p.parts[-3]}-{p.parts[-2]}")
def test_decode_batch_lines_alike_one_after_the_other_are_one_step_record_of_all_their_steps(path: Path) -> None:
    """Every release's decode log, each batch line printed twice over (two intervals inside the
    log's time resolution): one record, ``steps`` twice the interval, so no step is lost as a
    duplicate; the same line from another DP rank's first scheduler (DP1 TP1 under DP attention at
    TP2) a record of that pool; and, without DP attention, TP1's repeat of TP0's line nothing."""
    text = path.read_text().splitlines()
    interval = int(_INTERVAL.findall("\n".join(text))[0])
    at = next(n for n, line in enumerate(text) if _BATCH.match(line))
    line = text[at]
    m = _BATCH.match(line)
    assert m is not None and m["dp"] == "0" and m["tp"] == "0"
    other_rank = line.replace(" DP0 TP0]", " DP1 TP1]")
    doubled = [*text[: at + 1], line, other_rank, *text[at + 1:]]
    out = _translate(path, doubled)
    boot = sum(_SERVER_ARGS.match(t) is not None for t in text[:at]) - 1
    record = {"kind": "step", "ts": _time(m["time"]), "running": int(m["running"]), **({"boot": boot} if boot else {})}
    assert out[at + 1] == [{**record, "node": "decode-0.dp0", "steps": 2 * interval}]
    assert out[at + 2] is None
    assert out[at + 3] == [{**record, "node": "decode-0.dp1"}]
    # DP attention off: one pool of TP2, whose first scheduler is TP0
    no_attention = [re.sub(r"(attn_dp_size'?[=:] ?)2", r"\g<1>1",
                           re.sub(r"(enable_dp_attention'?[=:] ?)True", r"\g<1>False", t)) for t in doubled]
    repeat = [*no_attention[: at + 2], line.replace(" DP0 TP0]", " DP0 TP1]"), *no_attention[at + 3:]]
    out = _translate(path, repeat)
    assert out[at + 1] == [{**record, "node": "decode-0.dp0", "steps": 2 * interval}]
    assert out[at + 2] is None and out[at + 3] is None


def test_a_server_log_without_its_decode_log_interval_gives_each_batch_line_its_record(tmp_path: Path) -> None:
    """0.5.23's decode log with ``decode_log_interval`` taken out of its ``server_args``: lines alike
    one after the other are a record each (the second a duplicate at ingest), and a note says why."""
    source = ROOT / "0.5.23" / "text" / "decode-0.log"
    text = source.read_text().splitlines()
    at = next(n for n, line in enumerate(text) if _BATCH.match(line))
    unsaid = [re.sub(r"'decode_log_interval': \d+, ", "", t) for t in [*text[: at + 1], text[at], *text[at + 1:]]]
    assert not any(_INTERVAL.search(t) for t in unsaid)
    log = tmp_path / "decode-0.log"
    log.write_text("\n".join(unsaid) + "\n")
    result = forensics.ingest([log], tmp_path / "case.duckdb")
    (f,) = result.files
    assert any("decode_log_interval is unknown" in note for note in f.notes)
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    try:
        assert con.execute("SELECT count(*), count(steps) FROM step_records").fetchall() == [(1, 0)]
        repeats = con.execute("SELECT count(*) FROM duplicates d JOIN step_records s USING (rec_hash)").fetchall()
        assert repeats == [(1,)]
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


@pytest.mark.parametrize("release", RELEASES)
def test_a_prefix_cache_hit_is_the_prefill_starts_cached_tokens(release: str, tmp_path: Path) -> None:
    """Every release's text logs with the prefix cache giving 512 tokens (the fixtures' runs hit
    nothing): what the time stats (0.5.12 on) or the finish (before) say, each prefill start says."""
    folder = tmp_path / "logs"
    for path in sorted((ROOT / release / "text").rglob("*")):
        if path.is_file():
            target = folder / path.relative_to(ROOT / release / "text")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(path.read_text().replace("cached_input_len=0,", "cached_input_len=512,")
                              .replace("'cached_tokens': 0,", "'cached_tokens': 512,"))
    started = _prefill_started(Path(forensics.ingest([folder], tmp_path / "case.duckdb").db))
    assert started and set(started.values()) == {512}
