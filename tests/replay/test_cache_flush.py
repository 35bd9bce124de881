"""A node's caches flushed (SGLang's ``flush_cache``; schema v1.1: a ``step`` record with
``cache: "flushed"``): the replay starts the node's pool and prefix cache afresh there, as the
allocator's ``clear`` does, and counts its decode steps from 0 again.

Held to a generator that shares no code with ``replay/`` (tests/independent_logs.py, ``flush``:
written from docs/schema-v1.1.md, "A cache flush"), with the page records stripped. Without the
flush record the same logs name other victims, and nothing says so: what a replay that did not
read it would have told an operator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from independent_logs import Layout, generate, strip_pages
from typer.testing import CliRunner

import forensics
from kvforensics.cli import app
from replay.engine import NodeConfig, NodeEngine
from replay.logset import LogSet
from replay.pool import PagePool
from replay.replay import ReplayResult, replay
from replay.schedule import StepClock

FLUSHED = '"cache": "flushed"'

LAYOUTS = {
    "every node flushed halfway": Layout(flush=True),
    "with prefill's prefix cache and step records": Layout(flush=True, prefix_cache=True, step_log=40),
    "steps drifting by 30%, times to the millisecond, step records": Layout(flush=True, jitter_ns=300_000,
                                                                             ms_times=True, step_log=40),
}


def _replayed(logs: Path, tmp: Path, engine: str = "sglang-placeholder") -> ReplayResult:
    forensics.investigate([logs], tmp / f"{logs.name}.duckdb")
    return replay(tmp / f"{logs.name}.duckdb", engine, tmp / f"{logs.name}.replay")


def _without_flushes(logs: Path, out: Path) -> Path:
    out.mkdir()
    for f in sorted(logs.glob("*.jsonl")):
        (out / f.name).write_text("".join(line + "\n" for line in f.read_text().splitlines() if FLUSHED not in line))
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_flushed_nodes_victims_are_the_page_logs(name: str, tmp_path: Path) -> None:
    full = generate(tmp_path / "full", seed=3, requests=200, layout=LAYOUTS[name])
    flushes = sum(FLUSHED in line for f in full.glob("*.jsonl") for line in f.read_text().splitlines())
    assert flushes == 4  # (every engine node, once)
    truth = forensics.investigate([full], tmp_path / "full.duckdb").exposure
    assert truth["exposed_responses"] > 0
    stripped = strip_pages(full, tmp_path / "stripped")
    result = _replayed(stripped, tmp_path)
    assert result.exposure == truth
    assert result.disagreements == ()
    replayed = [r for f in sorted((result.out / "logs").glob("*.jsonl"))
                for r in map(json.loads, f.read_text().splitlines()) if r.get("cache") == "flushed"]
    assert sorted(r["node"] for r in replayed) == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    assert result.cache_flushes == 4 and result.as_dict()["cache_flushes"] == 4
    said = CliRunner().invoke(app, ["replay", "--db", str(tmp_path / "stripped.duckdb"), "--out",
                                    str(tmp_path / "again")])
    assert said.exit_code == 0 and "4 cache flushes read (SGLang's flush_cache, on an idle node)" in said.stdout
    # without the flush record the replay names other victims, and lists nothing
    blind = _replayed(_without_flushes(stripped, tmp_path / "blind"), tmp_path)
    assert blind.exposure["victim_requests"] != truth["victim_requests"]
    assert blind.disagreements == ()


def test_the_prefix_cache_lets_its_prompts_go_at_a_flush(tmp_path: Path) -> None:
    """Prefill's cached prompts are freed at the flush, by the requests that wrote them, in the
    replay as in the generator: every allocation after it, prefill's included, the logged one."""
    full = generate(tmp_path / "full", seed=11, requests=200, layout=Layout(flush=True, prefix_cache=True))
    freed_at_flush = 0
    for f in full.glob("prefill-*.jsonl"):
        records = [json.loads(line) for line in f.read_text().splitlines()]
        at = next(r["ts"] for r in records if r.get("cache") == "flushed")
        freed_at_flush += sum(r["kind"] == "kv" and r["op"] == "free" and r["ts"] == at for r in records)
    assert freed_at_flush > 0
    forensics.investigate([full], tmp_path / "full.duckdb")
    result = replay(tmp_path / "full.duckdb", "sglang-placeholder", tmp_path / "replay")
    assert result.disagreements == () and result.agreement is not None
    assert result.agreement.reproduced_allocations == result.agreement.logged_allocations


