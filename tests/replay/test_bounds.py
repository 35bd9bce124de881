"""Every bound a bound (issue #44 item 2): what the ingest accepts, the replay handles, its
memory following the pages used and not the pool's size (a config may say 2^40 pages)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from replay.pool import PagePool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "fixtures" / "examples" / "placeholder"
#: The largest pool the ingest accepts (schema.PLAUSIBLE_COUNT) and its last page id (13 digits).
LARGEST = 2**40


def test_a_pool_of_2_to_the_40_pages_costs_what_its_pages_in_use_cost() -> None:
    """Allocations, releases and merges on the largest pool: the pages handed out are those of a
    small pool, and the memory traced stays under a MiB."""
    small, large = PagePool(4096), PagePool(LARGEST)
    tracemalloc.start()
    try:
        for pool in (small, large):
            held = [pool.alloc(n) for n in (3, 50, 7, 200)]
            pool.release(held[1])
            pool.release(held[0])
            pool.merge_and_sort_free()
            held.append(pool.alloc_decode(2, 5))
            held.extend(pool.alloc_extend([4, 60], 64 * 64, 64) or [])
            pool.check([h for i, h in enumerate(held) if i > 1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert large.available == LARGEST - 1 - (small.pool_pages - 1 - small.available)
    assert np.array_equal(large.free_list(100), small.free_list()[:100])
    assert large.free_count == LARGEST - large.fresh + len(small.free_list()) - (small.pool_pages - small.fresh)
    assert np.array_equal(small.free_list(100), small.free_list()[:100])
    assert len(small.free_list(10**6)) == small.free_count


def _peak_mib(args: list[str], stdout: Path) -> tuple[int, float]:
    """Exit code and peak resident memory (MiB) of ``kvforensics ARGS`` run alone, its output
    into ``stdout``."""
    code = (
        "import resource, subprocess, sys\n"
        f"with open({str(stdout)!r}, 'w') as out:\n"
        f"    rc = subprocess.run([{str(Path(sys.executable).with_name('kvforensics'))!r}, *sys.argv[1:]], "
        "stdout=out, stderr=subprocess.PIPE).returncode\n"
        "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    rc, mib = out.stdout.split()
    return int(rc), float(mib)


def _example_with_pool(folder: Path, pool_pages: int) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for line in (EXAMPLE / "events.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "config":
            rec["pool_pages"] = pool_pages
        lines.append(json.dumps(rec))
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_whole_job_on_the_largest_pool_runs_in_the_memory_of_a_small_one(tmp_path: Path) -> None:
    """The incident in miniature with its decode pool said to hold 2^40 pages: investigate, the
    replays and the report finish (as on 16 pages), the figures from the page logs the same, and
    the peak memory within 100 MiB of the small pool's (it was an array of every page id: 8 TiB)."""
    runs = {}
    for pool in (16, LARGEST):
        logs = _example_with_pool(tmp_path / str(pool) / "logs", pool)
        db, out = tmp_path / str(pool) / "case.duckdb", tmp_path / str(pool) / "report.html"
        printed = tmp_path / str(pool) / "out.json"
        rc, mib = _peak_mib(["investigate", str(logs), "--db", str(db), "--out", str(out), "--json"], printed)
        assert rc in (0, 7), rc  # (7: the replay disagreed with the logs, said and listed)
        assert out.is_file()
        runs[pool] = (mib, json.loads(printed.read_text()))
    want = json.loads((EXAMPLE / "expected.json").read_text())["exposure"]
    for pool, (_, summary) in runs.items():
        assert {k: summary["exposure"][k] for k in want} == want, pool
    assert runs[LARGEST][0] < runs[16][0] + 100, {p: mib for p, (mib, _) in runs.items()}


