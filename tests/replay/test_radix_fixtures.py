"""Prefill's prefix cache (replay/radix.py) and page pool against SGLang's own radix cache, event by event.

The ``prefill-radix`` fixtures of tests/replay/allocator/ were recorded by
scripts/make_sglang_radix_fixtures.py: a disaggregated prefill node of the 0.5.11 wheel (its
``RadixCache`` cut out and run unchanged on CPU torch) and of the 0.5.21 and 0.5.23 wheels (their
default ``UnifiedRadixCache`` on the wheel's own Rust tree core), with the allocator, at page
sizes 1 and 64, three seeds each: batches of prompts scheduled (matched, locked, room evicted,
allocated), each forward's insert (duplicates freed, the row rewritten to the tree's pages, the
lock moved), each transfer's end (the partly filled last page freed, the lock let go), with the
free and staged lists after every event. Nothing here needs torch.

The driver below takes from a fixture what the node's own evidence would say (each request's
cached tokens, its batch, and, where SGLang found a prompt's own pages already in the tree at its
insert, which: duplicates, which request-level logs cannot show) and asks the model for the rest:
the pages matched, those evicted (least recently used first, the whole amount asked in 0.5.11
and the shortfall from 0.5.18), those allocated and those freed, which are held to SGLang's,
event by event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replay.engine import evicts_whole
from replay.pool import PagePool, pages_for
from replay.radix import Node, PrefixCache, evict_tokens, path_pages

FIXTURES = Path(__file__).parent / "allocator"
FILES = sorted(FIXTURES.glob("*/*-prefill-radix-*.json"))


def _pages(runs: list[list[int]] | None) -> list[int]:
    return [first + i for first, count in runs or [] for i in range(count)]


def test_each_release_and_page_size_has_its_runs() -> None:
    seen = {(f.parent.name, json.loads(f.read_text())["page_size"]) for f in FILES}
    assert seen == {(r, ps) for r in ("0.5.11", "0.5.21", "0.5.23") for ps in (1, 64)}


class _Node:
    """A prefill node's cache and pool, driven by a fixture's events."""

    def __init__(self, fixture: dict[str, Any]) -> None:
        self.ps: int = fixture["page_size"]
        self.whole = evicts_whole(fixture["release"])
        self.pool = PagePool(fixture["size"] // self.ps + 1)
        self.cache = PrefixCache(self.ps)
        self.tokens = {q["rid"]: q["tokens"] for q in fixture["requests"]}
        self.node: dict[str, Node | None] = {}
        self.row: dict[str, list[int]] = {}  # the pages of its prompt, prefix then its own
        self.scheduled: dict[str, list[int]] = {}  # the same as scheduled (before an insert rewrites it)
        self.own: dict[str, int] = {}  # where its own pages start in its row
        self.guesses = self.guessed_right = 0

    def schedule(self, e: dict[str, Any], where: str) -> None:
        for q in e["reqs"]:
            rid, prefix = q["rid"], _pages(q["prefix_pages"])
            assert q["cached"] == len(prefix) * self.ps, where
            guess = self.cache.guess(q["cached"], None)
            if guess is not None:
                self.guesses += 1
                self.guessed_right += path_pages(guess).tolist()[:len(prefix)] == prefix
            node = self.cache.node_at(np.array(prefix, np.int64))
            if node is None:
                self.cache.touch(None)
            assert (node is None) == (not prefix), where
            self.cache.lock(node)
            self.node[rid], self.row[rid], self.own[rid] = node, prefix, len(prefix)
        extend = [self.tokens[q["rid"]] - q["cached"] for q in e["reqs"]]
        assert sum(extend) == e["extend_tokens"], where
        asked = sum(extend) + (len(extend) * self.ps if self.ps > 1 else 0)
        evicted = self.cache.evict(evict_tokens(asked, self.pool.available * self.ps, self.whole))
        assert [p for n in evicted for p in n.pages.tolist()] == _pages(e["evicted"]), where
        for n in evicted:
            self.pool.release(n.pages)
        if self.ps > 1:
            got = self.pool.alloc_extend([pages_for(x, self.ps) for x in extend], sum(extend), self.ps)
            assert got is not None, where
        else:
            taken = self.pool.try_alloc(sum(extend))
            assert taken is not None, where
            got = np.split(taken, np.cumsum(extend)[:-1])
        for q, pages in zip(e["reqs"], got, strict=True):
            assert pages.tolist() == _pages(q["pages"]), (where, q["rid"])
            self.row[q["rid"]] += pages.tolist()
            self.scheduled[q["rid"]] = list(self.row[q["rid"]])

    def forward_done(self, e: dict[str, Any], where: str) -> None:
        rid = e["rid"]
        row, own = self.row[rid], self.own[rid]
        full = self.tokens[rid] // self.ps
        duplicates = _pages(e["freed"])  # (SGLang found these of its own pages in the tree already)
        assert duplicates == row[own:own + len(duplicates)], where
        if duplicates:
            self.pool.release(np.array(duplicates, np.int64))
            row[own:own + len(duplicates)] = _pages(e["row"])[own:own + len(duplicates)]
            parent = self.cache.node_at(np.array(row[:own + len(duplicates)], np.int64))
            assert parent is not None, where
            own += len(duplicates)
        else:
            parent = self.node[rid]
        node = self.cache.insert(parent, np.array(row[own:full], np.int64), rid, None)
        self.cache.lock(node)
        self.cache.unlock(self.node[rid])
        self.node[rid], self.own[rid] = node, own
        if "row" in e:
            assert row == _pages(e["row"]), where

    def transfer_done(self, e: dict[str, Any], where: str) -> None:
        rid = e["rid"]
        rest = self.row[rid][max(self.tokens[rid] // self.ps, self.own[rid]):]
        assert rest == _pages(e["freed"]), where
        self.pool.release(np.array(rest, np.int64))
        self.cache.touch(self.node[rid])
        self.cache.unlock(self.node[rid])


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_cache_and_pool_do_what_sglangs_radix_cache_did_event_by_event(path: Path) -> None:
    fixture = json.loads(path.read_text())
    node = _Node(fixture)
    for i, e in enumerate(fixture["events"]):
        where = f"{path.parent.name}/{path.stem} event {i} ({e['op']}, step {e['step']})"
        getattr(node, e["op"])(e, where)
        assert node.pool.free_list().tolist() == _pages(e["free"]), where
        assert node.pool.released_pages().tolist() == _pages(e["staged"]), where
        assert node.cache.evictable * node.ps == e["evictable"], where
    assert {rid: _pages(row) for rid, row in fixture["outcome"].items()} == node.scheduled
