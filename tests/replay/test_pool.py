"""The page pool against a plain-list model of SGLang's disaggregated allocator policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forensics.emit import page_string
from replay.pool import PagePool, PoolExhausted


def test_pages_come_ascending_from_one_and_freed_pages_wait_for_a_shortage() -> None:
    pool = PagePool(10)  # pages 1..9; 0 reserved
    a = pool.alloc(3)
    assert a.tolist() == [1, 2, 3]
    pool.release(a)
    assert pool.alloc(4).tolist() == [4, 5, 6, 7]  # released pages are not reused yet
    assert pool.alloc(3).tolist() == [1, 2, 3]  # shortage: release list merged in, all sorted
    assert pool.alloc(2).tolist() == [8, 9]
    assert pool.merges == 1
    with pytest.raises(PoolExhausted):
        pool.alloc(3)


def test_the_invariant_check_catches_a_page_held_twice() -> None:
    pool = PagePool(6)
    a = pool.alloc(2)
    pool.check([a])
    with pytest.raises(AssertionError, match="held twice"):
        pool.check([a, a[:1]])
    with pytest.raises(AssertionError):
        pool.check([])  # pages lost


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 6)), max_size=60))
def test_pool_equals_a_list_model(steps: list[tuple[bool, int]]) -> None:
    size = 16
    pool = PagePool(size)
    free, released = list(range(1, size)), []  # the model
    held: list[np.ndarray] = []
    for allocate, n in steps:
        if allocate:
            if n > len(free) + len(released):
                with pytest.raises(PoolExhausted):
                    pool.alloc(n)
                continue
            if len(free) < n:
                free, released = sorted(free + released), []
            want, free = free[:n], free[n:]
            got = pool.alloc(n)
            assert got.tolist() == want
            held.append(got)
        elif held:
            pages = held.pop(n % len(held))
            pool.release(pages)
            released.extend(pages.tolist())
        pool.check(held)


def test_page_strings_are_canonical_ranges() -> None:
    assert page_string(np.array([5, 1, 2, 3, 9, 10], dtype=np.int64)) == "1-3,5,9-10"
    assert page_string(np.array([7], dtype=np.int64)) == "7"


@given(st.lists(st.integers(0, 300), min_size=1, max_size=200), st.booleans())
def test_an_arrays_page_string_is_its_sets_whatever_its_length_and_order(ids: list[int], ordered: bool) -> None:
    """Short arrays are run through in Python, long ones vectorised: both give the ranges of the
    set of ids, as a plain list's ranges are worked out (any order, repeats)."""
    if ordered:
        ids = sorted(set(ids))
    want = sorted(set(ids))
    runs = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in _ranges(want))
    assert page_string(np.array(ids, dtype=np.int64)) == page_string(ids) == runs


def _ranges(ids: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in ids:
        if out and p == out[-1][1] + 1:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


def test_node_names_that_look_alike_as_file_names_keep_their_own_files(tmp_path: Path) -> None:
    from replay.logset import LogSet

    log = LogSet()
    for node in ("decode/0", "decode:0", "decode_0"):
        log.emit({"kind": "request", "ts": "2026-09-14T08:00:00.000000Z", "node": node, "request_id": "r",
                  "event": "admitted"})
    files = log.write(tmp_path)
    assert len(files) == 3 and len({f.name for f in files}) == 3
    assert sorted(f.read_text().count('"node"') for f in files) == [1, 1, 1]


def test_a_prefill_pool_too_small_for_overlapping_prompts_fails_the_request_not_the_replay() -> None:
    from replay.engine import NodeConfig, NodeEngine, Request, plan
    from replay.logset import LogSet

    config = NodeConfig("prefill-0", "prefill", context_length=4096, page_size=16, pool_pages=9)  # 8 pages
    requests = {r: Request(r, "t", 100, 1, "prefill-0", "decode-0") for r in ("a", "b")}  # 7 pages each
    plans = {r: plan(q, "sglang-placeholder", config) for r, q in requests.items()}
    log = LogSet()
    engine = NodeEngine(config, "sglang-placeholder", log, requests, plans, check_invariants=True)
    ts = "2026-09-14T08:00:00.000000Z"
    start = {"kind": "request", "ts": ts, "node": "prefill-0", "event": "prefill_started"}
    assert engine.handle(dict(start, request_id="a"))
    assert not engine.handle(dict(start, request_id="b"))  # a still holds 7 of the 8 pages
    lines = log.lines["prefill-0"]
    assert '"request_id":"b","event":"finished","status":503' in lines[-1]
    assert not any('"request_id":"b","op":"alloc"' in x for x in lines)


def test_a_prompt_of_exactly_max_req_input_len_is_over_long() -> None:
    """SGLang's validate_input_length rejects ``prompt >= max_req_input_len`` (note ``>=``)."""
    from replay.engine import NodeConfig, Request, plan

    prefill = NodeConfig("p", "prefill", context_length=1_048_576, page_size=64, pool_pages=681_280 // 64 + 1)
    limit = prefill.max_req_input_len
    assert limit == 681_274  # the incident's pool: min(1,048,575, 681,279) - 5

    def over_long(tokens: int) -> bool:
        return plan(Request("r", "t", tokens, 8, "p", "d"), "sglang-placeholder", prefill).over_long

    assert (over_long(limit - 1), over_long(limit), over_long(1_048_575)) == (False, True, True)
    assert not over_long(1_048_576)  # the tokenizer's rejection (router), not prefill's