def test_a_page_id_of_13_digits_is_a_page_id(tmp_path: Path) -> None:
    """The last page of the largest pool, 2^40 - 1, is read as a page (it was quarantined as not
    a list of page ranges) and one beyond the pool's is quarantined as beyond it."""
    import forensics

    logs = _example_with_pool(tmp_path / "logs", LARGEST)
    last = LARGEST - 1
    extra = [{"kind": "kv", "ts": "2026-08-27T10:00:01.000000Z", "node": "decode-0", "seq": 100 + i,
              "request_id": "z", "op": op, "pages": pages}
             for i, (op, pages) in enumerate([("alloc", f"{last - 5}-{last}"), ("free", f"{last - 5}-{last}"),
                                              ("alloc", f"{last + 1}")])]
    with (logs / "events.jsonl").open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in extra)
    inv = forensics.investigate([logs], tmp_path / "case.duckdb")
    with forensics.Case(tmp_path / "case.duckdb", read_only=True) as case:
        reasons = case.sql("SELECT reason, count(*) AS n FROM quarantine GROUP BY ALL").to_dicts()
        top = case.sql("SELECT max(max_page) AS m FROM kv_records").to_dicts()
    assert reasons == [{"reason": "page_out_of_range", "n": 1}]
    assert top == [{"m": last}]
    assert inv.ingest.records.quarantined == 1



def _decode_engine(page_size: int, requests: list[tuple[str, int, int]]) -> tuple[Any, Any]:
    """A decode node of the largest pool with ``requests`` (id, prompt tokens, outputs) planned."""
    from replay.engine import NodeConfig, NodeEngine, Request, plan
    from replay.logset import LogSet

    config = NodeConfig("decode-0", "decode", LARGEST, page_size, LARGEST)
    known = {rid: Request(rid, "t", prompt, outputs, "p", "decode-0", outputs) for rid, prompt, outputs in requests}
    log = LogSet()
    engine = NodeEngine(config, "sglang-placeholder", log, known,
                        {rid: plan(r, "sglang-placeholder", config) for rid, r in known.items()})
    return engine, log


def _event(rid: str, event: str, second: int = 0) -> dict[str, Any]:
    return {"kind": "request", "ts": f"2026-01-01T00:00:{second:02d}Z", "request_id": rid, "event": event}


def test_a_request_at_the_replays_bound_is_replayed_and_one_page_more_is_listed_not_held() -> None:
    """A prompt of exactly MAX_REQUEST_PAGES pages is preallocated page for page; one token more
    is a ``beyond_replay_bound`` disagreement, the request going on holding no pages (it was an
    array of 2^37 page ids for a 2^39-token prompt: a MemoryError)."""
    from replay.engine import MAX_REQUEST_PAGES

    engine, log = _decode_engine(64, [("at", MAX_REQUEST_PAGES * 64, 1), ("past", MAX_REQUEST_PAGES * 64 + 1, 1)])
    assert engine.handle(_event("at", "admitted"))
    assert engine.held["at"].prompt is not None and len(engine.held["at"].prompt) == MAX_REQUEST_PAGES
    assert engine.disagreements == []
    assert engine.handle(_event("past", "admitted", 1))
    assert engine.held["past"].prompt is None
    assert [(d.request_id, d.kind) for d in engine.disagreements] == [("past", "beyond_replay_bound")]
    assert f"{MAX_REQUEST_PAGES + 1:,} pages" in engine.disagreements[0].detail
    assert not any('"request_id":"past","op"' in line for line in log.lines["decode-0"])


def test_an_output_past_the_bound_takes_no_steps_and_one_within_takes_each() -> None:
    """A row (prompt and output) of exactly MAX_REQUEST_PAGES pages decodes step by step; a row of
    one page more reads its prompt and takes no step (a 2^40-token output ran for ever)."""
    from replay.engine import MAX_REQUEST_PAGES, decode_steps

    page = 1024
    prompt = (MAX_REQUEST_PAGES - 2) * page  # two pages short of the bound
    within = 2 * page - decode_steps(2, True) + 2  # under overlap: prompt + outputs slots, 2 pages more
    engine, _ = _decode_engine(page, [("within", prompt, within), ("past", page, 2**40)])
    for rid in ("within", "past"):
        engine.handle(_event(rid, "admitted"))
        engine.handle({**_event(rid, "completed", 1), "kind": "transfer", "tokens": engine.requests[rid].prompt_tokens})
        engine.handle(_event(rid, "decode_started", 2))
    assert engine.batch == ["within"]
    assert engine.advance(1 << 62, "2026-01-01T00:00:03Z") == decode_steps(within, True)
    held = engine.held["within"]
    assert sum(len(p) for p in held.pages()) == MAX_REQUEST_PAGES
    assert [(d.request_id, d.kind) for d in engine.disagreements] == [("past", "beyond_replay_bound")]
    assert engine.held["past"].allocs == 0 and engine.held["past"].prompt is not None


