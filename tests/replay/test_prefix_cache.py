"""Prefill's prefix (radix) cache in the engine (replay/radix.py; reference-engine.md point 4):
with ``prefix_cache`` on, a prompt's full pages stay cached after its transfer, a later prompt the
logs say took ``cached_tokens`` from the cache shares them, and an allocation short of free pages
evicts least-recently-used prompts first, never one a request in flight holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from forensics.exposure.reference import expand
from kvforensics.job import run
from replay.configs import assumptions, eviction_undecided
from replay.engine import NodeConfig, NodeEngine, Request, evicts_whole, plan
from replay.logset import LogSet
from replay.radix import PrefixCache
from replay.replay import replay
from replay.simulate import Deployment, simulate_to

PS = 64


def _engine(pool_pages: int, version: str = "0.5.23", cache: bool | None = True,
            prompts: dict[str, int] | None = None) -> tuple[NodeEngine, LogSet]:
    config = NodeConfig("prefill-0", "prefill", 1 << 20, PS, pool_pages, engine_version=version, prefix_cache=cache)
    requests = {rid: Request(rid, f"tenant-{rid[0]}", n, 8, "prefill-0", "decode-0")
                for rid, n in (prompts or {}).items()}
    log = LogSet()
    engine = NodeEngine(config, "sglang-placeholder", log, requests,
                        {rid: plan(r, "sglang-placeholder", config) for rid, r in requests.items()},
                        check_invariants=True)
    return engine, log


def _kv(log: LogSet) -> list[tuple[str, str, str]]:
    """(request, op, pages) of every kv record written."""
    out = []
    for line in log.lines["prefill-0"]:
        r = json.loads(line)
        if r["kind"] == "kv":
            out.append((r["request_id"], r["op"], r["pages"]))
    return out


def _serve(engine: NodeEngine, rid: str, cached: int | None = None, end: bool = True) -> None:
    """A prompt's prefill on the node: started (with what the cache gave it), done, and its
    transfer's end unless ``end`` is false."""
    ts = "2026-09-14T08:00:00.000000Z"
    start: dict[str, Any] = {"kind": "request", "ts": ts, "request_id": rid, "event": "prefill_started"}
    if cached is not None:
        start["cached_tokens"] = cached
    assert engine.handle(start)
    assert engine.handle({"kind": "request", "ts": ts, "request_id": rid, "event": "prefill_done"})
    if end:
        _end(engine, rid)


def _end(engine: NodeEngine, rid: str) -> None:
    engine.handle({"kind": "transfer", "ts": "2026-09-14T08:00:01.000000Z", "request_id": rid,
                   "transfer_id": f"x-{rid}", "event": "completed", "src_node": "prefill-0", "dst_node": "decode-0"})


def test_a_prompts_full_pages_stay_cached_and_its_partial_last_page_is_freed() -> None:
    engine, log = _engine(32, prompts={"a1": 200})  # 3 full pages and 8 tokens
    _serve(engine, "a1")
    assert _kv(log) == [("a1", "alloc", "1-4"), ("a1", "write", "1-4"), ("a1", "free", "4")]
    assert engine.pool.available == 31 - 3
    assert engine.cache is not None and engine.cache.evictable == 3
    # said off: every page freed at the transfer's end; not said (a v1 log): SGLang's default, cached
    engine, log = _engine(32, cache=False, prompts={"a1": 200})
    _serve(engine, "a1")
    assert _kv(log)[-1] == ("a1", "free", "1-4") and engine.pool.available == 31 and engine.cache is None
    engine, log = _engine(32, cache=None, prompts={"a1": 200})
    _serve(engine, "a1")
    assert _kv(log)[-1] == ("a1", "free", "4") and engine.pool.available == 28


def test_a_prefix_hit_shares_the_cached_pages_and_allocates_only_the_rest() -> None:
    engine, log = _engine(32, prompts={"a1": 256, "a2": 300})
    _serve(engine, "a1")  # 4 full pages, cached whole
    _serve(engine, "a2", cached=192)
    assert _kv(log)[2:] == [("a2", "alloc", "5-6"), ("a2", "share", "1-3"), ("a2", "write", "5-6"),
                            ("a2", "free", "1-3"), ("a2", "free", "6")]
    assert engine.cache is not None and engine.cache.evictable == 4 + 1  # a1's 4, a2's own full page
    assert engine.cache.guessed == 0


def test_eviction_frees_least_recently_used_prompts_first_and_never_one_in_flight() -> None:
    # 9 usable pages: three prompts of 2 full pages cached, one of them in flight
    engine, log = _engine(10, prompts={"a1": 128, "b1": 128, "c1": 128, "d1": 256})
    _serve(engine, "a1")
    _serve(engine, "b1", end=False)  # in flight: its pages locked
    _serve(engine, "c1")
    assert engine.pool.available == 3
    _serve(engine, "d1")  # 4 pages: asks 4 + 1 more than the 3 free -> evicts 2 pages' worth
    # a1, touched before c1, goes; b1 is locked; a1's pages are merged in and taken first
    assert [(r, p) for r, op, p in _kv(log) if op == "free"] == [("a1", "1-2")]
    assert ("d1", "alloc", "1-2,7-8") in _kv(log)


