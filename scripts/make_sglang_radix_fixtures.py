"""Fixtures recorded from SGLang's own radix (prefix) cache and allocator, driven as a disaggregated prefill node.

    /tmp/alloc-venv/bin/pip install numpy packaging psutil tqdm orjson msgspec pybase64 requests pillow dill \
        pydantic pyzmq aiohttp starlette triton        # what a 0.5.2x sglang imports at module level
    /tmp/alloc-venv/bin/python scripts/make_sglang_radix_fixtures.py WHEEL... [--out tests/replay/allocator]

Companion of ``make_sglang_allocator_fixtures.py``, whose wheel reading, allocator loading and JSON layout it reuses.
The node (``PrefillNode``) runs SGLang's overlap prefill loop over a scripted prompt stream and records, after every
step, what the tree and the allocator did. What runs is the release's own code, taken two ways:

- 0.5.1x, whose prefill default is ``radix_cache.RadixCache``: the tree (``RadixKey``, ``TreeNode``, ``RadixCache``),
  the prefix-cache base and its parameter records, the eviction strategies, the helpers of ``mem_cache/common.py``
  a prefill node calls (``alloc_token_slots``, ``alloc_paged_token_slots_extend``, ``evict_from_tree_cache``,
  ``maybe_cache_unfinished_req``, ``release_kv_cache``) and the ``Req`` methods they need are cut from the wheel by
  name and executed unchanged next to the release's allocator; ``time.monotonic`` is a counter, one tick per call.
- 0.5.2x, whose prefill default is ``UnifiedRadixCache`` on a compiled Rust TreeCore (``mem_cache/registry.py``,
  ``default_radix_cache_factory``): too large to cut, so the wheel's ``sglang`` package is unpacked and imported
  whole, in a worker process per release; third-party packages it imports and the venv lacks become inert
  stand-ins whose every call is logged, and the recording asserts that none was called. The tree is built through
  ``default_radix_cache_factory``, and each file is cross-checked against the Python TreeCore.

Every non-SGLang name the code sees is listed in the fixture's ``stand_ins``. Output:
``<out>/<release>/ps<page_size>-prefill-radix-s<seed>.json`` and a section of ``<out>/README.md`` between markers
(the rest of the README is left alone); the same wheels give byte-identical output.
"""

from __future__ import annotations
import __future__

import abc
import argparse
import array
import ast
import collections
import dataclasses
import functools
import hashlib
import heapq
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import logging
import random
import subprocess
import sys
import tempfile
import textwrap
import types
import typing
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from make_sglang_allocator_fixtures import (
    KERNELS,
    Json,
    KernelLaunch,
    Recorder,
    Wheel,
    borrow_decode_twin,
    dump_fixture,
    load_allocators,
    never_launched,
    read_wheel,
    runs,
)

SCENARIO = "prefill-radix"
SEEDS = (1, 2, 3)
# Pool sizes: small, so that eviction fires often. Constructor size in tokens = pages * page_size.
POOL_PAGES = {1: 640, 64: 40}
REQ_SLOTS = 64

# (wheel file, def name) pairs cut from a 0.5.1x wheel, in execution order. ``Req.x`` names a method of Req.
CUTS_0511: tuple[tuple[str, str], ...] = (
    ("sglang/srt/utils/common.py", "ceil_div"),
    ("sglang/srt/utils/common.py", "ceil_align"),
    ("sglang/srt/mem_cache/cache_init_params.py", "CacheInitParams"),
    ("sglang/srt/mem_cache/evict_policy.py", "EvictionStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "LRUStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "LFUStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "FIFOStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "MRUStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "FILOStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "PriorityStrategy"),
    ("sglang/srt/mem_cache/evict_policy.py", "SLRUStrategy"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "PrefixCacheTrait"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "MatchPrefixParams"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "InsertParams"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "InsertResult"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "EvictParams"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "EvictResult"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "IncLockRefResult"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "DecLockRefParams"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "DecLockRefResult"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "MatchResult"),
    ("sglang/srt/mem_cache/base_prefix_cache.py", "BasePrefixCache"),
    ("sglang/srt/mem_cache/radix_cache.py", "RadixKey"),
    ("sglang/srt/mem_cache/radix_cache.py", "TreeNode"),
    ("sglang/srt/mem_cache/radix_cache.py", "compute_node_hash_values"),
    ("sglang/srt/mem_cache/radix_cache.py", "split_node_hash_value"),
    ("sglang/srt/mem_cache/radix_cache.py", "RadixCache"),
    ("sglang/srt/mem_cache/common.py", "maybe_cache_unfinished_req"),
    ("sglang/srt/mem_cache/common.py", "alloc_token_slots"),
    ("sglang/srt/mem_cache/common.py", "evict_from_tree_cache"),
    ("sglang/srt/mem_cache/common.py", "alloc_paged_token_slots_extend"),
    ("sglang/srt/mem_cache/common.py", "release_kv_cache"),
    ("sglang/srt/managers/schedule_batch.py", "Req.init_next_round_input"),
    ("sglang/srt/managers/schedule_batch.py", "Req.set_extend_input_len"),
    ("sglang/srt/managers/schedule_batch.py", "Req._cache_commit_len"),
    ("sglang/srt/managers/schedule_batch.py", "Req.pop_committed_kv_cache"),
    ("sglang/srt/managers/schedule_batch.py", "Req.pop_overallocated_kv_cache"),
)
REQ_METHODS = tuple(name.split(".", 1)[1] for _, name in CUTS_0511 if name.startswith("Req."))


# ---------------------------------------------------------------------------------------------------------------
# Cutting the radix cache out of a wheel


@dataclass(frozen=True)
class Cut:
    """One def (or method) taken from a wheel, decorators included, with the line where it starts."""

    name: str
    path: str
    line: int
    source: str
    future_annotations: bool


def find_def(text: str, name: str) -> tuple[int, str]:
    """(first line, source with decorators) of a top-level def, or of ``Class.method`` dedented."""
    lines = text.splitlines(keepends=True)
    owner, _, member = name.rpartition(".")
    body = ast.parse(text).body
    if owner:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == owner)
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name == member:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            assert node.end_lineno is not None
            return start, textwrap.dedent("".join(lines[start - 1:node.end_lineno]))
    raise KeyError(name)


@dataclass
class RadixWheel:
    """A release wheel with the radix-cache defs cut from it, next to its allocator (``Wheel``)."""

    alloc: Wheel
    cuts: dict[str, Cut] = field(default_factory=dict)


def default_is_unified(path: Path) -> bool:
    """Whether the wheel picks its tree in ``mem_cache/registry.py``, whose default is ``UnifiedRadixCache`` (0.5.2x);
    up to 0.5.1x the scheduler builds ``RadixCache`` itself."""
    with zipfile.ZipFile(path) as wheel:
        return "sglang/srt/mem_cache/registry.py" in wheel.namelist()