def test_an_allocation_past_the_pages_a_pool_may_hand_out_is_refused_and_leaves_the_pool_as_it_was() -> None:
    """The pool's bound on distinct pages handed out: the last page within it is handed out, a
    call that would take one more raises BeyondBound with the lists unchanged, and pages
    released and merged are handed out again (a pool of 2^40 pages takes never-used pages first,
    so only a merge brings freed ones back)."""
    from replay.pool import BeyondBound

    pool = PagePool(LARGEST, bound=10)
    held = pool.alloc(8)
    before = (pool.available, pool.fresh, pool.free_list(20).tolist())
    for call in (lambda: pool.alloc(3), lambda: pool.alloc_decode(3, 3), lambda: pool.alloc_extend([3], 3 * 64, 64)):
        try:
            call()
        except BeyondBound as e:
            assert "page 11" in str(e)
        else:
            raise AssertionError("an allocation past the bound was handed out")
        assert (pool.available, pool.fresh, pool.free_list(20).tolist()) == before
    last = pool.alloc_decode(2, 1)
    assert last is not None and last.tolist() == [9, 10]
    pool.release(held)
    pool.merge_and_sort_free()
    again = pool.alloc_extend([3], 3 * 64, 64)
    assert again is not None and again[0].tolist() == [1, 2, 3]


def test_a_decode_step_past_the_node_bound_is_listed_once_and_the_replay_goes_on() -> None:
    """Requests decoding past the bound on the pages a node's pool hands out: the step that would pass it is
    listed once (a beyond_replay_bound disagreement) and the node goes on, not counted as starved."""
    engine, _ = _decode_engine(1, [(f"r{i}", 4, 20) for i in range(3)])
    engine.pool.bound = 30  # (4 + 20 slots each: the third request's steps pass page 30)
    for i in range(3):
        engine.handle(_event(f"r{i}", "admitted"))
        engine.handle({**_event(f"r{i}", "completed", 1), "kind": "transfer", "tokens": 4})
        engine.handle(_event(f"r{i}", "decode_started", 2))
    engine.advance(1 << 62, "2026-01-01T00:00:03Z")
    assert [d.kind for d in engine.disagreements] == ["beyond_replay_bound"]
    assert engine.starved_steps == 0 and engine.pool.fresh - 1 <= 30


def test_the_whole_job_on_counts_of_2_to_the_39_and_40_ends_in_bounded_time_and_memory(tmp_path: Path) -> None:
    """The incident in miniature, its pool and window 2^40, one prompt of 2^39 tokens and one
    output of 2^40 (each accepted by the ingest): investigate with the replays and the report
    ends (exit 7: the replay lists where it went past its bounds) within 100 MiB of the small
    pool's run; the pages were arrays of 2^37 ids (a MemoryError) and the steps ran for ever."""
    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for line in (EXAMPLE / "events.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "kv":
            continue
        if rec["kind"] == "config":
            rec.update(pool_pages=LARGEST, context_length=LARGEST)
        if rec.get("request_id") == "r" and "prompt_tokens" in rec:
            rec["prompt_tokens"] = 2**39
        if rec["kind"] == "request" and rec["event"] == "finished":
            base = {k: rec[k] for k in ("kind", "ts", "node", "request_id")}
            lines += [json.dumps({**base, "seq": rec["seq"] - 3, "event": "admitted"}),
                      json.dumps({**base, "seq": rec["seq"] - 2, "event": "decode_started"})]
            if rec["request_id"] == "v":
                rec["output_tokens"] = 2**40
        lines.append(json.dumps(rec))
    (logs / "events.jsonl").write_text("\n".join(lines) + "\n")
    printed = tmp_path / "out.json"
    rc, mib = _peak_mib(["investigate", str(logs), "--db", str(tmp_path / "case.duckdb"),
                         "--out", str(tmp_path / "report.html"), "--json"], printed)
    assert rc == 7, rc
    summary = json.loads(printed.read_text())
    (confirm,) = [r for r in summary["replays"] if r["mode"] == "confirm"]
    assert sorted((d["request_id"], d["kind"]) for d in confirm["disagreements"]["list"]) == [
        ("r", "beyond_replay_bound"), ("v", "beyond_replay_bound")]
    _, small = _peak_mib(["investigate", str(_example_with_pool(tmp_path / "small", 16)), "--db",
                          str(tmp_path / "small.duckdb"), "--out", str(tmp_path / "small.html"), "--json"],
                         tmp_path / "small.json")
    assert mib < small + 100, (mib, small)
