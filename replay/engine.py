"""The reference engine: SGLang's prefill/decode page handoff, node by node (reference-engine.md).

A :class:`NodeEngine` owns one node's page pool. It is fed that node's request and transfer
events in the node's order, decides what the engine behaviour does with each (go on, reject,
fail), and emits the events that happen together with the ``kv`` records they cause. The
simulator feeds it events it times itself; a replay feeds it the events of a case. Both get
the same page decisions from the same code.

Decisions that involve more than one node are taken once per request, before any node runs,
by :func:`plan`: whether the router or the prefill node rejects it, and how many KV tokens the
transfer carries (one, for an over-long prompt swapped for the placeholder).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from forensics import compiled
from replay import steps as kernel
from replay.logset import LogSet
from replay.pagetext import page_text
from replay.pool import BeyondBound, PagePool, Pages, pages_for
from replay.radix import Node, PrefixCache, evict_tokens

#: The release from which SGLang's prefix cache evicts only what an allocation lacks; before it,
#: the whole amount asked. Read in the wheels, ``evict_from_tree_cache`` of
#: ``mem_cache/common.py``: the whole amount in 0.5.11 to 0.5.16 (0.5.12 :353, 0.5.16 :128); the
#: shortfall from 0.5.17 (:129, "evict only the shortfall"; 0.5.18 :138).
EVICTS_SHORTFALL_FROM = (0, 5, 17)


def evicts_whole(version: str) -> bool:
    """Whether the release ``version`` (``X.Y.Z``, or a range ``A-B`` of them, read by its last)
    evicts the whole amount an allocation asks for; a version it cannot read is taken as a recent
    one. (A range across :data:`EVICTS_SHORTFALL_FROM` leaves it undecided: the replay says that
    it took the last release's way, replay.configs.assumptions.)"""
    parts = version.split("-")[-1].split(".")[:3]
    if len(parts) < 3 or not all(x.isdigit() for x in parts):
        return False
    return tuple(int(x) for x in parts) < EVICTS_SHORTFALL_FROM


def decode_steps(outputs: int, overlap: bool) -> int:
    """The decode steps a request that outputs ``outputs`` tokens takes a slot in: one for each
    token after the first (which came from prefill), one more under the overlap scheduler; none
    for a single token (it finishes as it lands)."""
    return 0 if outputs < 2 else outputs - 1 + (1 if overlap else 0)


BEHAVIOURS = ("sglang-placeholder", "sglang-hardened", "coverage-check", "page-tags")

#: HTTP status and finish reason of each way the engine ends a request early.
ROUTER_REJECT = (400, "context_length_exceeded")
PREFILL_REJECT = (400, "input_too_long")
POOL_EXHAUSTED = (503, "kv_pool_exhausted")
#: decode's admission budget: tokens kept free for each request preallocated or running
#: (``--num-reserved-decode-tokens``, 512 by default) and the longest output it estimates
#: (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096)
RESERVED_DECODE_TOKENS = 512
CLIP_MAX_NEW_TOKENS = 4096
#: decode: a prompt larger than the whole pool (disaggregation/decode.py: ``input_len >
#: max_total_num_tokens``, ``prepare_abort`` with 400); a smaller one waits for pages instead
EXCEEDS_POOL = (400, "prompt_exceeds_kv_pool")
#: The replay's bound on one request's pages on a node (its KV row: prompt and output), 2^22
#: pages (32 MiB an array; at page size 1 four times the incident's context window). A request
#: beyond it, or an allocation past the distinct pages a node's pool may hand out (pool.TOUCHED_BOUND), is
#: not replayed page by page: the replay follows the logs there and lists a
#: ``beyond_replay_bound`` disagreement (the time and memory a replay takes stay bounded whatever
#: counts a log states, up to the 2^40 the ingest accepts).
MAX_REQUEST_PAGES = 2**22
#: Runs of decode steps a process takes through the kernel's interpreted twin before the compiled
#: kernel (replay/steps.py): a small replay (the sample's) compiles nothing; both give the same
#: pages. Counted over the process, not a node: a case of thousands of small nodes runs compiled.
KERNEL_FROM = 2_000
_RUNS = itertools.count(1)
COVERAGE_MISMATCH = (500, "kv_coverage_mismatch")
TAG_MISMATCH = (500, "kv_tag_mismatch")
DECODE_TIMEOUT = (504, "transfer_timeout")


def load_kernel() -> None:
    """Load the compiled step kernel now and take it from the next run on, whatever the count: a
    replay's fork server does, before it forks the workers (replay/preload.py)."""
    global _RUNS
    none = np.zeros(1, np.int64)
    kernel.run(none, none.copy(), 1, 0, 0, 0, 0, none.copy(), none.copy())
    _RUNS = itertools.count(KERNEL_FROM + 1)


@dataclass(frozen=True)
class NodeConfig:
    """A node's serving configuration, as its ``config`` record states it."""

    node: str
    role: str
    context_length: int
    page_size: int
    pool_pages: int
    engine: str = "sglang"
    engine_version: str = "0.5.21"
    model: str = "glm-5.3"
    #: decode: the overlap scheduler (SGLang's default on decode; a v1 config record does not say,
    #: docs/schema-v1.1.md): a finishing request gets one more slot before its row is freed
    overlap_schedule: bool = True
    #: the prefix (radix) cache, where the config record says (v1.1; None: not said, and SGLang's
    #: default applies: :attr:`caches_prefixes`). On prefill, a prompt's full pages then stay cached
    #: after its transfer (:mod:`replay.radix`); off, they are freed at its end (reference-engine.md, point 4)
    prefix_cache: bool | None = None
    #: which of those (v1.1's fields) the node's config record stated; the others are assumed
    said: tuple[str, ...] = ()
    #: decode: speculative decoding (v1.1; SGLang's ``speculative_algorithm`` set): each step takes
    #: several KV slots a request and frees the drafts rejected, which the replay does not model
    speculative_decoding: bool | None = None
    #: decode: the KV offloaded to host storage as a request decodes (v1.1; SGLang's
    #: ``disaggregation_decode_enable_offload_kvcache``): a finished request's pages are freed once
    #: the copies are done, not at its finish, which the replay does not model
    kv_offload: bool | None = None
    #: the KV pool is not the plain paged allocator the replay models (v1.1): SGLang's hybrid
    #: sliding-window pools (``SWATokenToKVPoolAllocator``: full and sliding-window layers' pages in
    #: pools of their own) or its unified memory pool (virtual token ids); not modelled
    hybrid_pool: bool | None = None
    #: each request also holds a recurrent-state slot, handed over with its pages (v1.1; SGLang's
    #: Mamba cache, a hybrid linear-attention model): its pages are the plain allocator's, the
    #: slots are not followed
    recurrent_state: bool | None = None
    #: decode: steps between two of the node's ``step`` records (v1.1; SGLang's
    #: ``decode_log_interval``); None: the config does not say (a step record without ``steps``
    #: then counts nothing the replay can use)
    step_log_interval: int | None = None

    @property
    def pool_tokens(self) -> int:
        """Tokens the pool holds, page 0 (reserved) left out."""
        return (self.pool_pages - 1) * self.page_size

    @property
    def caches_prefixes(self) -> bool:
        """Whether the node keeps prompts in a prefix cache: as its config says, else SGLang's
        default (on for prefill, off for decode; reference-engine.md points 4 and 6)."""
        if self.prefix_cache is not None:
            return self.prefix_cache
        return self.engine == "sglang" and self.role == "prefill"

    @property
    def max_req_input_len(self) -> int:
        """SGLang's ``max_req_input_len``: prefill rejects a prompt of this many tokens or more."""
        return min(self.context_length - 1, self.pool_tokens - 1) - 5

    def record(self, ts: str, boot: int = 0) -> dict[str, Any]:
        """The node's config record."""
        return {
            "kind": "config", "ts": ts, "node": self.node, "boot": boot, "role": self.role,
            "engine": self.engine, "engine_version": self.engine_version, "model": self.model,
            "context_length": self.context_length, "page_size": self.page_size,
            "pool_pages": self.pool_pages,
            # (v1.1, docs/schema-v1.1.md: written where they are not the engine's default or were said)
            **({"overlap_schedule": False} if not self.overlap_schedule else {}),
            **({"prefix_cache": self.prefix_cache} if self.prefix_cache is not None else {}),
            **({"speculative_decoding": self.speculative_decoding} if self.speculative_decoding is not None else {}),
            **({"kv_offload": self.kv_offload} if self.kv_offload is not None else {}),
            **({"hybrid_pool": self.hybrid_pool} if self.hybrid_pool is not None else {}),
            **({"recurrent_state": self.recurrent_state} if self.recurrent_state is not None else {}),
            **({"step_log_interval": self.step_log_interval} if self.step_log_interval is not None else {}),
        }


@dataclass(frozen=True)
class Request:
    """What the router knows of a request when it arrives."""

    request_id: str
    tenant_id: str
    prompt_tokens: int
    max_new_tokens: int
    prefill_node: str | None
    decode_node: str | None
    output_tokens: int | None = None  # as logged at its finish, where known

    @property
    def outputs(self) -> int:
        """The tokens it outputs: as logged, else ``max_new_tokens``."""
        return self.max_new_tokens if self.output_tokens is None else self.output_tokens


@dataclass(frozen=True)
class Plan:
    """The cross-node decisions for one request under one behaviour and configuration."""

    router_rejects: bool  # prompt_tokens >= context_length
    over_long: bool  # max_req_input_len <= prompt_tokens < context_length (validate_input_length)
    prefill_rejects: bool  # over-long under sglang-hardened: nothing allocated anywhere
    kv_tokens: int  # KV tokens the transfer carries (1 for the placeholder)
    limit_tokens: int  # the prefill node's max_req_input_len
    context_length: int  # the window the router enforces


def plan(request: Request, behaviour: str, prefill: NodeConfig) -> Plan:
    """Decide what the router and the prefill node do with ``request``."""
    router_rejects = request.prompt_tokens >= prefill.context_length
    over_long = not router_rejects and request.prompt_tokens >= prefill.max_req_input_len
    hardened = behaviour == "sglang-hardened"
    return Plan(
        router_rejects=router_rejects,
        over_long=over_long,
        prefill_rejects=over_long and hardened,
        kv_tokens=1 if over_long else request.prompt_tokens,
        limit_tokens=prefill.max_req_input_len,
        context_length=prefill.context_length,
    )


@dataclass(frozen=True)
class Disagreement:
    """Where the model could not do what the logs say happened: the request, the node, what
    (a kind of :data:`DISAGREEMENTS`), and the detail. Confirmation follows the logs there."""

    request_id: str
    node: str
    kind: str
    detail: str

    def as_dict(self) -> dict[str, str]:
        """As JSON-ready data."""
        return {"request_id": self.request_id, "node": self.node, "kind": self.kind, "detail": self.detail}


#: The kinds of disagreement between the model and the logs, and what each means.
DISAGREEMENTS = {
    "pool_cannot_supply": "the pool could not supply the pages of a request the logs show served",
    "model_fails_served": "the model would fail a request the logs show served",
    "model_rejects_served": "the model would reject a request the logs show admitted",
    "model_admits_rejected": "the model would admit a request the logs show rejected",
    "model_outcome_differs": "the replay, following the logs, still answers a request otherwise than they do",
    "steps_differ": "a request's decode steps fit no lockstep schedule of the node's logged order and outputs",
    "prefix_not_cached": "a prompt the logs say took tokens from the prefix cache finds no cached prompt that long "
                         "in the replay: it computes every page",
    "step_record_differs": "a decode node's step record (its own count of decode steps and its running batch) "
                           "does not fit the steps the replay ran there",
    "decode_prefix_cache": "a decode node's config says it keeps prompts in a prefix (radix) cache (SGLang's "
                           "--disaggregation-decode-enable-radix-cache), which the replay does not model: its pages "
                           "there are one layout of several, and the victims named on that node are possible",
    "speculative_decoding": "a decode node's config says it runs speculative decoding (SGLang's "
                            "--speculative-algorithm: several KV slots a request a step, the rejected drafts freed), "
                            "which the replay does not model: the victims named on that node are possible",
    "decode_kv_offload": "a decode node's config says it offloads each request's KV to host storage as it decodes "
                         "(SGLang's --disaggregation-decode-enable-offload-kvcache: a finished request's pages freed "
                         "once the copies are done, before 0.5.18 chunks of them during its decode), which the replay "
                         "does not model: the victims named on that node are possible",
    "decode_hybrid_pool": "a decode node's config says its KV pool is not the plain paged one the replay models "
                          "(SGLang's hybrid sliding-window pools, SWATokenToKVPoolAllocator, or its unified memory "
                          "pool, --enable-unified-memory): its pages there are one layout of several, and the victims "
                          "named on that node are possible",
    "decode_retracted": "SGLang's decode retracted running requests under memory pressure (a finish says how many "
                        "times: SGLang's num_retractions; the scheduler's line says when: \"KV cache pool is full. "
                        "Retract requests.\"): their pages were freed and their KV restored into pages taken afresh "
                        "later, which the replay does not model: on that node, the victims of a reader that took its "
                        "pages from the first retraction on (its line, or the retracted request's join of the batch) "
                        "are possible and, unless too many to list (the job then says so), every request whose data "
                        "may have been in the node's pool then is named beside them as a possible victim (readers "
                        "that took their pages before it keep their certainty)",
    "flush_not_idle": "a node's caches were flushed (SGLang's flush_cache, which only an idle node does) while the "
                      "replay still held the request's pages there: it lets them go at the flush",
    "beyond_replay_bound": "the request's pages are beyond the replay's bounds (2^22 pages a request, 2^25 distinct "
                           "pages a node's pool hands out): it is not replayed page by page there",
}


# -- what a disagreement says (the compiled decode node, replay/decode_fast.py, words its own alike) --

def prompt_beyond_pool(tokens: int, pool_tokens: int) -> str:
    """``pool_cannot_supply``: a prompt larger than decode's whole pool."""
    return f"a prompt of {tokens} tokens, a pool of {pool_tokens}"


def pages_short(need: int, free: int) -> str:
    """``pool_cannot_supply``: a prompt's pages more than the pool has free."""
    return f"{need} pages wanted, {free} free"


def step_starved(need: int, free: int) -> str:
    """``pool_cannot_supply``: a decode step's new pages more than the pool has free."""
    return f"a decode step wanted {need} pages, {free} free"


def prompt_beyond_bound(tokens: int, need: int) -> str:
    """``beyond_replay_bound``: a prompt of more pages than the replay follows."""
    return f"a prompt of {tokens:,} tokens, {need:,} pages"


def row_beyond_bound(outputs: int, row: int) -> str:
    """``beyond_replay_bound``: a request whose row (prompt and outputs) is more pages than the replay follows."""
    return f"{outputs:,} tokens output, a row of {row:,} pages: its decode steps are not replayed"


def meaning(kind: str) -> str:
    """What a kind of disagreement means (:data:`DISAGREEMENTS`), a kind a later version wrote too."""
    return DISAGREEMENTS.get(kind, "a disagreement of a kind this version does not know")


@dataclass
class _Held:
    """A request's pages on a node."""

    prompt: Pages | None = None  # decode: the preallocation; prefill: the computed pages
    steps: list[Pages] = field(default_factory=list)  # decode: output pages, as the steps took them
    tokens: int = 0  # decode: the KV slots of its row (prompt, then a slot a step)
    allocs_left: int = 0  # decode: steps still to give it a slot (0: not, or no longer, decoding)
    allocs: int = 0  # decode: the steps it takes part in, from its first
    #: decode: the prompt's last page where its first step's slot falls and its transfer wrote
    #: nothing (a placeholder's): that step writes it, its version the request's from then on
    first_write: Pages | None = None
    #: prefill, prefix cache on: the pages the prompt took from the cache, and the cached node it
    #: holds locked (the one its match ended on, then its own from its forward on)
    shared: Pages | None = None
    node: Node | None = None
    inserted: bool = False
    ended: bool = False  # the engine ended the request on this node
    reading: bool = False  # decode: attending its pages (from decode_started)
    released: bool = False

    def pages(self) -> list[Pages]:
        """Every page array it holds, in row order (a prefill's shared prefix not among them)."""
        return ([self.prompt] if self.prompt is not None else []) + self.steps


@dataclass
class NodeEngine:
    """One node's pool and the engine behaviour acting on that node's events."""

    config: NodeConfig
    behaviour: str
    log: LogSet
    requests: dict[str, Request]
    plans: dict[str, Plan]
    check_invariants: bool = False
    boot: int = 0
    #: confirmation: the requests the logs show served; where the model would end one, it is
    #: listed in ``disagreements`` and the logs are followed instead (None: the model decides)
    served: AbstractSet[str] | None = None
    disagreements: list[Disagreement] = field(default_factory=list)
    #: decode steps that found too few free pages (SGLang would retract a request; not modelled)
    starved_steps: int = 0
    #: a decode step of this boot went past the replay's bound on pages handed out (listed once)
    bounded: bool = False
    #: the node's caches flushed (SGLang's flush_cache): its pool started afresh this many times
    flushes: int = 0
    #: confirmation, decode: requests the logs show served that started decoding here holding no
    #: pages in the replay (its pool could not supply them, or past its bounds; each listed as a
    #: disagreement) although their transfer carried fewer pages than their prompt: they read pages
    #: they did not write, whose content the replay cannot name
    unsupplied: list[str] = field(default_factory=list)
    pool: PagePool = field(init=False)
    held: dict[str, _Held] = field(init=False)
    #: decode: the running batch, in the order its requests joined
    batch: list[str] = field(init=False)
    tags: np.ndarray = field(init=False)
    tag_ids: dict[str, int] = field(init=False)
    #: prefill with the prefix cache on: the cached prompts (None: pages freed at the transfer's end)
    cache: PrefixCache | None = field(init=False)

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise ValueError(f"unknown engine {self.behaviour!r}; one of {', '.join(BEHAVIOURS)}")
        self.tag_ids = {}
        self._next_tag = 0
        self._texts: dict[int, tuple[Pages, str]] = {}
        self._guessed = 0
        self.cache = None
        self.start_boot(self.boot, self.config)

    # -- state -------------------------------------------------------------------------

    def start_boot(self, boot: int, config: NodeConfig) -> None:
        """A new process lifetime: a fresh pool, nothing held, nothing written."""
        self.boot = boot
        self.config = config
        self.pool = PagePool(config.pool_pages)
        self.bounded = False
        self.held = {}
        #: the requests given their prompt's pages and not yet found released or ended: what
        #: :meth:`preallocation` counts (``held``, in a simulation, keeps every request it saw)
        self._prompted: dict[str, _Held] = {}
        self.batch = []
        self.tags = np.full(0, -1, dtype=np.int64)
        self._guessed = self.prefix_guesses  # (the boots before: the new one starts a cache of its own)
        self.cache = PrefixCache(config.page_size) if config.role == "prefill" and config.caches_prefixes else None

    def holding(self) -> list[str]:
        """The requests that hold pages of the pool now, or still decode: what keeps SGLang from
        flushing the node's caches (``is_fully_idle``)."""
        return [rid for rid, h in self.held.items()
                if not h.released and not h.ended and (h.prompt is not None or h.steps or h.allocs_left > 0)]

    def flush(self, ts: str) -> None:
        """SGLang's ``flush_cache`` (docs/schema-v1.1.md, "A cache flush"): the prefix cache's
        prompts let go (their pages freed by the requests that wrote them), then the pool as at the
        boot's start (the allocator's ``clear``: the free list ``1..n-1`` sorted, nothing released),
        the pages' contents left as they are (never zeroed). SGLang flushes only an idle node; a
        request the replay still holds pages for (:meth:`holding`: the caller lists it) frees them
        here and holds none from here on."""
        for rid in self.holding():
            h = self.held[rid]
            h.allocs_left = 0
            self._free(ts, rid)
        if self.cache is not None:
            for node in self.cache.evict(1 << 62):
                self._kv(ts, node.owner, "free", node.pages, text=page_text(node.pages))
            self._guessed += self.cache.guessed
            self.cache = PrefixCache(self.config.page_size)
        self.batch = []
        self._prompted = {}
        self.pool = PagePool(self.config.pool_pages)
        self.flushes += 1

    @property
    def prefix_guesses(self) -> int:
        """Prefix-cache hits whose cached prompt the logs leave to a guess, over the node's boots."""
        return self._guessed + (self.cache.guessed if self.cache is not None else 0)

    def forget(self, rid: str) -> None:
        """Let go of what the node holds of ``rid`` once none of its events is left to come: a
        replay keeps state only for the requests in flight. (Its pages stay where they are: the
        pool and the page tags are the node's, not the request's.)"""
        h = self.held.pop(rid, None)
        self._prompted.pop(rid, None)
        if h is not None:
            for p in h.pages():
                self._texts.pop(id(p), None)
            if h.allocs:
                self._leave(rid)
        self.tag_ids.pop(rid, None)

    def page_tags(self) -> np.ndarray:
        """Each page's tag (-1: none written), over the pages allocated so far (grown as the pool
        hands out pages it never had, so it follows the pages used, not the pool's size)."""
        if len(self.tags) < self.pool.fresh:
            grown = np.full(max(self.pool.fresh, 2 * len(self.tags)), -1, dtype=np.int64)
            grown[:len(self.tags)] = self.tags
            self.tags = grown
        return self.tags

    def check(self) -> None:
        """The allocator invariant over what every request and the prefix cache hold now."""
        held: list[Pages] = []
        for h in self.held.values():
            if not h.released:
                held.extend(h.pages() if not h.inserted or h.prompt is None else [h.prompt[self._full(h):]])
        if self.cache is not None:
            held.extend(self.cache.held())
        self.pool.check(held)

    # -- emitting ------------------------------------------------------------------------

    def _emit(self, record: dict[str, Any]) -> None:
        if record.pop("implied", False):  # a transfer end no node logged: it acts, it is not logged
            return
        record["node"] = self.config.node
        record["boot"] = self.boot
        self.log.emit(record)

    def step_record(self, ts: str, running: int) -> None:
        """Decode: the node's ``step`` record at ``ts`` (v1.1): ``running`` requests in the batch of
        the step it reports (its steps since the last: the config's ``step_log_interval``)."""
        self._emit({"kind": "step", "ts": ts, "running": running})

    def _text(self, pages: Pages) -> str:
        """The page string of ``pages``, computed once per array a request holds."""
        hit = self._texts.get(id(pages))
        if hit is not None and hit[0] is pages:
            return hit[1]
        text = page_text(pages)
        self._texts[id(pages)] = (pages, text)
        return text

    def _kv(self, ts: str, rid: str, op: str, pages: Pages, source: str | None = None,
            text: str | None = None) -> None:
        self.log.emit_kv(self.config.node, self.boot, ts, rid, op, text or self._text(pages), source)
        if op == "write" and self.behaviour == "page-tags":  # (only page tags read them)
            tag = self.tag_ids.get(rid)
            if tag is None:
                tag = self.tag_ids[rid] = self._next_tag
                self._next_tag += 1
            self.page_tags()[pages] = tag

    def _finish(self, ts: str, rid: str, outcome: tuple[int, str]) -> None:
        status, reason = outcome
        self._emit({"kind": "request", "ts": ts, "request_id": rid, "event": "finished",
                    "status": status, "finish_reason": reason, "output_tokens": 0})

    def _free(self, ts: str, rid: str) -> None:
        h = self.held.get(rid)
        if h is None or h.released:
            return
        if self.cache is not None:
            self._uncache(ts, rid, h)
            return
        pages = [p for p in h.pages() if len(p)]
        h.released = True
        if h.allocs:
            self._leave(rid)
        for p in pages:
            self._texts.pop(id(p), None)
        if pages:
            every = pages[0] if len(pages) == 1 else np.concatenate(pages)
            self._kv(ts, rid, "free", every, text=page_text(every) if len(pages) > 1 else None)
            self.pool.release(every)

    # -- events ----------------------------------------------------------------------------

    def handle(self, record: dict[str, Any]) -> bool:
        """Act on one event of this node; whether the request goes on past it."""
        kind = record["kind"]
        rid = record.get("request_id")
        if rid is None or kind not in ("request", "transfer"):
            self._emit(record)
            return True
        p = self.plans.get(rid)
        if p is None:  # a request the router never logged: carried through untouched
            self._emit(record)
            return True
        role = self.config.role
        if role == "router":
            return self._router(record, p)
        if p.router_rejects:
            return False
        if role == "prefill":
            done = self._prefill(record, rid, p)
        else:
            done = self._decode(record, rid, p)
        if self.check_invariants:
            self.check()
        return done

    def _router(self, record: dict[str, Any], p: Plan) -> bool:
        received = record["kind"] == "request" and record["event"] == "received"
        if p.router_rejects and not received:
            return False  # the router's own rejection was emitted at received
        self._emit(record)
        if received and p.router_rejects:
            ts, rid = record["ts"], record["request_id"]
            self._emit({"kind": "request", "ts": ts, "request_id": rid, "event": "rejected",
                        "reason": ROUTER_REJECT[1], "limit_tokens": p.context_length})
            self._finish(ts, rid, ROUTER_REJECT)
            return False
        return True

    def _prefill(self, record: dict[str, Any], rid: str, p: Plan) -> bool:
        ts, event = record["ts"], record["event"]
        h = self.held.setdefault(rid, _Held())
        if h.ended:
            return False
        if record["kind"] == "request":
            if event == "rejected" and p.over_long:
                if not p.prefill_rejects:
                    return True  # the placeholder's rejection is emitted at prefill_started
                self._reject_over_long(ts, rid, p)
                h.ended = True
                self._finish(ts, rid, PREFILL_REJECT)
                return False
            if p.prefill_rejects:
                return False
            if event == "prefill_started":
                if p.over_long:
                    self._reject_over_long(ts, rid, p)
                if self.cache is not None:
                    return self._take_cached_prompt(record, rid, h, p)
                # the pool may be short for prompts overlapping on prefill, or a smaller what-if pool
                return self._take_prompt_pages(record, h, p.kv_tokens, log_rejection=False)
            self._emit(record)
            if event == "prefill_done" and h.prompt is not None:
                self._kv(ts, rid, "write", h.prompt, "compute")
                if self.cache is not None and not h.inserted:
                    self._insert(rid, h)
            return True
        if p.prefill_rejects:
            return False
        record = dict(record, tokens=p.kv_tokens)
        if h.prompt is not None:
            record["src_pages"] = (self._text(h.prompt) if h.shared is None or not len(h.shared)
                                   else page_text(np.concatenate([h.shared, h.prompt])))
        record.pop("dst_pages", None)
        self._emit(record)
        if event in ("completed", "failed"):
            self._free(ts, rid)
        return True

    def _disagrees(self, rid: str, kind: str, detail: str) -> bool:
        """Whether the logs are followed where the model would end ``rid`` (confirmation of a
        request the logs show served): then the disagreement is listed."""
        if self.served is None or rid not in self.served:
            return False
        self.disagreements.append(Disagreement(rid, self.config.node, kind, detail))
        return True

    def preallocation(self, rid: str) -> str:
        """Decode: what admitting ``rid`` now would do with its prompt's pages: ``"take"`` them,
        ``"wait"`` in the preallocation queue (SGLang keeps it queued, first come first served,
        until pages are freed) or ``"refuse"`` it (more than the whole pool holds: SGLang aborts
        it with 400).

        SGLang's admission budget (disaggregation/decode.py, ``pop_preallocated`` with
        ``_allocatable_tokens``, 0.5.11; ``_allocatable_token_budgets`` and
        ``_required_admission_tokens``, 0.5.23): the free tokens, less
        :data:`RESERVED_DECODE_TOKENS` for each request preallocated or running (or, if more,
        what the longest running request could still need were the others retracted), must hold
        the prompt and that reserve, and its own possible output beyond what retraction frees."""
        request = self.requests[rid]
        tokens = request.prompt_tokens
        if tokens > self.config.pool_tokens:
            return "refuse"
        running = [self.held[x] for x in self.batch]
        retractable = sum(h.tokens for h in running)
        done = [x for x, h in self._prompted.items() if h.released or h.ended]
        for x in done:  # (neither is ever undone: the set keeps only requests still active)
            del self._prompted[x]
        active = len(self._prompted)
        single = max((min(self.requests[x].max_new_tokens, CLIP_MAX_NEW_TOKENS) + self.requests[x].prompt_tokens
                      - retractable for x in self.batch), default=0)
        allocatable = self.pool.available * self.config.page_size - max(RESERVED_DECODE_TOKENS * active, single)
        required = max(tokens + RESERVED_DECODE_TOKENS,
                       tokens + min(request.max_new_tokens, CLIP_MAX_NEW_TOKENS) - retractable)
        return "take" if required <= allocatable else "wait"

    def _take_prompt_pages(self, record: dict[str, Any], h: _Held, tokens: int, *, log_rejection: bool) -> bool:
        """Emit ``record`` and allocate the pages of a prompt of ``tokens`` tokens; or end the
        request instead: with 400 where decode's whole pool is smaller than the prompt, with 503
        where the pool cannot supply them now (decode also logs a ``rejected``). (SGLang's decode
        makes such a request wait; the simulator does so before it admits it, and a replay, which
        keeps the logged times, turns it away.) Confirming a request the logs show served, the logs
        are followed: it goes on holding no pages."""
        ts, rid = record["ts"], record["request_id"]
        need = pages_for(tokens, self.config.page_size)
        if need > MAX_REQUEST_PAGES:
            return self._beyond(record, h, prompt_beyond_bound(tokens, need))
        if log_rejection and tokens > self.config.pool_tokens:
            if self._disagrees(rid, "pool_cannot_supply", prompt_beyond_pool(tokens, self.config.pool_tokens)):
                self._emit(record)
                return True
            h.ended = True
            self._emit({"kind": "request", "ts": ts, "request_id": rid, "event": "rejected",
                        "reason": EXCEEDS_POOL[1], "limit_tokens": self.config.pool_tokens})
            self._finish(ts, rid, EXCEEDS_POOL)
            return False
        if need > self.pool.available and self._disagrees(rid, "pool_cannot_supply",
                                                          pages_short(need, self.pool.available)):
            self._emit(record)
            return True
        if need > self.pool.available:
            h.ended = True
            if log_rejection:
                self._emit({"kind": "request", "ts": ts, "request_id": rid, "event": "rejected",
                            "reason": POOL_EXHAUSTED[1]})
            self._finish(ts, rid, POOL_EXHAUSTED)
            return False
        try:
            prompt = self._alloc_prompt(need, tokens)
        except BeyondBound as e:
            return self._beyond(record, h, str(e))
        self._emit(record)
        h.prompt = prompt
        self._prompted[rid] = h
        self._kv(ts, rid, "alloc", h.prompt)
        return True

    # -- prefill's prefix cache (replay/radix.py) -----------------------------------------------

    def _take_cached_prompt(self, record: dict[str, Any], rid: str, h: _Held, p: Plan) -> bool:
        """Prefill with the prefix cache on: the prompt's first ``cached_tokens`` (as logged) shared
        from the cache, its path locked; the rest allocated as :meth:`_take_prompt_pages` does, after
        the cache evicts least-recently-used prompts if the free pages are short."""
        assert self.cache is not None
        page_size = self.config.page_size
        cached = 0 if p.over_long else int(record.get("cached_tokens") or 0)
        request = self.requests.get(rid)
        node, shared = self.cache.match(min(cached, p.kv_tokens - 1), request.tenant_id if request else None)
        if cached >= page_size and node is None:
            self.disagreements.append(Disagreement(rid, self.config.node, "prefix_not_cached", f"{cached:,} tokens "
                                                   "logged as cached, none cached that long in the replay"))
        self.cache.lock(node)
        h.node, h.shared = node, shared
        tokens = p.kv_tokens - len(shared) * page_size  # (its own: the match is whole pages)
        need = pages_for(tokens, page_size)
        if need <= MAX_REQUEST_PAGES:  # (SGLang asks room for a page more a request at page size > 1)
            self._evict(record["ts"], tokens + (page_size if page_size > 1 else 0))
        done = self._take_prompt_pages(record, h, tokens, log_rejection=False)
        if h.prompt is None:  # ended, or past the bounds: nothing of it stays locked
            self.cache.unlock(node)
            h.node = h.shared = None
            return done
        h.tokens = tokens
        if len(shared):
            self._kv(record["ts"], rid, "share", shared, text=page_text(shared))
        return done

    def _evict(self, ts: str, tokens: int) -> None:
        """Make room for an allocation of ``tokens`` tokens: the cache evicts what the pool lacks
        (0.5.18 on) or the whole amount (before), its prompts' pages freed by the requests that
        wrote them."""
        assert self.cache is not None
        asked = evict_tokens(tokens, self.pool.available * self.config.page_size,
                             evicts_whole(self.config.engine_version))
        for node in self.cache.evict(asked) if asked else ():
            self._kv(ts, node.owner, "free", node.pages, text=page_text(node.pages))
            self.pool.release(node.pages)

    def _full(self, h: _Held) -> int:
        """Of a prefill's own pages, the full ones (the cache keeps them; a partly filled last is freed)."""
        return h.tokens // self.config.page_size

    def _insert(self, rid: str, h: _Held) -> None:
        """After the prompt's forward: its own full pages cached under its match, its lock moved there."""
        assert self.cache is not None and h.prompt is not None
        request = self.requests.get(rid)
        node = self.cache.insert(h.node, h.prompt[:self._full(h)], rid, request.tenant_id if request else None)
        self.cache.lock(node)
        self.cache.unlock(h.node)
        h.node, h.inserted = node, True

    def _uncache(self, ts: str, rid: str, h: _Held) -> None:
        """The transfer's end (or the request's): what the cache does not keep is freed, the lock let go."""
        assert self.cache is not None
        h.released = True
        keep = self._full(h) if h.inserted and h.prompt is not None else 0
        if h.shared is not None and len(h.shared):  # (its hold on the shared prefix; the cache keeps the pages)
            self._kv(ts, rid, "free", h.shared, text=page_text(h.shared))
        if h.prompt is not None and len(h.prompt) > keep:
            rest = h.prompt[keep:]
            self._kv(ts, rid, "free", rest, text=page_text(rest) if keep else None)
            self.pool.release(rest)
        self.cache.touch(h.node)
        self.cache.unlock(h.node)
        h.node = None

    def _beyond(self, record: dict[str, Any], h: _Held, detail: str) -> bool:
        """Past the replay's bounds: ``record`` goes on as logged, its request holding no pages
        here, and the disagreement is listed (in a what-if too: it is the replay's limit, not the
        model's answer)."""
        self.disagreements.append(Disagreement(record["request_id"], self.config.node, "beyond_replay_bound", detail))
        self._emit(record)
        return not h.ended

    def _alloc_prompt(self, need: int, tokens: int) -> Pages:
        """A prompt's ``need`` pages for its ``tokens`` (known to be available) as SGLang takes
        them: one request's ``alloc_extend`` at page size > 1, the token allocator's ``alloc`` at
        page size 1."""
        page_size = self.config.page_size
        if page_size == 1:
            return self.pool.alloc(need)
        got = self.pool.alloc_extend([need], tokens, page_size)
        assert got is not None, "the pages were available"
        return got[0]

    def _reject_over_long(self, ts: str, rid: str, p: Plan) -> None:
        self._emit({"kind": "request", "ts": ts, "request_id": rid, "event": "rejected",
                    "reason": PREFILL_REJECT[1], "limit_tokens": p.limit_tokens})

    def _decode(self, record: dict[str, Any], rid: str, p: Plan) -> bool:
        if p.prefill_rejects:
            return False
        ts, event = record["ts"], record["event"]
        h = self.held.setdefault(rid, _Held())
        page_size = self.config.page_size
        if record["kind"] == "transfer":
            # The transfer lands whether or not the request still holds its pages.
            if event != "completed" or h.prompt is None:
                if not h.ended:
                    self._emit(record)
                return not h.ended
            n = pages_for(p.kv_tokens, page_size)
            landed = h.prompt if n >= len(h.prompt) else h.prompt[:n]
            text = self._text(landed) if landed is h.prompt else page_text(landed)
            record = dict(record, tokens=p.kv_tokens, dst_pages=text)
            record.pop("src_pages", None)
            self._emit(record)
            self._kv(ts, rid, "write", landed, "transfer", text)
            if self.behaviour == "page-tags":
                self._fail_retagged_readers(ts, rid)
            return not h.ended
        if h.ended:
            return False
        if event == "admitted":
            return self._take_prompt_pages(record, h, self.requests[rid].prompt_tokens, log_rejection=True)
        if event == "decode_started" and h.prompt is not None:
            return self._decode_start(record, rid, p, h)
        if event == "decode_started" and self.served is not None and rid in self.served and \
                pages_for(p.kv_tokens, page_size) < pages_for(self.requests[rid].prompt_tokens, page_size):
            self.unsupplied.append(rid)
        self._emit(record)
        if event in ("finished", "rejected"):  # as logged: later logged events still apply
            self._free(ts, rid)
            return False
        return True

    def _decode_start(self, record: dict[str, Any], rid: str, p: Plan, h: _Held) -> bool:
        """Decode's first step: the request reads its preallocated pages and joins the running
        batch at its end, to take a slot a step from then on (:meth:`advance`)."""
        ts = record["ts"]
        request = self.requests[rid]
        assert h.prompt is not None
        failure = None
        if self.behaviour == "coverage-check" and p.kv_tokens < request.prompt_tokens:
            failure = COVERAGE_MISMATCH
        elif self.behaviour == "page-tags":
            tag = self.tag_ids.get(rid, -2)
            if not bool(np.all(self.page_tags()[h.prompt] == tag)):
                failure = TAG_MISMATCH
        if failure is not None and self._disagrees(rid, "model_fails_served", f"{failure[0]} {failure[1]}"):
            failure = None
        if failure is not None:
            self._finish(ts, rid, failure)
            self._free(ts, rid)
            h.ended = True
            return False
        self._emit(record)
        h.reading = True
        self._kv(ts, rid, "read", h.prompt)
        h.tokens = request.prompt_tokens
        h.allocs = h.allocs_left = decode_steps(request.outputs, self.config.overlap_schedule)
        page_size = self.config.page_size
        last = h.tokens // page_size  # (the page of its first step's slot)
        if h.allocs and h.tokens % page_size and pages_for(p.kv_tokens, page_size) <= last < len(h.prompt):
            h.first_write = h.prompt[last:last + 1]
        row = pages_for(h.tokens + h.allocs, page_size)
        if row > MAX_REQUEST_PAGES:
            self.disagreements.append(Disagreement(rid, self.config.node, "beyond_replay_bound",
                                                   row_beyond_bound(request.outputs, row)))
            h.allocs = h.allocs_left = 0
        if h.allocs:
            self.batch.append(rid)
        return True

    def _leave(self, rid: str) -> None:
        if rid in self.batch:
            self.batch.remove(rid)

    def decoding(self) -> list[tuple[str, _Held]]:
        """The running requests still to take a slot at the next step, in batch order."""
        return [(rid, h) for rid in self.batch if (h := self.held[rid]).allocs_left > 0]

    def remaining(self) -> list[int]:
        """The steps each running request still has to take, in batch order, of those still decoding
        (:meth:`decoding`'s, without the pairs: a node's every event asks for them)."""
        held = self.held
        return [n for rid in self.batch if (n := held[rid].allocs_left) > 0]

    def advance(self, steps: int, when: str | Callable[[int], str]) -> int:
        """Run up to ``steps`` decode steps: each gives every running request still decoding the
        slot of its next token, in batch order (``alloc_decode``; ``alloc`` at page size 1), a
        new page only where the slot starts one. Its pages are logged as allocated, written and
        read by it at the step's time (``when``, or ``when(k)`` for the k-th step of the call).
        Steps run while some request is decoding; how many ran."""
        page_size = self.config.page_size
        if steps > 0:  # a first step into a prompt page the transfer left unwritten writes it
            for rid, h in self.decoding():
                if h.first_write is not None and h.allocs_left == h.allocs:
                    self._kv(when if isinstance(when, str) else when(0), rid, "write", h.first_write, "decode",
                             str(int(h.first_write[0])))  # (its text given: nothing cached for a page let go)
                    h.first_write = None
        ran = 0
        while ran < steps:
            rows = self.decoding()
            if not rows:
                break
            if page_size > 1 and (len(rows) <= self.pool.free_count or not self.pool.released_count):
                # steps where no row starts a page and the pool does nothing (no merge): slots only, as
                # the kernel takes them, without its arrays (a third of the runs at 25,000 requests)
                quiet = min(steps - ran, min(h.allocs_left for _, h in rows),
                            min(-h.tokens % page_size for _, h in rows))
                if quiet == steps - ran:
                    for _, h in rows:
                        h.tokens += quiet
                        h.allocs_left -= quiet
                    ran += quiet
                    continue
            done, blocked = self._run(steps - ran, ran, rows, when)
            ran += done
            if not blocked:
                continue
            # the pool must do more than hand out free pages (merge, too few, the bound): a step here
            rows = self.decoding()
            # steps where no row starts a page only take slots (and may merge the lists)
            quiet = min(steps - ran, min(h.allocs_left for _, h in rows),
                        min(-h.tokens % page_size for _, h in rows) if page_size > 1 else 0)
            if quiet:
                self.pool.alloc_decode(0, len(rows))  # (a step without a new page still may merge)
                for _, h in rows:
                    h.tokens += quiet
                    h.allocs_left -= quiet
                ran += quiet
                continue
            self._step(when if isinstance(when, str) else when(ran), rows)
            ran += 1
        return ran

    def _run(self, steps: int, first: int, rows: list[tuple[str, _Held]], when: str | Callable[[int], str]
             ) -> tuple[int, bool]:
        """Up to ``steps`` decode steps over ``rows`` by the compiled kernel (:mod:`replay.steps`),
        the first of them the ``first``-th of the :meth:`advance` call; how many ran, and whether it
        stopped at a step the pool must do more for than hand out pages from its free list."""
        page_size = self.config.page_size
        lefts = [h.allocs_left for _, h in rows]
        room = sum(min(n, steps) // page_size + 1 for n in lefts)  # (in Python: numpy costs more on a few rows)
        tokens = np.array([h.tokens for _, h in rows], np.int64)
        left = np.array(lefts, np.int64)
        step_of = np.empty(room, np.int64)
        row_of = np.empty(room, np.int64)
        run = kernel.run if compiled.taken(_RUNS, KERNEL_FROM, "steps") else compiled.interpreted(kernel.__name__).run
        ran, taken, status = (int(x) for x in run(tokens, left, page_size, steps, self.pool.free_count,
                                                  self.pool.takeable, self.pool.released_count, step_of, row_of))
        if taken:
            new = self.pool.take(taken)
            stamp, at = -1, ""
            pages: list[tuple[str, str, str]] = []
            for i, (k, r, page) in enumerate(zip(step_of[:taken].tolist(), row_of[:taken].tolist(), new.tolist(),
                                                 strict=True)):
                if k != stamp:
                    stamp, at = k, when if isinstance(when, str) else when(first + k)
                rid, h = rows[r]
                h.steps.append(new[i:i + 1])
                pages.append((at, rid, str(page)))
            if self.behaviour == "page-tags":  # (the pages' tags follow their writes)
                for at, rid, text in pages:
                    one = np.array([int(text)], np.int64)
                    for op, source in (("alloc", None), ("write", "decode"), ("read", None)):
                        self._kv(at, rid, op, one, source, text)
            else:
                self.log.emit_step_pages(self.config.node, self.boot, pages)
        for (_, h), t, n in zip(rows, tokens.tolist(), left.tolist(), strict=True):
            h.tokens = t
            h.allocs_left = n
        return ran, status == kernel.BLOCKED

    def _step(self, ts: str, rows: list[tuple[str, _Held]]) -> None:
        """One decode step with at least one new page."""
        page_size = self.config.page_size
        starts = [h.tokens % page_size == 0 for _, h in rows]
        need = sum(starts)
        try:
            new = self.pool.try_alloc(need) if page_size == 1 else self.pool.alloc_decode(need, len(rows))
        except BeyondBound as e:  # listed once a boot: from here on the node's pages are not SGLang's
            if not self.bounded:
                self.disagreements.append(Disagreement(rows[0][0], self.config.node, "beyond_replay_bound",
                                                       f"a decode step: {e}; the node's later steps are not exact"))
            self.bounded = True
            new = np.empty(0, np.int64)
            starts = [False] * len(starts)
        if new is None:  # SGLang retracts requests here; not modelled: these steps take no page
            self.starved_steps += 1
            self._disagrees(rows[0][0], "pool_cannot_supply", step_starved(need, self.pool.available))
        taken = 0
        for (rid, h), start in zip(rows, starts, strict=True):
            if start and new is not None:
                page = new[taken:taken + 1]
                taken += 1
                h.steps.append(page)
                text = str(int(page[0]))
                self._kv(ts, rid, "alloc", page, text=text)
                self._kv(ts, rid, "write", page, "decode", text)
                self._kv(ts, rid, "read", page, text=text)
            h.tokens += 1
            h.allocs_left -= 1

    def _fail_retagged_readers(self, ts: str, writer: str) -> None:
        """Page tags: a request attending a page another request just wrote fails at its next step."""
        for rid, h in self.held.items():
            if rid == writer or not h.reading or h.ended or h.released:
                continue
            tag = self.tag_ids.get(rid, -2)
            pages = h.pages()
            if any(bool(np.any(self.page_tags()[p] != tag)) for p in pages):
                self._finish(ts, rid, TAG_MISMATCH)
                self._free(ts, rid)
                h.ended = True

    def time_out(self, ts: str, rid: str) -> None:
        """Decode gives up waiting for the transfer: it ends the request and frees its pages."""
        h = self.held.setdefault(rid, _Held())
        if h.ended:
            return
        self._finish(ts, rid, DECODE_TIMEOUT)
        self._free(ts, rid)
        h.ended = True