@pytest.mark.parametrize(("version", "evicted"), [("0.5.11", ["a1", "b1"]), ("0.5.12", ["a1", "b1"]),
                                                  ("0.5.18", ["a1"]), ("0.5.23", ["a1"])])
def test_releases_evict_the_whole_amount_asked_or_only_the_shortfall(version: str, evicted: list[str]) -> None:
    """0.5.11 and 0.5.12 evict as many tokens as the allocation asks for; from 0.5.18 only what
    the free pages lack (docs/schema-v1.1.md)."""
    engine, log = _engine(8, version, prompts={"a1": 128, "b1": 128, "c1": 128, "d1": 128})
    for rid in ("a1", "b1", "c1"):
        _serve(engine, rid)
    assert engine.pool.available == 1
    _serve(engine, "d1")  # two pages: asks 128 + 64 tokens, 64 free
    assert [r for r, op, _ in _kv(log) if op == "free" and r != "d1"] == evicted


def test_a_hit_the_cache_cannot_show_is_listed_and_computed_whole() -> None:
    engine, log = _engine(32, prompts={"a1": 256})
    _serve(engine, "a1", cached=128)
    assert [d.kind for d in engine.disagreements] == ["prefix_not_cached"]
    assert _kv(log)[0] == ("a1", "alloc", "1-4")


def test_a_match_that_ends_inside_a_cached_prompt_splits_it_and_both_parts_are_evicted_in_turn() -> None:
    cache = PrefixCache(PS)
    a = cache.insert(None, np.arange(1, 5, dtype=np.int64), "a1", "t")
    assert a is not None
    node, pages = cache.match(128, "t")
    assert node is not None and pages.tolist() == [1, 2] and node.children == 1 and a.parent is node
    assert cache.evictable == 4
    cache.lock(node)
    assert cache.evictable == 2
    assert [n.pages.tolist() for n in cache.evict(10 * PS)] == [[3, 4]]  # the upper part is locked
    cache.unlock(node)
    assert [n.pages.tolist() for n in cache.evict(10 * PS)] == [[1, 2]]
    assert cache.evictable == 0


def test_of_several_cached_prompts_long_enough_the_match_takes_the_last_touched_and_counts_the_guess() -> None:
    cache = PrefixCache(PS)
    cache.insert(None, np.arange(1, 4, dtype=np.int64), "a1", "t")
    cache.insert(None, np.arange(4, 7, dtype=np.int64), "b1", "u")
    node, pages = cache.match(128, "v")
    assert pages.tolist() == [4, 5] and cache.guessed == 1
    node, pages = cache.match(128, "t")  # its own tenant's first
    assert pages.tolist() == [1, 2] and cache.guessed == 2