def read_radix_defs(path: Path, alloc: Wheel) -> RadixWheel:
    """Cut the radix-cache defs of ``CUTS_0511`` out of a 0.5.1x wheel."""
    assert not default_is_unified(path), f"{path.name}: the prefill default is not RadixCache"
    with zipfile.ZipFile(path) as wheel:
        out = RadixWheel(alloc)
        texts: dict[str, str] = {}
        for member, name in CUTS_0511:
            if member not in texts:
                texts[member] = wheel.read(member).decode("utf-8")
            text = texts[member]
            line, source = find_def(text, name)
            out.cuts[name] = Cut(name, member, line, source, "from __future__ import annotations" in text)
    return out


class TickClock:
    """Stand-in for the ``time`` module: ``monotonic()`` ticks 1.0, 2.0, ... (one tick per call)."""

    def __init__(self) -> None:
        self.ticks = 0

    def monotonic(self) -> float:
        self.ticks += 1
        return float(self.ticks)

    def perf_counter(self) -> float:
        return 0.0


class NeverCalled:
    """A name the cut code imports but must never reach on this path (its feature is off)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: object, **kwargs: object) -> None:
        raise AssertionError(f"{self.name} reached although its feature is off")


class ReqToTokenPool:
    """Stand-in for SGLang's ReqToTokenPool: the request-slot rows of KV indices (int32, as SGLang keeps them)."""

    def __init__(self, size: int, max_context_len: int) -> None:
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int32)
        self.free_slots = list(range(1, size + 1))

    def write(self, indices: Any, values: torch.Tensor) -> None:
        self.req_to_token[indices] = values

    def alloc(self, reqs: Sequence[Any]) -> list[int]:
        assert len(reqs) <= len(self.free_slots)
        for r in reqs:
            r.req_pool_idx = self.free_slots.pop(0)
        return [r.req_pool_idx for r in reqs]

    def free(self, req: Any) -> None:
        self.free_slots.append(req.req_pool_idx)
        req.req_pool_idx = None


class StandInClass:
    """A class the cut code only tests with isinstance; nothing here is one."""


RADIX_STAND_INS = {
    "time": "TickClock: monotonic() returns 1.0, 2.0, ... one tick per call (TreeNode creation, match, insert); "
    "perf_counter() returns 0.0 (eviction metrics only, collector off)",
    "CacheInitParams(...)": "the release's own dataclass, built with disable=False, page_size, the allocator, "
    "the ReqToTokenPool stand-in; every other field at its default (eviction_policy 'lru', events and metrics off)",
    "ReqToTokenPool": "req_to_token (int32 rows), write(indices, values), alloc(reqs) (lowest free slot first), "
    "free(req): the row bookkeeping of memory_pool.ReqToTokenPool without device memory",
    "Req": "a plain object with the fields the cut code reads (rid, origin_input_ids, output_ids, fill_ids, "
    "prefix_indices, last_node, cache_protected_len, req_pool_idx, kv_committed_len, kv_allocated_len, extra_key None, "
    "priority None, return_logprob False, logprob_start_len -1, no session, multimodal input or embed overrides) "
    "carrying the wheel's own methods " + ", ".join(REQ_METHODS),
    "get_global_server_args": "page_size of the run, speculative_algorithm None, strip_thinking_cache False",
    "SWATokenToKVPoolAllocator / HybridReqToTokenPool": "classes nothing is an instance of (no hybrid pools)",
    "BlockStored / BlockRemoved / AllBlocksCleared / StorageMedium / hash_str_to_int64": "raise if reached: KV "
    "cache events are off (enable_kv_cache_events False)",
    "logger, torch, heapq, sys, dataclasses, abc, collections, functools, hashlib, typing names": "the real "
    "modules; TYPE_CHECKING False",
}


def load_radix(rw: RadixWheel, page_size: int) -> dict[str, Any]:
    """Execute the cut radix defs, unchanged, in a namespace of their own; return it."""
    # dataclasses resolves string annotations through sys.modules[cls.__module__]: the namespace is a module's.
    module = types.ModuleType(f"sglang_{rw.alloc.release.replace('.', '_')}_radix_ps{page_size}")
    sys.modules[module.__name__] = module
    ns: dict[str, Any] = module.__dict__
    ns |= {
        "torch": torch, "heapq": heapq, "sys": sys, "dataclasses": dataclasses, "hashlib": hashlib,
        "logger": logging.getLogger("sglang-radix-fixture"), "defaultdict": collections.defaultdict,
        "lru_cache": functools.lru_cache, "ABC": abc.ABC, "abstractmethod": abc.abstractmethod,
        "TYPE_CHECKING": False, "time": TickClock(),
        **{name: getattr(typing, name) for name in ("Any", "Iterator", "List", "NamedTuple", "Optional",
                                                    "Protocol", "Tuple", "Union", "runtime_checkable")},
        "get_global_server_args": lambda: SimpleNamespace(page_size=page_size, speculative_algorithm=None,
                                                         strip_thinking_cache=False),
        "SWATokenToKVPoolAllocator": type("SWATokenToKVPoolAllocator", (StandInClass,), {}),
        "HybridReqToTokenPool": type("HybridReqToTokenPool", (StandInClass,), {}),
        **{name: NeverCalled(name) for name in ("BlockStored", "BlockRemoved", "AllBlocksCleared",
                                                "hash_str_to_int64")},
        "StorageMedium": SimpleNamespace(GPU=None, CPU=None),
    }
    req_methods: dict[str, Any] = {}
    for cut in rw.cuts.values():
        flags = __future__.annotations.compiler_flag if cut.future_annotations else 0
        code = compile("\n" * (cut.line - 1) + cut.source, f"{rw.alloc.name}!{cut.path}", "exec", flags=flags,
                       dont_inherit=True)
        if cut.name.startswith("Req."):
            scope: dict[str, Any] = {}
            exec(code, ns, scope)
            req_methods.update(scope)
        else:
            exec(code, ns)
    ns["Req"] = type("Req", (), {**req_methods, "is_dllm": lambda self: False})
    return ns


def where(rw: RadixWheel) -> dict[str, str]:
    return {name: f"{cut.path}:{cut.line}" for name, cut in rw.cuts.items()}


# ---------------------------------------------------------------------------------------------------------------
# The request stream


@dataclass(frozen=True)
class Prompt:
    """One request of the stream: its tokens, where it shares a prefix, when it arrives and when its transfer ends."""

    rid: str
    tokens: tuple[int, ...]
    shares: tuple[str, int] | None
    arrive_step: int
    transfer_steps: int

    def to_json(self) -> Json:
        return {"rid": self.rid, "tokens": len(self.tokens),
                "shares": None if self.shares is None else list(self.shares),
                "arrive_step": self.arrive_step, "transfer_steps": self.transfer_steps}