def test_a_flush_where_the_replay_is_busy_is_listed_and_a_what_if_does_not_flush(tmp_path: Path) -> None:
    """SGLang flushes only an idle node. A flush record moved to where decode-0 is mid-run:
    confirming, the replay follows the logs (the pool starts afresh) and lists each request it
    still held there; a what-if, whose node is busy there too, does not flush (SGLang would have
    logged "Cache not flushed"), and its replayed logs have no flush record there."""
    full = generate(tmp_path / "full", seed=5, requests=120)
    stripped = strip_pages(full, tmp_path / "stripped")
    decode = stripped / "decode-0.jsonl"
    records = [json.loads(line) for line in decode.read_text().splitlines()]
    k = next(i for i, r in enumerate(records) if i > len(records) // 2 and r.get("event") == "decode_started")
    records.insert(k + 1, {"kind": "step", "ts": records[k]["ts"], "node": "decode-0", "running": 0,
                           "cache": "flushed"})
    for seq, r in enumerate(records):
        r["seq"] = seq
    decode.write_text("".join(json.dumps(r) + "\n" for r in records))
    confirmed = _replayed(stripped, tmp_path)
    busy = [d for d in confirmed.disagreements if d.kind == "flush_not_idle"]
    assert busy and all(d.node == "decode-0" for d in busy)
    assert records[k]["request_id"] in {d.request_id for d in busy}
    assert confirmed.cache_flushes == 1
    what_if = replay(tmp_path / "stripped.duckdb", "sglang-hardened", tmp_path / "what-if")
    assert what_if.mode == "what-if" and what_if.cache_flushes == 0
    replayed = [json.loads(line) for f in sorted((what_if.out / "logs").glob("*.jsonl"))
                for line in f.read_text().splitlines()]
    assert any(r["node"] == "decode-0" for r in replayed)
    assert not any(r.get("cache") == "flushed" for r in replayed)


def test_a_flush_fixes_the_step_count_a_record_after_it_reports() -> None:
    """SGLang's count of decode steps starts again from 0 at a flush (``reset_metrics``), and the
    node was idle there: the next record's step is the flush's plus the steps it reports, exact,
    where a boot's first record fixes nothing (its count includes the warmup's steps)."""
    fresh = StepClock(None)
    assert fresh.reported(40, 1, seq=3, ts_ns=0) is None
    clock = StepClock(None)
    clock.steps = 1_234
    clock.flushed()
    assert clock.reported(40, 1, seq=3, ts_ns=0) == 1_274
    blind = StepClock(None, blind=True)
    blind.steps = 1_234
    blind.flushed()
    assert blind.reported(40, 1, seq=3, ts_ns=0) is None  # (its batch is not the node's: nothing pinned)


def test_a_flushed_pool_is_a_fresh_one() -> None:
    """The engine's flush leaves the pool as a fresh one (the free list ``1..n-1``, nothing released),
    which tests/replay/test_allocator_fixtures.py holds to SGLang's own ``clear`` (the ``flush``
    fixtures of 0.5.11, 0.5.21 and 0.5.23, page sizes 1 and 64), however far from fresh it was."""
    engine = NodeEngine(NodeConfig("decode-0", "decode", 10_000, 16, 50), "sglang-placeholder", LogSet(),
                        {}, {})
    taken = [engine.pool.alloc(n) for n in (5, 7, 3)]
    engine.pool.release(taken[1])
    engine.pool.release(taken[0])
    engine.pool.alloc_decode(2, 40)  # (a batch past the free list: the released pages merged)
    assert engine.pool.merges == 1 and engine.pool.free_list().tolist() != list(range(1, 50))
    engine.flush("2026-09-14T08:00:00Z")
    fresh = PagePool(50)
    assert engine.pool.free_list().tolist() == fresh.free_list().tolist() == list(range(1, 50))
    assert engine.pool.released_pages().tolist() == [] and engine.pool.available == 49


def test_the_job_and_its_report_say_how_many_flushes_the_replay_read(tmp_path: Path) -> None:
    """The whole job (investigate with a report) on the flushed logs: the confirming replay's
    flushes are kept in the case's ``replays`` and the report says so beside the replay's figures."""
    full = generate(tmp_path / "full", seed=3, requests=120, layout=Layout(flush=True))
    stripped = strip_pages(full, tmp_path / "stripped")
    report = tmp_path / "report.html"
    cli = CliRunner().invoke(app, ["investigate", str(stripped), "--db", str(tmp_path / "case.duckdb"),
                                   "--out", str(report)])
    assert cli.exit_code == 0, cli.output
    assert "4 cache flushes read (SGLang's flush_cache, on an idle node)" in cli.stdout
    with forensics.Case(tmp_path / "case.duckdb", read_only=True) as case:
        kept = dict(case.sql("SELECT engine, cache_flushes FROM replays").iter_rows())
    assert kept["sglang-placeholder"] == 4
    assert "The sglang-placeholder replay read 4 cache flushes (SGLang's flush_cache" in report.read_text()


PRINTED = Path(__file__).resolve().parents[1] / "adapters" / "printed"


@pytest.mark.parametrize("run", sorted(p.name for p in PRINTED.glob("*-flush-*")))
def test_a_flush_in_logs_sglang_printed_is_read_and_replayed_from_end_to_end(run: str, tmp_path: Path) -> None:
    """Generator runs whose every node is flushed halfway, as SGLang 0.5.11 (``Cache flushed
    successfully!`` on every scheduler; with ``Decode batch`` lines) and 0.5.19 (on each DP rank's
    first scheduler; prefill's prefix cache on) print them: tests/adapters/printed, made by
    scripts/make_sglang_printed_runs.py through each release's own code from the generator's log set,
    which this test makes again. The SGLang adapter reads one flush a node, and the replay of its
    records names the generator's page records' victims, all eight figures, with nothing listed.
    With the flush lines taken out of the same logs the replay names other victims, silently."""
    import gzip

    from forensics.adapters import read_tenant_map
    from forensics.adapters.base import Options

    folder = PRINTED / run
    made = json.loads((folder / "RUN.json").read_text())
    assert json.loads((folder / "SOURCE.json").read_text())["release"] == made["release"] == run.split("-")[0]
    full = generate(tmp_path / "full", seed=made["seed"], requests=made["requests"], layout=Layout(**made["layout"]))
    received = {json.loads(line)["request_id"] for line in (full / "router.jsonl").read_text().splitlines()
                if '"received"' in line}
    tenants = read_tenant_map(folder / "tenants.json")
    assert set(tenants) == received  # (the printed run is this run)
    truth = forensics.investigate([full], tmp_path / "full.duckdb").exposure
    assert truth["exposed_responses"] > 0
    logs = tmp_path / "sglang"
    logs.mkdir()
    for gz in sorted(folder.glob("*.log.gz")):
        (logs / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    flushed = {f.stem: f.read_text().count("Cache flushed successfully!") for f in sorted(logs.glob("*.log"))}
    every = made["release"] == "0.5.11"  # (to 0.5.12 each of a server's 2 TP schedulers prints it)
    assert flushed == {node: 2 if every else 1 for node in ("decode-0", "decode-1", "prefill-0", "prefill-1")}
    options = Options(tenants=tenants)
    found = forensics.investigate(sorted(logs.glob("*.log")), tmp_path / "sglang.duckdb", options=options)
    assert found.ingest.records.quarantined == 0
    with forensics.Case(tmp_path / "sglang.duckdb", read_only=True) as case:
        steps = dict(case.sql("SELECT node, count(*) FROM step_records WHERE cache = 'flushed' GROUP BY node")
                     .iter_rows())
    assert steps == {"decode-0": 1, "decode-1": 1, "prefill-0": 1, "prefill-1": 1}
    result = replay(tmp_path / "sglang.duckdb", "sglang-placeholder", tmp_path / "replayed")
    assert result.exposure == truth
    assert result.disagreements == () and result.cache_flushes == 4
    if made["layout"].get("step_log"):
        assert result.step_records > 0
    blind = tmp_path / "blind"
    blind.mkdir()
    for f in sorted(logs.glob("*.log")):
        (blind / f.name).write_text("".join(line for line in f.read_text().splitlines(keepends=True)
                                            if "Cache flushed" not in line))
    forensics.investigate(sorted(blind.glob("*.log")), tmp_path / "blind.duckdb", options=options)
    unread = replay(tmp_path / "blind.duckdb", "sglang-placeholder", tmp_path / "blind-replayed")
    assert unread.cache_flushes == 0 and unread.disagreements == ()
    assert unread.exposure["victim_requests"] != truth["victim_requests"]