@pytest.fixture(scope="module")
def cached_incident(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """The same simulated incident with prefill's prefix cache on and off (a prefill pool of 20,000
    tokens, so that cached prompts must be evicted), each investigated."""
    out = {}
    for cache in (True, False):
        folder = tmp_path_factory.mktemp(f"cache-{cache}")
        simulate_to(folder / "logs", deployment=Deployment(prefix_cache=cache, prefill_pool_tokens=20_000),
                    requests=600, seed=3)
        run([folder / "logs"], folder / "case.duckdb", None)
        out[cache] = folder / "case.duckdb"
    return out


def test_the_simulator_caches_and_evicts_and_the_replay_reproduces_its_prefill_pages(
        cached_incident: dict[bool, Path], tmp_path: Path) -> None:
    con = duckdb.connect(str(cached_incident[True]), read_only=True)
    try:
        (allocs, frees), = con.execute("SELECT count(*) FILTER (op = 'alloc'), count(*) FILTER (op = 'free') "
                                       "FROM kv_records WHERE node LIKE 'prefill%'").fetchall()
    finally:
        con.close()
    # a prompt allocates once and frees at most its partly filled last page itself: the rest are evictions
    assert frees > allocs > 0
    done = replay(cached_incident[True], "sglang-placeholder", tmp_path / "replayed")
    assert done.mode == "confirm" and done.disagreements == ()
    assert done.agreement is not None
    assert done.agreement.reproduced_allocations == done.agreement.logged_allocations
    assert done.exposure["exposed_responses"] > 0


def test_decodes_victims_do_not_depend_on_prefills_cache(cached_incident: dict[bool, Path]) -> None:
    def exposures(db: Path) -> list[tuple[Any, ...]]:
        con = duckdb.connect(str(db), read_only=True)
        try:
            return con.execute("SELECT reader_request, victim_request, node, pages FROM exposures "
                               "ORDER BY ALL").fetchall()
        finally:
            con.close()

    on, off = exposures(cached_incident[True]), exposures(cached_incident[False])
    assert on and on == off


@pytest.mark.parametrize("release", ["0.5.11", "0.5.23"])
def test_a_hit_sglang_printed_shares_a_cached_prompts_pages_and_the_guess_is_said(release: str,
                                                                                  tmp_path: Path) -> None:
    """The adapter fixtures' run as 0.5.11 (the hit in the finish's ``meta_info.cached_tokens``)
    and 0.5.23 (in the time stats' ``cached_input_len``) printed it: req-a3 took 640 tokens from
    the cache (req-a1's first ten pages, which the logs do not say), so its replayed prefill shares
    the first ten pages of a prompt cached before it and computes only the rest. Four cached
    prompts are long enough: the replay's `assumed` says it guessed, and nothing disagrees on prefill
    (on decode, the request the run retracted is listed: decode_retracted)."""
    folder = Path(__file__).resolve().parents[1] / "adapters" / "releases" / release / "text"
    done = run([folder], tmp_path / "case.duckdb", None)
    (confirm,) = [r for r in done.replays if r.mode == "confirm"]
    # (req-a2, retracted on decode: its finish's count and the scheduler's line)
    assert [(d.node, d.kind) for d in confirm.disagreements] == [("decode-0.dp1", "decode_retracted")] * 2
    assert any("1 prefix-cache hit(s) on prefill (prefill-0)" in a for a in confirm.assumed)
    con = duckdb.connect(str(confirm.out / "replay.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT request_id, op, pages FROM kv_records WHERE node = 'prefill-0' AND op IN "
                           "('alloc', 'share') ORDER BY seq").fetchall()
    finally:
        con.close()
    (shared,) = [pages for rid, op, pages in rows if (rid, op) == ("req-a3", "share")]
    (own,) = [pages for rid, op, pages in rows if (rid, op) == ("req-a3", "alloc")]
    shared_pages = expand(shared)
    assert len(shared_pages) == 10 and len(expand(own)) == 5  # ten pages shared; its other 260 tokens in five
    earlier = [expand(pages) for rid, op, pages in rows[:[r[0] for r in rows].index("req-a3")] if op == "alloc"]
    assert any(pages[:10] == shared_pages for pages in earlier)


def test_the_cache_keeps_what_it_holds_not_every_prompt_it_has_seen() -> None:
    """10,000 prompts cached and evicted one after the other, and one prompt touched 10,000
    times: the cache's nodes follow what it still holds and its queue of leaves stays within a few
    times that (stale entries let go), so a long replay's memory stays flat."""
    cache = PrefixCache(PS)
    for i in range(10_000):
        cache.insert(None, np.array([1 + i % 5, 100 + i % 5], np.int64), f"a{i}", "t")
        if i % 5 == 4:  # (five prompts of two pages cached, then evicted)
            assert [n.owner for n in cache.evict(10 * PS)] == [f"a{j}" for j in range(i - 4, i + 1)]
            assert len(cache._nodes) <= 2 * 5 + 1
    leaves = [cache.insert(None, np.array([9 + i], np.int64), f"b{i}", "t") for i in range(2)]
    for _ in range(10_000):
        cache.touch(leaves[0])
    assert len(cache._leaves) <= 4 * len(cache._nodes) + 64
    assert [n.owner for n in cache.evict(100 * PS)] == ["b1", "b0"]


def test_how_much_the_cache_evicts_is_read_from_the_release_and_a_range_across_the_change_is_said() -> None:
    """The whole amount asked to 0.5.16, the shortfall from 0.5.17 (read in each wheel's
    ``evict_from_tree_cache``). A range of releases is read by its last; one across the change is
    undecided by the logs, and the replay's ``assumed`` says so for a caching prefill node."""
    assert evicts_whole("0.5.11") and evicts_whole("0.5.16") and evicts_whole("0.5.12-0.5.15")
    assert not evicts_whole("0.5.17") and not evicts_whole("0.5.21") and not evicts_whole("0.5.16-0.5.18")
    assert eviction_undecided("sglang", "0.5.16-0.5.18") and eviction_undecided("sglang", "0.5.5-0.5.7,0.5.12-0.5.23")
    assert not eviction_undecided("sglang", "0.5.17-0.5.23") and not eviction_undecided("sglang", "0.5.12-0.5.16")
    assert not eviction_undecided("sglang", "0.5.17") and not eviction_undecided("other", "0.5.16-0.5.18")

    def configs(version: str, prefix_cache: bool) -> dict[str, list[tuple[int, int, str, NodeConfig]]]:
        said = ("overlap_schedule", "prefix_cache")
        return {
            "prefill-0": [(0, 0, "t", NodeConfig("prefill-0", "prefill", 4096, 64, 100, engine_version=version,
                                                 prefix_cache=prefix_cache, said=said))],
            "decode-0": [(0, 0, "t", NodeConfig("decode-0", "decode", 4096, 64, 100, engine_version=version,
                                                said=said))],
        }

    assert assumptions(configs("0.5.17-0.5.23", True)) == ()
    assert assumptions(configs("0.5.16-0.5.18", False)) == ()  # (no cache, nothing evicted)
    said = assumptions(configs("0.5.16-0.5.18", True))
    assert len(said) == 1 and said[0].endswith("before 0.5.17, the whole amount an allocation asks; "
                                               "from it, what it lacks): prefill-0")
