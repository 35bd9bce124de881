"""A prefill node's radix (prefix) cache as far as request-level logs tell it
(reference-engine.md, point 4; docs/schema-v1.1.md, "Prefill's cached tokens").

SGLang keeps a prompt's full pages in a radix tree after its forward pass, shared by later prompts
that begin with the same tokens, and frees them only when an allocation is short of free pages:
least-recently-used leaves first, a leaf still locked by a request in flight never. The logs do
not carry the tokens, so this tree has no keys: it knows each node's pages, the request that wrote
them, when it was last touched and how many requests in flight lock it. A prompt that took
``cached_tokens`` from the cache (as the logs say) matched that many tokens of one cached path;
which one the logs do not say when several are long enough, so the match takes the path touched
last (of the prompt's own tenant first) and counts the guess (:attr:`PrefixCache.guessed`).

What SGLang does, and this follows (mem_cache/radix_cache.py; 0.5.11 and 0.5.23):

- ``match_prefix`` touches every node on the matched path; a match ending inside a node splits it
  (the upper part keeps the lock count; the lower is touched with the path, the upper made after it
  and so touched later still);
- a request locks the path it matched while it is in flight (``inc_lock_ref``), and its own inserted
  node from its forward on (``cache_unfinished_req``) until its transfer ends
  (``cache_finished_req``), which touches the path again;
- ``evict`` pops leaves by last access, skips locked ones, frees each popped leaf's pages and
  pushes its parent once that has no child left, until the tokens asked are freed or no leaf is
  left.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from replay.pool import Pages


@dataclass(eq=False)
class Node:
    """A run of cached pages: the pages, the request whose prompt wrote them, its tenant."""

    pages: Pages
    owner: str
    tenant: str | None
    parent: Node | None
    depth: int  # pages from the root to this node's last
    children: int = 0
    lock: int = 0
    last: int = 0  # the tick it was last touched
    alive: bool = True


@dataclass
class PrefixCache:
    """The cached prompts of one prefill node's boot."""

    page_size: int
    #: pages cached and not locked: what an eviction may free (SGLang's ``evictable_size``)
    evictable: int = 0
    #: matches where the logs leave more than one cached path long enough to be the one matched
    guessed: int = 0
    _tick: int = 0
    _leaves: list[tuple[int, int, Node]] = field(default_factory=list)  # a heap: (last, order, leaf)
    _order: int = 0
    _nodes: list[Node] = field(default_factory=list)  # every node made (the dead pruned now and then)
    _dead: int = 0

    # -- touching and locking --------------------------------------------------------------------

    def touch(self, node: Node | None) -> None:
        """``node``'s path touched, from it up to the root, at one new tick (a match, an insert, a
        transfer's end: ``cache_finished_req`` inserts it again); None touches the root alone."""
        self._tick += 1
        while node is not None:
            node.last = self._tick
            if node.children == 0:
                self._push(node)
            node = node.parent

    def _push(self, leaf: Node) -> None:
        self._order += 1
        heapq.heappush(self._leaves, (leaf.last, self._order, leaf))
        if len(self._leaves) > 4 * len(self._nodes) + 64:  # (stale entries: rebuilt from the leaves now)
            leaves = [n for n in self._live() if n.children == 0 and not n.lock]
            self._leaves = [(n.last, self._order + i, n) for i, n in enumerate(leaves, 1)]
            self._order += len(leaves)
            heapq.heapify(self._leaves)

    def held(self) -> list[Pages]:
        """The pages every live node holds."""
        return [n.pages for n in self._live()]

    def lock(self, node: Node | None) -> None:
        """A request in flight holds ``node``'s path (``inc_lock_ref``)."""
        while node is not None:
            if node.lock == 0:
                self.evictable -= len(node.pages)
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node | None) -> None:
        """The request lets ``node``'s path go (``dec_lock_ref``)."""
        while node is not None:
            node.lock -= 1
            if node.lock == 0:
                self.evictable += len(node.pages)
                if node.children == 0:
                    self._push(node)
            node = node.parent

    # -- matching and inserting ------------------------------------------------------------------

    def match(self, cached_tokens: int, tenant: str | None) -> tuple[Node | None, Pages]:
        """The node a prompt's first ``cached_tokens`` tokens (whole pages, as the logs say it
        matched) end on, and their pages in order: on the cached path :meth:`guess` takes, split
        there if need be, touched, not locked. None and no pages where nothing was matched or
        nothing cached is long enough (the logs and this cache then disagree: the prompt computes
        every page)."""
        want = cached_tokens // self.page_size
        node = self.guess(cached_tokens, tenant)
        if node is None:
            self.touch(None)  # (SGLang's match touches the root)
            return None, np.empty(0, np.int64)
        node = self._end_at(node, want)
        return node, path_pages(node)

    def guess(self, cached_tokens: int, tenant: str | None) -> Node | None:
        """The cached node holding a prompt's ``cached_tokens``-th token (whole pages), as far as
        the logs tell: on the path touched last that is long enough (of the prompt's ``tenant``
        first), counted as a guess where paths through another node were long enough too. Nothing
        is touched. None where nothing is matched or nothing cached is that long."""
        want = cached_tokens // self.page_size
        if want <= 0:
            return None
        long_enough = [n for n in self._live() if n.children == 0 and n.depth >= want]
        if not long_enough:
            return None
        own = [n for n in long_enough if n.tenant == tenant] or long_enough
        node = _holding(max(own, key=_recency), want)
        if any(_holding(n, want) is not node for n in long_enough):
            self.guessed += 1
        return node

    def node_at(self, pages: Pages) -> Node | None:
        """The node a cached path beginning with ``pages`` ends on after them (split there if
        need be), touched; None where no cached path begins with them (or ``pages`` is empty). For
        evidence that names the pages a prompt shared (page records, SGLang's own runs)."""
        want = len(pages)
        if not want:
            return None
        for leaf in sorted((n for n in self._live() if n.children == 0 and n.depth >= want), key=_recency,
                           reverse=True):
            node = _holding(leaf, want)
            if np.array_equal(path_pages(node)[:want], pages):
                return self._end_at(node, want)
        return None

    def _end_at(self, node: Node, want: int) -> Node:
        """``node``, which holds the path's ``want``-th page, cut after it if it goes on, the path up
        to it touched as SGLang's match does (0.5.11 radix_cache.py, ``_match_prefix_helper``: it
        touches the node it splits, whose new upper part is made after, its time later still)."""
        if node.depth <= want:
            self.touch(node)
            return node
        lower = node
        node = self._split(lower, len(lower.pages) - (lower.depth - want))
        self.touch(node)
        lower.last = self._tick
        if lower.children == 0:
            self._push(lower)
        self._tick += 1
        node.last = self._tick
        return node

    def _live(self) -> list[Node]:
        """The live nodes."""
        self._prune()
        return [n for n in self._nodes if n.alive] if self._dead else self._nodes

    def _prune(self) -> None:
        """Let the dead nodes go once as many have died as live (a replay's memory follows the
        cache, not the requests it has seen)."""
        if self._dead * 2 > len(self._nodes):
            self._nodes = [n for n in self._nodes if n.alive]
            self._dead = 0

    def _split(self, node: Node, keep: int) -> Node:
        """``node`` cut after its first ``keep`` pages: the upper part, the new parent of the rest."""
        upper = Node(node.pages[:keep], node.owner, node.tenant, node.parent, node.depth - len(node.pages) + keep,
                     children=1, lock=node.lock, last=node.last)
        node.pages = node.pages[keep:]
        node.parent = upper
        self._nodes.append(upper)
        return upper

    def insert(self, parent: Node | None, pages: Pages, owner: str, tenant: str | None) -> Node | None:
        """A prompt's own full pages cached under the node its match ended on (``parent``), as a
        new leaf, touched; None where it has no page of its own to cache."""
        if not len(pages):
            return parent
        depth = (parent.depth if parent is not None else 0) + len(pages)
        node = Node(pages, owner, tenant, parent, depth)
        if parent is not None:
            parent.children += 1
        self._prune()
        self._nodes.append(node)
        self.evictable += len(pages)
        self.touch(node)
        return node

    # -- evicting --------------------------------------------------------------------------------

    def evict(self, tokens: int) -> list[Node]:
        """Free leaves, least recently used first, until ``tokens`` tokens are freed or no leaf
        can be: the nodes evicted, in order (their pages go back to the pool's release list)."""
        freed: list[Node] = []
        done = 0
        while done < tokens and self._leaves:
            last, _, leaf = heapq.heappop(self._leaves)
            if not leaf.alive or leaf.children or leaf.lock or leaf.last != last:
                continue  # (a stale entry: the leaf was touched, locked, grew a child or died since)
            leaf.alive = False
            self._dead += 1
            freed.append(leaf)
            done += len(leaf.pages) * self.page_size
            self.evictable -= len(leaf.pages)
            parent = leaf.parent
            if parent is not None:
                parent.children -= 1
                if parent.children == 0 and parent.lock == 0:
                    self._push(parent)
        return freed


def evict_tokens(asked: int, available: int, whole: bool) -> int:
    """The tokens the cache is asked to evict before an allocation that asks ``asked`` tokens
    (at page size > 1 a page more a request than its new tokens: ``alloc_paged_token_slots_extend``)
    with ``available`` free: none where they suffice, else the whole amount (``whole``: 0.5.11
    and 0.5.12, mem_cache/common.py ``evict_from_tree_cache``) or the shortfall (from 0.5.18: the
    same function, then mem_cache/allocator/base.py from 0.5.21)."""
    if available >= asked:
        return 0
    return asked if whole else asked - available


def _recency(node: Node) -> tuple[int, int]:
    return node.last, node.depth


def _holding(node: Node, want: int) -> Node:
    """The node on ``node``'s path from the root that holds the path's ``want``-th page."""
    while node.depth - len(node.pages) >= want:
        assert node.parent is not None
        node = node.parent
    return node


def path_pages(node: Node) -> Pages:
    """The pages from the root to ``node``'s last, in order."""
    parts: list[Pages] = []
    at: Node | None = node
    while at is not None:
        parts.append(at.pages)
        at = at.parent
    return np.concatenate(parts[::-1]) if len(parts) > 1 else parts[0]
