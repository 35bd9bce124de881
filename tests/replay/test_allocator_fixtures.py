"""The pool and the decode loop against SGLang's own allocator code, call by call.

The fixtures in tests/replay/allocator/ were recorded by scripts/make_sglang_allocator_fixtures.py,
which cuts the allocator classes and their pure-torch kernels out of the 0.5.11, 0.5.21 and 0.5.23
wheels and runs them on CPU torch (see that folder's README): every call, its arguments, the
indices it returned and the free and release lists after it, at page sizes 1 (the token
allocator) and 64 (the paged one), the ``flush`` runs with the allocator's ``clear`` among them
(what ``flush_cache`` does to an idle node's pool). 0.5.11 and 0.5.21 have no pure-torch ``alloc_decode_naive``
(only the Triton kernel, whose source is the same in all three wheels): they ran 0.5.23's. The
three releases did the same thing call for call. Nothing here needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replay.decode_loop import Arrival, DecodeLoop
from replay.pool import PagePool, pages_for

FIXTURES = Path(__file__).parent / "allocator"
FILES = sorted(f for f in FIXTURES.glob("*/*.json") if "-prefill-radix-" not in f.name)  # (their own test:
# tests/replay/test_radix_fixtures.py)
RELEASES = ("0.5.11", "0.5.21", "0.5.23")


def expand(runs: list[list[int]] | None) -> list[int]:
    """A list of [first, count] runs as the list it stands for."""
    return [first + i for first, count in runs or [] for i in range(count)]


def load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_every_release_and_page_size_has_fixtures() -> None:
    seen = {(f.parent.name, load(f)["page_size"], load(f)["scenario"]) for f in FILES}
    for release in RELEASES:
        for page_size in (1, 64):
            for scenario in ("calls", "decode-overlap", "decode-no-overlap", "prefill", "flush"):
                assert (release, page_size, scenario) in seen


class Replayer:
    """Feeds a fixture's calls to a :class:`PagePool` and computes what SGLang returned."""

    def __init__(self, fixture: dict[str, Any]) -> None:
        self.ps: int = fixture["page_size"]
        self.pool = PagePool(fixture["size"] // self.ps + 1)
        self.group: list[int] | None = None

    def alloc(self, call: dict[str, Any]) -> list[int] | None:
        pages = self.pool.try_alloc(call["need_size"] // self.ps)
        if pages is None:
            return None
        return [int(p) * self.ps + o for p in pages for o in range(self.ps)]

    def alloc_extend(self, call: dict[str, Any]) -> list[int] | None:
        ps = self.ps
        prefix, seq, last = call["prefix_lens"], call["seq_lens"], call["last_loc"]
        new = [pages_for(s, ps) - pages_for(p, ps) for p, s in zip(prefix, seq, strict=True)]
        got = self.pool.alloc_extend(new, call["extend_num_tokens"], ps)
        if got is None:
            return None
        out: list[int] = []
        for p, s, loc, pages in zip(prefix, seq, last, got, strict=True):
            ceil_prefix = pages_for(p, ps) * ps
            for j in range(p, s):
                if j < ceil_prefix:
                    out.append(loc + 1 + (j - p))
                else:
                    out.append(int(pages[(j - ceil_prefix) // ps]) * ps + j % ps)
        return out

    def alloc_decode(self, call: dict[str, Any]) -> list[int] | None:
        ps = self.ps
        starts = [(s - 1) % ps == 0 for s in call["seq_lens"]]
        got = self.pool.alloc_decode(sum(starts), len(starts))
        if got is None:
            return None
        new = iter(got.tolist())
        return [next(new) * ps if start else loc + 1 for start, loc in zip(starts, call["last_loc"], strict=True)]

    def free(self, call: dict[str, Any]) -> None:
        indices = expand(call["indices"])
        if self.group is not None:
            self.group.extend(indices)
        else:
            self._release(indices)

    def _release(self, indices: list[int]) -> None:
        arr = np.asarray(indices, dtype=np.int64)
        self.pool.release(np.unique(arr // self.ps) if self.ps > 1 else arr)

    def call(self, call: dict[str, Any]) -> list[int] | None:
        op = call["op"]
        if op == "free_group_begin":
            self.group = []
        elif op == "free_group_end":
            group, self.group = self.group, None
            if group:
                self._release(group)
        elif op == "free":
            self.free(call)
        elif op == "clear":  # (flush_cache on an idle node: the engine's NodeEngine.flush takes a fresh pool so)
            self.pool = PagePool(self.pool.pool_pages)
            self.group = None
        else:
            out: list[int] | None = getattr(self, op)(call)
            return out
        return None


@pytest.mark.parametrize("path", FILES, ids=fixture_id)
def test_the_pool_takes_the_pages_sglang_took_call_by_call(path: Path) -> None:
    fixture = load(path)
    r = Replayer(fixture)
    for i, call in enumerate(fixture["calls"]):
        out = r.call(call)
        where = f"{fixture_id(path)} call {i} ({call['op']})"
        if call["op"] in ("alloc", "alloc_extend", "alloc_decode"):
            want = None if call["out"] is None else expand(call["out"])
            assert out == want, where
        assert r.pool.free_list().tolist() == expand(call["free"]), where
        assert r.pool.released_pages().tolist() == expand(call["staged"]), where


DECODE = [f for f in FILES if load(f)["scenario"].startswith("decode")]


@pytest.mark.parametrize("path", DECODE, ids=fixture_id)
def test_the_decode_loop_gives_every_request_the_slots_sglang_gave(path: Path) -> None:
    fixture = load(path)
    ps = fixture["page_size"]
    loop = DecodeLoop(fixture["size"] // ps + 1, ps, overlap=fixture["scenario"] == "decode-overlap")
    rows = loop.run(Arrival(q["rid"], q["prompt"], q["output"], q["arrive_iter"], q["transfer_iters"])
                    for q in fixture["requests"])
    outcome = fixture["outcome"]
    assert loop.aborted == outcome.get("aborted", [])
    for rid, want in outcome.items():
        if rid == "aborted":
            continue
        row = rows[rid]
        assert (row.prealloc_iter, row.join_iter, row.free_iter) == (
            want["prealloc_iter"], want["join_iter"], want["free_iter"]), rid
        assert row.slots(ps).tolist() == expand(want["slots"]), rid