def prompt_stream(rng: random.Random, page_size: int) -> list[Prompt]:
    """36-48 prompts: mostly fresh (their first token unique, so they share nothing by chance), some continuing an
    earlier prompt (its first k tokens, k page-aligned or not, then new tokens), a few identical to an earlier one
    (half of those arriving with it)."""
    longest = 640 if page_size > 1 else 150
    n = rng.randint(36, 48)
    prompts: list[Prompt] = []
    arrive = 0
    for i in range(n):
        arrive += rng.choice((0, 0, 1, 1, 2))
        draw = rng.random() if prompts else 0.0
        shares: tuple[str, int] | None = None
        if draw < 0.55:
            tokens = (100_000 + i, *(rng.randint(1, 32_000) for _ in range(rng.randint(8, longest) - 1)))
        elif draw < 0.85:
            earlier = rng.choice(prompts[-12:])
            base = earlier.tokens
            if rng.random() < 0.5 and len(base) >= page_size:
                k = rng.randint(1, len(base) // page_size) * page_size
            else:
                k = rng.randint(1, len(base))
            extra = rng.randint(1, longest // 2)
            tokens = base[:k] + tuple(rng.randint(1, 32_000) for _ in range(extra))
            shares = (earlier.rid, k)
        else:
            earlier = rng.choice(prompts[-6:])
            tokens = earlier.tokens
            shares = (earlier.rid, len(tokens))
            if rng.random() < 0.5:
                arrive = max(arrive, earlier.arrive_step)
        prompts.append(Prompt(f"r{i}", tokens, shares, arrive, rng.randint(1, 3)))
    return prompts


# ---------------------------------------------------------------------------------------------------------------
# The prefill node


PREFILL_RADIX_DRIVER = (
    "A disaggregated prefill node with the radix cache on, SGLang's overlap loop "
    "(disaggregation/prefill.py event_loop_overlap_disagg_prefill, the default), steps k = 0, 1, ...: "
    "(a) the prompts arriving at k join the waiting queue, in stream order. "
    "(b) 'schedule': up to this step's batch size (1-3, drawn per step) prompts are taken from the head of the queue "
    "while the head passes this driver's admission rule, prompt + 1 + page_size + the batch's earlier "
    "(ceil_paged(extend) + 1 + page_size) < available + evictable tokens (SGLang's PrefillAdder rule with "
    "max_new_tokens 1, made conservative by counting the whole prompt, so SGLang would admit it too); for each, in "
    "order: Req.init_next_round_input(tree) (match_prefix of the first prompt-1 tokens, page-aligned), then the "
    "PrefillAdder's locks: a temporary lock of the matched node, the request's own lock, the temporary one released "
    "({locks}); then one allocation for the batch: {alloc}. "
    "(c) 'forward_done' for the batch scheduled at k-1 (overlap: after step k's schedule), per request in batch "
    "order: output_ids gets one token, then {insert} (the page-aligned prompt goes into the tree, the request's "
    "duplicates are freed, its row rewritten with the tree's pages, its lock moved to the new last node), and the "
    "request joins the in-flight queue. "
    "(d) 'transfer_done': the in-flight queue is polled in its order; a request whose transfer ends at k "
    "(scheduled at s, ends at s + transfer_steps, 1-3, so possibly in the step of its own forward_done) gets "
    "{release} and leaves the queue. Every event is followed by the tree's evictable and protected tokens, the free "
    "list and the staged pages."
)
DRIVER_0511 = {
    "locks": "inc_lock_ref, inc_lock_ref, dec_lock_ref: schedule_policy.py _lock_node and _req_inc_lock_ref",
    "alloc": "as alloc_for_extend (mem_cache/common.py) does it, alloc_token_slots(tree, extend tokens) at page size "
    "1, alloc_paged_token_slots_extend(...) (last_loc = last prefix slot or -1) otherwise, both calling "
    "evict_from_tree_cache first; the row is written prefix then new slots, kv_committed_len = kv_allocated_len = "
    "prompt",
    "insert": "maybe_cache_unfinished_req(req, tree) (RadixCache.cache_unfinished_req)",
    "release": "release_kv_cache(req, tree) (RadixCache.cache_finished_req: re-insert, free of duplicates and of the "
    "partial last page, dec_lock_ref; then the request row)",
}
DRIVER_LIVE = {
    "locks": "{locks}",
    "alloc": "SGLang's own alloc_for_extend(batch) (mem_cache/allocation.py) on a batch record carrying the "
    "requests, their prefix and sequence lengths and the pools (alloc_req_slots, then alloc_token_slots at page "
    "size 1 or alloc_paged_token_slots_extend, both calling evict_from_tree_cache, then write_cache_indices)",
    "insert": "{insert}",
    "release": "{release}",
}


@dataclass
class Running:
    """A prompt on the node: its request object and where it is in its life."""

    prompt: Prompt
    req: Any
    sched_step: int = -1
    prefix: int = 0
    pages: list[int] = field(default_factory=list)


class NodeOps(typing.Protocol):
    """What the node asks of one release's code: its tree, allocator and request calls."""

    tree: Any
    allocator: Any

    def new_req(self, p: Prompt) -> Any: ...
    def match_and_lock(self, req: Any) -> int: ...
    def allocate(self, reqs: list[Any]) -> None: ...
    def forward_done(self, req: Any) -> None: ...
    def transfer_done(self, req: Any) -> None: ...
    def row(self, req: Any, length: int) -> list[int]: ...
    def locked_leaves(self) -> int | None: ...


class PrefillNode:
    """Drives one release's radix cache and allocator through the loop stated in ``PREFILL_RADIX_DRIVER``."""

    def __init__(self, ops: NodeOps, rec: Recorder, page_size: int, prompts: Sequence[Prompt],
                 rng: random.Random) -> None:
        self.ops, self.rec, self.page_size, self.rng = ops, rec, page_size, rng
        self.allocator = ops.allocator
        self.prompts = list(prompts)
        self.waiting: list[Running] = []
        self.inflight: list[Running] = []
        self.events: list[Json] = []
        self.outcome: dict[str, list[list[int]]] = {}
        self.freed: list[int] = []
        self.free_calls = 0
        self._wrap_free()

    def _wrap_free(self) -> None:
        """Record, in order, the page ids the allocator puts on its release list (paged: unique pages of each call,
        sorted; page size 1: slots as given), and count the calls."""
        allocator = self.allocator
        if hasattr(allocator, "_release_page_ids"):  # 0.5.2x paged: every free path ends here
            release = allocator._release_page_ids

            def release_page_ids(*page_ids: torch.Tensor) -> None:
                release(*page_ids)
                self.freed.extend(int(p) for ids in page_ids for p in ids.tolist())
                self.free_calls += 1

            allocator._release_page_ids = release_page_ids
            return
        original = allocator.free

        def free(free_index: torch.Tensor) -> None:
            before = [int(p) for p in allocator.release_pages.tolist()]
            original(free_index)
            after = [int(p) for p in allocator.release_pages.tolist()]
            n = len(after) - len(before)
            if n:
                # The token allocators append to the release list; 0.5.11's paged one prepends.
                self.freed.extend(after[:n] if after[n:] == before else after[len(before):])
                self.free_calls += 1

        allocator.free = free

    def page_ids(self, slots: Sequence[int]) -> list[int]:
        """Page ids of a row's slots, in row order, each page once."""
        if self.page_size == 1:
            return list(slots)
        return list(dict.fromkeys(s // self.page_size for s in slots))

    def emit(self, event: Json) -> None:
        tree = self.ops.tree
        event |= {"evictable": int(tree.evictable_size()), "protected": int(tree.protected_size()),
                  "free": runs(self.rec.free_pages()), "staged": runs(self.rec.staged_pages())}
        self.events.append(event)

    def run(self) -> None:
        pending = list(self.prompts)
        last: list[Running] = []
        k = 0
        while pending or self.waiting or last or self.inflight:
            assert k < 2000, "the node stalled"
            while pending and pending[0].arrive_step <= k:
                p = pending.pop(0)
                self.waiting.append(Running(p, self.ops.new_req(p)))
            batch = self.schedule(k)
            self.forward_done(k, last)
            self.transfer_done(k)
            last = batch
            k += 1

    def admits(self, r: Running, offset: int) -> bool:
        budget = self.allocator.available_size() + self.ops.tree.evictable_size() - offset
        return len(r.prompt.tokens) + 1 + self.page_size < budget

    def schedule(self, k: int) -> list[Running]:
        cap = self.rng.randint(1, 3)
        batch: list[Running] = []
        offset = 0
        ps = self.page_size
        while self.waiting and len(batch) < cap and self.admits(self.waiting[0], offset):
            r = self.waiting.pop(0)
            r.prefix = self.ops.match_and_lock(r.req)
            offset += -(-(len(r.prompt.tokens) - r.prefix) // ps) * ps + 1 + ps
            r.sched_step = k
            batch.append(r)
        if batch:
            self.allocate(k, batch)
        return batch

    def allocate(self, k: int, batch: list[Running]) -> None:
        staged_before = len(self.rec.staged_pages())
        self.freed, self.free_calls = [], 0
        locked = self.ops.locked_leaves()
        prefix_lens = [r.prefix for r in batch]
        self.ops.allocate([r.req for r in batch])
        assert not any(kern.faulted for kern in self.rec.kernels), "a kernel twin faulted on an admitted batch"
        evicted, evict_frees = self.freed, self.free_calls
        entries = []
        for r, pre in zip(batch, prefix_lens, strict=True):
            row = self.ops.row(r.req, len(r.prompt.tokens))
            prefix_pages, new_pages = self.page_ids(row[:pre]), self.page_ids(row[pre:])
            r.pages = prefix_pages + new_pages
            entries.append({"rid": r.prompt.rid, "cached": pre, "prefix_pages": runs(prefix_pages),
                            "pages": runs(new_pages)})
        merged = staged_before > 0 and not self.rec.staged_pages()
        extend = sum(len(r.prompt.tokens) - r.prefix for r in batch)
        event: Json = {"op": "schedule", "step": k, "reqs": entries, "extend_tokens": extend,
                       "evicted": runs(evicted), "merged": merged}
        if evicted:
            event["evict_frees"] = evict_frees
            if locked is not None:
                event["locked_leaves"] = locked
        self.emit(event)

    def forward_done(self, k: int, batch: list[Running]) -> None:
        for r in batch:
            self.freed = []
            self.ops.forward_done(r.req)
            row = self.page_ids(self.ops.row(r.req, len(r.prompt.tokens)))
            event: Json = {"op": "forward_done", "step": k, "rid": r.prompt.rid, "freed": runs(self.freed)}
            if row != r.pages:
                event["row"] = runs(row)
            self.emit(event)
            self.outcome[r.prompt.rid] = runs(r.pages)
            self.inflight.append(r)

    def transfer_done(self, k: int) -> None:
        still: list[Running] = []
        for r in self.inflight:
            if r.sched_step + r.prompt.transfer_steps > k:
                still.append(r)
                continue
            self.freed = []
            self.ops.transfer_done(r.req)
            self.emit({"op": "transfer_done", "step": k, "rid": r.prompt.rid, "freed": runs(self.freed)})
        self.inflight = still


class CutOps:
    """The node's calls on the defs cut from a 0.5.1x wheel (``RadixCache``, mem_cache/common.py helpers)."""

    def __init__(self, ns: dict[str, Any], allocator: Any, page_size: int, max_len: int) -> None:
        self.ns, self.allocator, self.page_size = ns, allocator, page_size
        self.pool = ReqToTokenPool(REQ_SLOTS, max_len)
        params = ns["CacheInitParams"](disable=False, req_to_token_pool=self.pool,
                                       token_to_kv_pool_allocator=allocator, page_size=page_size)
        self.tree = ns["RadixCache"](params)

    def new_req(self, p: Prompt) -> Any:
        req = self.ns["Req"]()
        fields = {"rid": p.rid, "origin_input_ids": list(p.tokens), "output_ids": [], "extra_key": None,
                  "priority": None, "session": None, "return_logprob": False, "logprob_start_len": -1,
                  "positional_embed_overrides": None, "is_retracted": False, "multimodal_inputs": None,
                  "reasoning_tokens": 0, "req_pool_idx": None, "last_node": None, "cache_protected_len": 0,
                  "kv_committed_len": 0, "kv_allocated_len": 0, "kv_committed_freed": False,
                  "kv_overallocated_freed": False, "is_chunked": 0}
        for name, value in fields.items():
            setattr(req, name, value)
        return req

    def match_and_lock(self, req: Any) -> int:
        req.init_next_round_input(self.tree)
        self.tree.inc_lock_ref(req.last_node)
        self.tree.inc_lock_ref(req.last_node)
        self.tree.dec_lock_ref(req.last_node)
        return len(req.prefix_indices)

    def allocate(self, reqs: list[Any]) -> None:
        """alloc_for_extend (mem_cache/common.py) for the batch: request rows, one allocation, rows written."""
        ns, ps = self.ns, self.page_size
        prefix_lens = [len(q.prefix_indices) for q in reqs]
        seq_lens = [len(q.fill_ids) for q in reqs]
        extend = sum(seq_lens) - sum(prefix_lens)
        self.pool.alloc(reqs)
        # evict() heaps (last_access_time, node) from a set: a tie would make the order depend on object ids.
        times = [leaf.last_access_time for leaf in self.tree.evictable_leaves]
        assert len(set(times)) == len(times), "two evictable leaves share an access time"
        ticks_before = ns["time"].ticks
        if ps == 1:
            out = ns["alloc_token_slots"](self.tree, extend)
        else:
            last_loc = [int(q.prefix_indices[-1]) if len(q.prefix_indices) else -1 for q in reqs]
            out = ns["alloc_paged_token_slots_extend"](
                tree_cache=self.tree, prefix_lens=torch.tensor(prefix_lens), prefix_lens_cpu=torch.tensor(prefix_lens),
                seq_lens=torch.tensor(seq_lens), seq_lens_cpu=torch.tensor(seq_lens),
                last_loc=torch.tensor(last_loc, dtype=torch.int64), extend_num_tokens=extend)
        assert ticks_before == ns["time"].ticks, "allocation touched the tree clock"
        start = 0
        for q, pre, seq in zip(reqs, prefix_lens, seq_lens, strict=True):
            self.pool.req_to_token[q.req_pool_idx, :pre] = q.prefix_indices.to(torch.int32)
            self.pool.req_to_token[q.req_pool_idx, pre:seq] = out[start:start + seq - pre].to(torch.int32)
            start += seq - pre
            q.kv_committed_len = q.kv_allocated_len = seq

    def forward_done(self, req: Any) -> None:
        req.output_ids.append(1)
        self.ns["maybe_cache_unfinished_req"](req, self.tree)

    def transfer_done(self, req: Any) -> None:
        self.ns["release_kv_cache"](req, self.tree)

    def row(self, req: Any, length: int) -> list[int]:
        idx = req.req_pool_idx
        assert idx is not None or length == 0
        return [int(s) for s in self.pool.req_to_token[idx, :length].tolist()]

    def locked_leaves(self) -> int:
        """Leaves of the tree that a lock keeps from eviction (in-flight prompts' last nodes)."""
        count, stack = 0, [self.tree.root_node]
        while stack:
            node = stack.pop()
            children = list(node.children.values())
            if not children and node is not self.tree.root_node and node.lock_ref > 0:
                count += 1
            stack.extend(children)
        return count


# ---------------------------------------------------------------------------------------------------------------
# A 0.5.2x wheel's own modules (UnifiedRadixCache on its compiled TreeCore), run in a worker process


class StubMeta(type):
    """Class of the stand-ins for absent third-party names: any attribute is another stand-in, every call is
    logged in ``STUB_CALLS`` so that a recording can prove none was reached."""

    def __getattr__(cls, name: str) -> Any:
        if name == "__class_validators__":  # read by sglang's transformers patches at import
            return []
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = StubMeta(name, (Stub,), {"__qualname__": f"{cls.__qualname__}.{name}"})
        setattr(cls, name, sub)
        return sub

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        STUB_CALLS.append(cls.__qualname__)
        return super().__call__()

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __or__(cls, other: Any) -> Any:
        return cls

    def __ror__(cls, other: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __setitem__(cls, key: Any, value: Any) -> None:
        pass

    def __contains__(cls, item: Any) -> bool:
        return False

    def __len__(cls) -> int:
        return 0

    def __eq__(cls, other: object) -> bool:
        return cls is other

    def __hash__(cls) -> int:
        return id(cls)


class Stub(metaclass=StubMeta):
    """An instance of a stand-in class (a decorated function, a config object): inert, its calls logged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        STUB_CALLS.append(type(self).__qualname__ + "()")
        return self

    def __getitem__(self, item: Any) -> Any:
        return self

    def __bool__(self) -> bool:
        return False

    def __iter__(self) -> Any:
        return iter(())


class StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = StubMeta(name, (Stub,), {"__qualname__": f"{self.__name__}.{name}"})
        setattr(self, name, sub)
        return sub


STUB_CALLS: list[str] = []
STUBBED: set[str] = set()
# transformers (installed or not) and torchvision are always stand-ins: sglang's model configs import processor
# classes that need a matching torchvision; torchcodec never is (transformers probes it by metadata).
FORCE_STUB = frozenset({"transformers", "torchvision"})
NEVER_STUB = frozenset({"torchcodec", "torch", "numpy"})


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import hook: a third-party module that sglang imports and this venv lacks becomes a ``StubModule``."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top not in FORCE_STUB:
            if top in NEVER_STUB or top == "sglang" or top in sys.stdlib_module_names or top.startswith("_"):
                return None
            for finder in sys.meta_path:
                if finder is not self and getattr(finder, "find_spec", None) is not None:
                    try:
                        if finder.find_spec(fullname, path, target) is not None:
                            return None
                    except (ImportError, ValueError):
                        continue
            frame: types.FrameType | None = sys._getframe(1)
            while frame is not None and frame.f_globals.get("__name__", "").startswith("importlib"):
                frame = frame.f_back
            caller = "" if frame is None else frame.f_globals.get("__name__", "")
            if not caller.startswith("sglang") and top not in STUBBED:
                return None
        STUBBED.add(top)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        module = StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def unpack_sglang(wheel: Path, dest: Path) -> None:
    """Extract the wheel's ``sglang/`` package (sources and the compiled TreeCore) under ``dest``."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, [m for m in zf.namelist() if m.startswith("sglang/")])


@dataclass
class LiveModules:
    """The imported modules of one 0.5.2x release, patched where they need a GPU."""

    root: Path
    m: dict[str, Any]
    stand_ins: dict[str, str]

    def where(self, obj: Any) -> str:
        obj = inspect.unwrap(obj)
        path = Path(inspect.getsourcefile(obj) or "").resolve().relative_to(self.root)
        return f"{path}:{inspect.getsourcelines(obj)[1]}"


LIVE_MODULES = {
    "allocation": "sglang.srt.mem_cache.allocation",
    "common": "sglang.srt.mem_cache.common",
    "paged": "sglang.srt.mem_cache.allocator.paged",
    "token": "sglang.srt.mem_cache.allocator.token",
    "base_alloc": "sglang.srt.mem_cache.allocator.base",
    "registry": "sglang.srt.mem_cache.registry",
    "urc": "sglang.srt.mem_cache.unified_radix_cache",
    "params": "sglang.srt.mem_cache.cache_init_params",
    "ctype": "sglang.srt.mem_cache.unified_cache.component_type",
    "memory_pool": "sglang.srt.mem_cache.memory_pool",
    "base_prefix": "sglang.srt.mem_cache.base_prefix_cache",
    "schedule_batch": "sglang.srt.managers.schedule_batch",
    "sampling": "sglang.srt.sampling.sampling_params",
    "runtime": "sglang.srt.runtime_context",
    "core_registry": "sglang.srt.mem_cache.unified_cache.tree_core_registry",
}


def import_live(root: Path) -> LiveModules:
    """Import the release's modules from ``root`` behind the stub hook, and patch its GPU kernels to their twins."""
    sys.path.insert(0, str(root))
    sys.meta_path.insert(0, StubFinder())
    m: dict[str, Any] = {key: importlib.import_module(name) for key, name in LIVE_MODULES.items()}
    paged = m["paged"]
    stand_ins = {
        "third-party packages": "inert stand-ins (StubModule) for those the recording venv lacks and, always, for "
        "transformers and torchvision (sglang's model configs import processor classes at module level): "
        + ", ".join(sorted(STUBBED)) + "; every call on one is logged, and none happened while the node ran "
        "(asserted)",
        "server args": "runtime_context.get_context().override_server_args(page_size=<run>, "
        "disaggregation_mode='prefill'): SGLang's own helper, ServerArgs(model_path='dummy') with those fields",
        "write_cache_indices": "allocation.attention_backends returns ('torch_native', 'torch_native'), so it takes "
        "its non-Triton branch (the same row writes, one request at a time)",
        "batch": "a record with reqs, prefix_lens, extend_lens, seq_lens(_cpu), extend_num_tokens, the pools, "
        "device 'cpu', no SWA eviction, not dLLM, no HiSparse coordinator: the fields alloc_for_extend reads",
        "allocator / pools": "the release's PagedTokenToKVPoolAllocator or TokenToKVPoolAllocator (need_sort=True, "
        "kvcache=None, device 'cpu') and its ReqToTokenPool on CPU",
    }
    if "supports_triton" in inspect.getsource(paged.PagedTokenToKVPoolAllocator):
        paged.current_platform = SimpleNamespace(capabilities=SimpleNamespace(supports_triton=False))
        paged.alloc_extend_kernel = never_launched("alloc_extend_kernel")
        paged.alloc_decode_kernel = never_launched("alloc_decode_kernel")
        stand_ins["current_platform (allocator/paged.py)"] = "capabilities.supports_triton = False: the paged " \
            "allocator calls alloc_extend_naive"
    else:
        def extend(prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any, out: Any, bs_upper: int,
                   page_size: int) -> None:
            paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out, page_size, out.device)

        paged.alloc_extend_kernel = KernelLaunch(extend)
        paged.alloc_decode_kernel = never_launched("alloc_decode_kernel")
        stand_ins["alloc_extend_kernel (allocator/paged.py)"] = "launched unconditionally by this release's " \
            "allocator; routed to its pure-torch twin alloc_extend_naive with the launch's arguments"
    m["allocation"].attention_backends = lambda: ("torch_native", "torch_native")
    return LiveModules(root, m, stand_ins)


class LiveOps:
    """The node's calls on a 0.5.2x release's own scheduler-side functions and its default tree."""

    def __init__(self, live: LiveModules, page_size: int, max_len: int, tree_core: str | None = None) -> None:
        m = live.m
        self.m, self.page_size = m, page_size
        size = POOL_PAGES[page_size] * page_size
        if page_size == 1:
            self.allocator = m["token"].TokenToKVPoolAllocator(size, dtype=torch.int64, device="cpu", kvcache=None,
                                                               need_sort=True)
        else:
            self.allocator = m["paged"].PagedTokenToKVPoolAllocator(size, page_size, dtype=torch.int64, device="cpu",
                                                                    kvcache=None, need_sort=True)
        self.pool = m["memory_pool"].ReqToTokenPool(REQ_SLOTS, max_len, "cpu", False)
        params = m["params"].CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                             token_to_kv_pool_allocator=self.allocator, page_size=page_size,
                                             tree_core_backend=tree_core)
        registry = m["registry"]
        ctx_fields = {f.name for f in dataclasses.fields(registry.TreeCacheBuildContext)}
        ctx = registry.TreeCacheBuildContext(**{k: v for k, v in {
            "server_args": m["runtime"].get_server_args(), "params": params, "is_hybrid_swa": False,
            "is_hybrid_ssm": False, "enable_hierarchical_cache": False, "disable_radix_cache": False,
            "effective_chunked_prefill_size": 8192, "tp_worker": None, "model_config": None, "tp_size": 1,
            "tp_rank": 0, "tp_group": None}.items() if k in ctx_fields})
        self.tree = registry.default_radix_cache_factory(ctx)
        self.backend = self.tree._tree_core_backend
        self.has_tree_lock = hasattr(type(self.tree), "lock")

    def new_req(self, p: Prompt) -> Any:
        sampling = self.m["sampling"].SamplingParams(max_new_tokens=1)  # disaggregation/prefill.py sets 1
        return self.m["schedule_batch"].Req(p.rid, "", array.array("q", p.tokens), sampling)

    def prefix_len(self, req: Any) -> int:
        return int(req.prefix_len) if hasattr(req, "prefix_len") else len(req.prefix_indices)

    def match_and_lock(self, req: Any) -> int:
        """init_next_round_input, then PrefillAdder.add_one_req's locks: _lock_node's temporary lock around
        _commit_prefill_admission (extend range, the request's lock)."""
        tree = self.tree
        req.init_next_round_input(tree)
        prefix = self.prefix_len(req)
        end = len(req.full_untruncated_fill_ids)
        if self.has_tree_lock:  # 0.5.23: TreeLock handles
            temporary = tree.lock(req.last_node)
            req.extend_end = end
            req.lock = tree.lock(req.last_node)
            tree.unlock(temporary)
        else:  # 0.5.21: lock receipts
            temporary = tree.inc_lock_ref(req.last_node).to_dec_params()
            req.set_extend_range(prefix, end)
            req.lock_receipt = tree.inc_lock_ref(req.last_node).to_dec_params()
            tree.dec_lock_ref(req.last_node, temporary)
        return prefix

    def allocate(self, reqs: list[Any]) -> None:
        prefix_lens = [self.prefix_len(q) for q in reqs]
        seq_lens = [len(q.full_untruncated_fill_ids) for q in reqs]
        batch = SimpleNamespace(
            reqs=reqs, device="cpu", prefix_lens=prefix_lens,
            extend_lens=[s - p for p, s in zip(prefix_lens, seq_lens, strict=True)],
            req_to_token_pool=self.pool, tree_cache=self.tree, seq_lens=torch.tensor(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens), extend_num_tokens=sum(seq_lens) - sum(prefix_lens),
            hisparse_coordinator=None, maybe_evict_swa=lambda: None, is_dllm=lambda: False)
        self.m["allocation"].alloc_for_extend(batch)

    def forward_done(self, req: Any) -> None:
        req.output_ids.append(1)
        common = self.m["common"]
        if hasattr(common, "checkpoint_kv_cache"):  # 0.5.23: checkpoint_disagg_prefill
            common.checkpoint_kv_cache(req, self.tree)
        else:  # 0.5.21: cache_unfinished_disagg_prefill
            common.maybe_cache_unfinished_req(req, self.tree)

    def transfer_done(self, req: Any) -> None:
        req.finished_reason = self.m["schedule_batch"].FINISH_LENGTH(length=0)
        release = self.m["common"].release_kv_cache
        if "checkpoint" in inspect.signature(release).parameters:
            release(req, self.tree, checkpoint=True)
        else:
            release(req, self.tree)
        self.tree.finish(req.cache_request_handle, self.m["base_prefix"].CacheRequestOutcome.SUCCESS)

    def row(self, req: Any, length: int) -> list[int]:
        return [int(s) for s in self.pool.req_to_token[req.kv.req_pool_idx, :length].tolist()]

    def locked_leaves(self) -> None:
        return None

    def sources(self, live: LiveModules) -> dict[str, str]:
        m = self.m
        objs = {
            "default_radix_cache_factory": m["registry"].default_radix_cache_factory,
            "create_unified_radix_cache": m["registry"].create_unified_radix_cache,
            "UnifiedRadixCache": m["urc"].UnifiedRadixCache,
            "Req.init_next_round_input": m["schedule_batch"].Req.init_next_round_input,
            "alloc_for_extend": m["allocation"].alloc_for_extend,
            "alloc_token_slots": m["allocation"].alloc_token_slots,
            "alloc_paged_token_slots_extend": m["allocation"].alloc_paged_token_slots_extend,
            "evict_from_tree_cache": m["common"].evict_from_tree_cache,
            "BaseTokenToKVPoolAllocator.evict_to_free_tokens": m["base_alloc"].BaseTokenToKVPoolAllocator
            .evict_to_free_tokens,
            "release_kv_cache": m["common"].release_kv_cache,
            "ReqToTokenPool": m["memory_pool"].ReqToTokenPool,
            type(self.allocator).__name__: type(self.allocator),
        }
        if hasattr(m["common"], "checkpoint_kv_cache"):
            objs["checkpoint_kv_cache"] = m["common"].checkpoint_kv_cache
        else:
            objs["maybe_cache_unfinished_req"] = m["common"].maybe_cache_unfinished_req
        out = {name: live.where(obj) for name, obj in objs.items()}
        core = type(self.tree.tree_core)
        out["TreeCore"] = f"{core.__module__}.{core.__qualname__} (backend {self.backend!r})"
        return out


def live_driver(ops: LiveOps) -> str:
    locks = ("tree.lock(last_node), then extend_end set and req.lock = tree.lock(last_node), then "
             "tree.unlock(temporary): schedule_policy.py _lock_node / _commit_prefill_admission") if ops.has_tree_lock \
        else ("inc_lock_ref(last_node) (temporary receipt), set_extend_range, req.lock_receipt = "
              "inc_lock_ref(last_node), dec_lock_ref(last_node, temporary receipt): schedule_policy.py _lock_node / "
              "_commit_prefill_admission")
    if hasattr(ops.m["common"], "checkpoint_kv_cache"):
        insert = "checkpoint_kv_cache(req, tree) (disaggregation/prefill.py checkpoint_disagg_prefill)"
        release = ("release_kv_cache(req, tree, checkpoint=True) (checkpoint, free_kv_row of "
                   "[cache_protected_len, owned), unlock) and tree.finish(handle, SUCCESS), finished_reason "
                   "FINISH_LENGTH(0) first")
    else:
        insert = "maybe_cache_unfinished_req(req, tree) (disaggregation/prefill.py cache_unfinished_disagg_prefill)"
        release = ("release_kv_cache(req, tree) (insert_req, free_kv_row of [cache_protected_len, owned), unpin) "
                   "and tree.finish(handle, SUCCESS), finished_reason FINISH_LENGTH(0) first")
    parts = {k: v.format(locks=locks, insert=insert, release=release) for k, v in DRIVER_LIVE.items()}
    return PREFILL_RADIX_DRIVER.format(**parts)


def live_recorder(ops: LiveOps) -> Recorder:
    kernels = {k: KernelLaunch(lambda *args: None) for k in KERNELS}
    return Recorder(ops.allocator, kernels, ops.page_size)


def run_live_fixture(live: LiveModules, wheel: Wheel, page_size: int, seed: int, tree_core: str | None = None) -> Json:
    runtime = live.m["runtime"]
    override = runtime.get_context().override_server_args(page_size=page_size, disaggregation_mode="prefill")
    override.install()
    try:
        rng = random.Random(seed)
        prompts = prompt_stream(rng, page_size)
        ops = LiveOps(live, page_size, max(len(p.tokens) for p in prompts) + 8, tree_core)
        calls_before = len(STUB_CALLS)
        node = PrefillNode(ops, live_recorder(ops), page_size, prompts, rng)
        node.run()
        assert len(STUB_CALLS) == calls_before, f"a stand-in was called: {STUB_CALLS[calls_before:]}"
        return {
            "release": wheel.release, "wheel": wheel.name, "wheel_sha256": wheel.sha256, "source": ops.sources(live),
            "tree_core": ops.backend, "stand_ins": live.stand_ins, "notes": [], "driver": live_driver(ops),
            "page_size": page_size, "size": POOL_PAGES[page_size] * page_size, "need_sort": True,
            "scenario": SCENARIO, "seed": seed, "requests": [p.to_json() for p in prompts], "events": node.events,
            "outcome": dict(sorted(node.outcome.items(), key=lambda item: int(item[0][1:]))),
        }
    finally:
        override.restore()


def live_worker(wheel_path: Path, out: Path) -> None:
    """Record one 0.5.2x wheel (in its own process: its modules are imported as ``sglang``); print the summary."""
    wheel = read_wheel(wheel_path)
    with tempfile.TemporaryDirectory(prefix="sglang-radix-") as tmp:
        root = Path(tmp)
        unpack_sglang(wheel_path, root)
        live = import_live(root)
        folder = out / wheel.release
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for page_size in sorted(POOL_PAGES):
            for seed in SEEDS:
                doc = run_live_fixture(live, wheel, page_size, seed)
                python_core = run_live_fixture(live, wheel, page_size, seed, tree_core="python")
                same = python_core["events"] == doc["events"] and python_core["outcome"] == doc["outcome"]
                doc["notes"] = [f"Recorded with the {doc['tree_core']} TreeCore; the Python TreeCore "
                                f"({'same' if same else 'DIFFERENT'} events and outcome) was run as a cross-check."]
                counts = check(doc)
                counts["python_core_same"] = int(same)
                path = folder / f"ps{page_size}-{SCENARIO}-s{seed}.json"
                text = dump_fixture(doc)
                path.write_text(text)
                rows.append([str(path.relative_to(out)), len(text.encode()), counts])
        print("SUMMARY " + json.dumps({"rows": rows, "sources": doc["source"], "tree_core": doc["tree_core"]}))


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and README


def run_fixture(rw: RadixWheel, alloc_ns: dict[str, Any], page_size: int, seed: int) -> Json:
    """One fixture of a 0.5.1x release, from the cut defs."""
    ns = load_radix(rw, page_size)
    size = POOL_PAGES[page_size] * page_size
    if page_size == 1:
        allocator = alloc_ns["TokenToKVPoolAllocator"](size, dtype=torch.int64, device="cpu", kvcache=None,
                                                        need_sort=True)
    else:
        allocator = alloc_ns["PagedTokenToKVPoolAllocator"](size, page_size, dtype=torch.int64, device="cpu",
                                                            kvcache=None, need_sort=True)
    rng = random.Random(seed)
    prompts = prompt_stream(rng, page_size)
    ops = CutOps(ns, allocator, page_size, max(len(p.tokens) for p in prompts) + 8)
    node = PrefillNode(ops, Recorder(allocator, alloc_ns, page_size), page_size, prompts, rng)
    node.run()
    alloc_defs = (("BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator") if page_size == 1 else
                  ("get_num_new_pages", "next_power_of_2", "BaseTokenToKVPoolAllocator", "alloc_extend_naive",
                   "PagedTokenToKVPoolAllocator"))
    w = rw.alloc
    source = {name: w.defs[name].where(w.name) for name in alloc_defs} | where(rw)
    return {
        "release": w.release, "wheel": w.name, "wheel_sha256": w.sha256, "source": source, "tree_core": None,
        "stand_ins": RADIX_STAND_INS, "notes": w.notes if page_size > 1 else [],
        "driver": PREFILL_RADIX_DRIVER.format(**DRIVER_0511),
        "page_size": page_size, "size": size, "need_sort": True, "scenario": SCENARIO, "seed": seed,
        "requests": [p.to_json() for p in prompts], "events": node.events,
        "outcome": dict(sorted(node.outcome.items(), key=lambda item: int(item[0][1:]))),
    }


def check(doc: Json) -> dict[str, int]:
    """The conditions every fixture must meet (a failure is the driver's, not SGLang's); returns the counts."""
    name = f"{doc['release']} ps{doc['page_size']} s{doc['seed']}"
    sched = [e for e in doc["events"] if e["op"] == "schedule"]
    evictions = [e for e in sched if e["evicted"]]
    counts = {
        "events": len(doc["events"]), "batches": len(sched), "evictions": len(evictions),
        "evicted_pages": sum(n for e in evictions for _, n in e["evicted"]),
        "evictions_locked": sum(1 for e in evictions if e["protected"] > 0),
        "evictions_multi": sum(1 for e in evictions if e["evict_frees"] > 1),
        "cached_reqs": sum(1 for e in sched for r in e["reqs"] if r["cached"] > 0),
        "dup_frees": sum(1 for e in doc["events"] if e["op"] == "forward_done" and e["freed"]),
        "merges": sum(1 for e in sched if e["merged"]),
    }
    assert len(doc["outcome"]) == len(doc["requests"]), f"{name}: not every request was prefilled"
    assert counts["evictions"] >= 3, f"{name}: eviction fired {counts['evictions']} times"
    assert counts["evictions_locked"] > 0, f"{name}: no eviction while a prefix was locked"
    assert counts["evictions_multi"] > 0, f"{name}: no eviction took several frees"
    assert counts["cached_reqs"] > 0 and counts["dup_frees"] > 0, f"{name}: {counts}"
    assert any(len(e["reqs"]) > 1 for e in sched), f"{name}: no batch of several prompts"
    return counts


README_BEGIN = "<!-- prefill-radix: written by scripts/make_sglang_radix_fixtures.py -->"
README_END = "<!-- /prefill-radix -->"
README_SECTION = """\
## Scenario `prefill-radix` (the radix cache of a prefill node)

Written by `scripts/make_sglang_radix_fixtures.py` from the same wheels (byte-identical on reruns):

    /tmp/alloc-venv/bin/pip install numpy packaging psutil tqdm orjson msgspec pybase64 requests pillow dill \\
        pydantic pyzmq aiohttp starlette triton   # 0.5.2x imports these at module level
    /tmp/alloc-venv/bin/python scripts/make_sglang_radix_fixtures.py /tmp/wheels/sglang-*.whl \\
        --out tests/replay/allocator

A disaggregated prefill node with the radix cache on (the default), driven by the loop in each file's `driver`:
SGLang's overlap loop; per batch, each prompt matched (`init_next_round_input`) and locked as the PrefillAdder does,
then one allocation (eviction first); after the forward, the prompt inserted; at the transfer's end, the request
released. What runs is the release's own code:

- 0.5.1x: the prefill default is `radix_cache.RadixCache`; it, the prefix-cache base, the eviction strategies, the
  helpers of `mem_cache/common.py` and the `Req` methods they call are cut from the wheel and run unchanged (table
  below); the tree's clock (`time.monotonic`) is a counter, one tick per call.
- 0.5.2x: the prefill default is `UnifiedRadixCache` on the wheel's compiled Rust TreeCore
  (`mem_cache/registry.py` `default_radix_cache_factory`; the tree is built through it). The wheel's `sglang`
  package is imported whole in a worker process; third-party packages it imports and this venv lacks are inert
  stand-ins whose every call is logged, and none is called while the node runs (asserted). The tree's clock is its
  own logical counter. Each file is cross-checked against the Python TreeCore (`notes`).

Format. `requests`: the stream (`rid`; `tokens`: prompt length; `shares`: `[earlier_rid, k]` when the prompt's
first k tokens are that request's, else null; `arrive_step`; `transfer_steps`). `events`, in order, one a line:
`schedule` (one batch: per request `cached` tokens matched, `prefix_pages` matched and `pages` newly allocated, as
RUNS in row order; `extend_tokens`; `evicted`: pages freed by eviction before the allocation, in the order freed, as
RUNS; `evict_frees`: allocator free calls the eviction made (0.5.11: one per leaf); `locked_leaves` (0.5.11):
leaves a lock kept from eviction; `merged`), `forward_done` (one request inserted after its forward: `freed`, its
duplicate pages; `row`: its pages after the insert, when they changed), `transfer_done` (one request released at its
transfer's end: `freed`, pages freed in order). Every event carries `step`, then the tree's `evictable` and
`protected` tokens and the pool's `free` and `staged` PAGERUNS after it. `outcome`: rid -> the prompt's pages as
allocated (prefix pages, then new), as RUNS. Page ids at page size 1 are slots. `tree_core`: the TreeCore backend
(null for 0.5.1x). `source`: where each def that ran starts.
"""


def readme_section(cut: Sequence[RadixWheel], live: Sequence[Json], rows: Sequence[Sequence[Any]]) -> str:
    text = README_BEGIN + "\n" + README_SECTION + "\n| release | def | starts at |\n|---|---|---|\n"
    for rw in cut:
        for name, c in rw.cuts.items():
            text += f"| {rw.alloc.release} | `{name}` | `{c.path}:{c.line}` |\n"
    for summary in live:
        for name, where_ in summary["sources"].items():
            text += f"| {summary['release']} | `{name}` | `{where_}` |\n"
    text += ("\n| file | bytes | events | batches | evictions | evicted pages | evictions while locked | several frees "
             "| prefix hits | duplicate frees | merges | Python TreeCore same |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for path, size, c in rows:
        same = {None: "", 1: "yes", 0: "NO"}[c.get("python_core_same")]
        text += (f"| `{path}` | {size} | {c['events']} | {c['batches']} | {c['evictions']} | {c['evicted_pages']} "
                 f"| {c['evictions_locked']} | {c['evictions_multi']} | {c['cached_reqs']} | {c['dup_frees']} "
                 f"| {c['merges']} | {same} |\n")
    return text + README_END + "\n"


def write_readme_section(out: Path, section: str) -> None:
    """Replace the section between the markers, or append it; the rest of the README is left as it is."""
    path = out / "README.md"
    text = path.read_text() if path.exists() else ""
    if README_BEGIN in text:
        head, _, rest = text.partition(README_BEGIN)
        _, _, tail = rest.partition(README_END + "\n")
        text = head + section + tail
    else:
        text = text + ("\n" if text and not text.endswith("\n\n") else "") + section
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="sglang-X.Y.Z-*.whl files")
    parser.add_argument("--out", type=Path, default=Path("tests/replay/allocator"))
    parser.add_argument("--live-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.live_worker:
        live_worker(args.wheels[0], args.out)
        return
    alloc_wheels = {p: read_wheel(p) for p in args.wheels}
    borrow_decode_twin(list(alloc_wheels.values()))
    cut: list[RadixWheel] = []
    live_paths: list[Path] = []
    for path, w in sorted(alloc_wheels.items(), key=lambda item: item[1].version):
        if default_is_unified(path):
            live_paths.append(path)
        else:
            cut.append(read_radix_defs(path, w))
    rows: list[Sequence[Any]] = []
    for rw in cut:
        alloc_ns = load_allocators(rw.alloc)
        folder = args.out / rw.alloc.release
        folder.mkdir(parents=True, exist_ok=True)
        for page_size in sorted(POOL_PAGES):
            for seed in SEEDS:
                doc = run_fixture(rw, alloc_ns, page_size, seed)
                counts = check(doc)
                path = folder / f"ps{page_size}-{SCENARIO}-s{seed}.json"
                text = dump_fixture(doc)
                path.write_text(text)
                rows.append((str(path.relative_to(args.out)), len(text.encode()), counts))
                print(f"{path}: {len(text.encode())} bytes, {counts}")
    live: list[Json] = []
    for path in live_paths:
        done = subprocess.run([sys.executable, __file__, str(path), "--out", str(args.out), "--live-worker"],
                              check=True, capture_output=True, text=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("SUMMARY "))
        summary = json.loads(line.removeprefix("SUMMARY "))
        summary["release"] = alloc_wheels[path].release
        live.append(summary)
        for row in summary["rows"]:
            rows.append(row)
            print(f"{args.out / row[0]}: {row[1]} bytes, {row[2]}")
    write_readme_section(args.out, readme_section(cut, live, rows))


if __name__ == "__main__":
    main()
