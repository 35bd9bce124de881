"""Fixtures recorded from SGLang's own KV-slot allocators, cut out of release wheels and run on CPU torch.

    python3 -m venv /tmp/alloc-venv && /tmp/alloc-venv/bin/pip install torch==2.13.0   # the CPU build
    /tmp/alloc-venv/bin/python scripts/make_sglang_allocator_fixtures.py WHEEL... [--out tests/replay/allocator]

Only this script needs torch; the fixtures it writes are plain JSON, so the tests that hold replay's page pool
to them never import torch. Each wheel (``pip download --no-deps sglang==X``) is opened with zipfile; the
allocator classes (``BaseTokenToKVPoolAllocator``, ``TokenToKVPoolAllocator``, ``PagedTokenToKVPoolAllocator``),
their pure-torch kernel twins (``alloc_extend_naive``, ``alloc_decode_naive``) and the helpers they call
(``get_num_new_pages``, ``next_power_of_2``) are taken by name from the parsed sources and executed, unchanged, in
a namespace whose other names are the stand-ins listed in ``stand_ins``. The allocators are built as a
disaggregated decode node builds them: ``need_sort=True``, ``kvcache=None`` (never touched by alloc/free),
``device="cpu"``, ``dtype=torch.int64``.

Per release, page size (1: the token allocator, 64: the paged one) and seed, five scenarios are run and every call
is recorded with its arguments, the indices it returned, the free list after it and the staged (released, not yet
merged) pages after it: ``calls`` (free-form traffic through every call), ``prefill`` (batches with cached
prefixes), and ``decode-overlap`` / ``decode-no-overlap`` (a scripted decode node, ``DecodeNode``: the loop whose
order replay's engine is held to); and ``flush`` (seed 1 only: the free-form traffic, the allocator's ``clear``, which
SGLang's ``flush_cache`` runs on an idle node, and traffic again). Output:
``<out>/<release>/ps<page_size>-<scenario>-s<seed>.json`` and ``<out>/README.md``; the same wheels give
byte-identical output.
"""

from __future__ import annotations
import __future__

import abc
import argparse
import ast
import hashlib
import json
import random
import re
import typing
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# The filter must precede torch's import: the CPU build warns there that NumPy is absent, which is harmless here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
import torch  # noqa: E402

Json = dict[str, Any]

# The defs cut from a wheel, in the order they are executed (a class after its base, the naive twins before the
# paged class that calls them), and the wheel files searched for them, first hit wins.
CUT_ORDER = (
    "get_num_new_pages",
    "next_power_of_2",
    "BaseTokenToKVPoolAllocator",
    "TokenToKVPoolAllocator",
    "alloc_extend_naive",
    "alloc_decode_naive",
    "PagedTokenToKVPoolAllocator",
)
SOURCE_FILES = (
    "sglang/srt/mem_cache/allocator.py",  # up to 0.5.1x: one module
    "sglang/srt/mem_cache/allocator/base.py",  # from 0.5.2x: a package, one file per strategy
    "sglang/srt/mem_cache/allocator/token.py",
    "sglang/srt/mem_cache/allocator/paged.py",
    "sglang/srt/utils/common.py",
)
KERNEL_FILES = ("sglang/srt/mem_cache/allocator.py", "sglang/kernels/ops/memory/allocator.py")
KERNELS = ("alloc_extend_kernel", "alloc_decode_kernel")
TOKEN_DEFS = ("BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator")
PAGED_DEFS = CUT_ORDER[:3] + CUT_ORDER[4:]

# Pool sizes: small, so that the free list runs short often and the three merge rules all fire.
POOL_PAGES = {1: 600, 64: 48}
SEEDS = (1, 2, 3)
SCENARIOS = ("calls", "prefill", "decode-overlap", "decode-no-overlap", "flush")
MERGE_RULES = ("alloc", "alloc_extend", "alloc_decode")


# ---------------------------------------------------------------------------------------------------------------
# Cutting the allocator out of a wheel


@dataclass(frozen=True)
class CutDef:
    """One top-level def taken from a wheel: where it starts and its exact source text."""

    name: str
    wheel: str
    path: str
    line: int
    source: str
    future_annotations: bool

    def where(self, home_wheel: str) -> str:
        """``path:line``, prefixed with the wheel's file name when the def was borrowed from another wheel."""
        prefix = "" if self.wheel == home_wheel else f"{self.wheel}!"
        return f"{prefix}{self.path}:{self.line}"


@dataclass
class Wheel:
    """A release wheel: its identity, the defs cut from it, and the source of its Triton kernels."""

    release: str
    name: str
    sha256: str
    defs: dict[str, CutDef]
    kernels: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def version(self) -> tuple[int, ...]:
        return tuple(int(part) for part in self.release.split("."))

    @property
    def paged_gates_triton(self) -> bool:
        """Whether the paged allocator itself picks the naive twins when the platform lacks Triton (0.5.23 on)."""
        return "supports_triton" in self.defs["PagedTokenToKVPoolAllocator"].source


def top_level_defs(text: str) -> Iterable[tuple[str, int, str]]:
    """(name, first line, source) of each top-level function and class of a module; decorators excluded."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            segment = ast.get_source_segment(text, node)
            assert segment is not None
            yield node.name, node.lineno, segment


def read_wheel(path: Path) -> Wheel:
    """Open a wheel and cut the allocator defs and the kernels' source out of it."""
    match = re.match(r"sglang-(\d+\.\d+\.\d+)-", path.name)
    if match is None:
        raise SystemExit(f"{path}: not an sglang wheel (expected sglang-X.Y.Z-...whl)")
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    defs: dict[str, CutDef] = {}
    kernels: dict[str, str] = {}
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())
        for member in (m for m in dict.fromkeys(SOURCE_FILES + KERNEL_FILES) if m in names):
            text = wheel.read(member).decode("utf-8")
            future = "from __future__ import annotations" in text
            for name, line, source in top_level_defs(text):
                if member in SOURCE_FILES and name in CUT_ORDER and name not in defs:
                    defs[name] = CutDef(name, path.name, member, line, source, future)
                if member in KERNEL_FILES and name in KERNELS:
                    kernels[name] = source
    missing = [name for name in CUT_ORDER if name not in defs and name != "alloc_decode_naive"]
    if missing or set(kernels) != set(KERNELS):
        raise SystemExit(f"{path.name}: cannot find {missing or sorted(set(KERNELS) - set(kernels))}")
    return Wheel(match.group(1), path.name, sha256, defs, kernels)


def borrow_decode_twin(wheels: Sequence[Wheel]) -> None:
    """Give a wheel without ``alloc_decode_naive`` the newest one that ships it, if their decode kernels agree.

    Up to 0.5.21 the paged allocator launches ``alloc_decode_kernel`` (Triton) and the wheel has no pure-torch
    twin; 0.5.23 ships ``alloc_decode_naive`` as that kernel's twin. The borrowing is only allowed when the
    kernel's source is byte-identical in both wheels.
    """
    donors = sorted((w for w in wheels if "alloc_decode_naive" in w.defs), key=lambda w: w.version)
    for wheel in (w for w in wheels if "alloc_decode_naive" not in w.defs):
        same_kernel = [d for d in donors if d.kernels["alloc_decode_kernel"] == wheel.kernels["alloc_decode_kernel"]]
        if not same_kernel:
            raise SystemExit(f"{wheel.name}: no alloc_decode_naive, and no given wheel has one for the same kernel")
        donor = same_kernel[-1]
        wheel.defs["alloc_decode_naive"] = donor.defs["alloc_decode_naive"]
        wheel.notes.append(
            f"{wheel.release} has no pure-torch twin of alloc_decode_kernel; alloc_decode_naive is borrowed from "
            f"{donor.release} ({donor.name}, sha256 {donor.sha256}), whose alloc_decode_kernel source is "
            f"byte-identical to {wheel.release}'s."
        )


class KernelLaunch:
    """Stand-in for a Triton kernel: accepts the ``kernel[grid](*args)`` launch syntax and calls ``launch``."""

    def __init__(self, launch: Callable[..., None]) -> None:
        self.launch = launch
        self.faulted = False

    def __getitem__(self, grid: object) -> Callable[..., None]:
        return self.launch


def never_launched(name: str) -> KernelLaunch:
    """A kernel the allocator must not reach: with ``supports_triton`` False it takes its naive twin."""

    def launch(*args: object) -> None:
        raise AssertionError(f"{name} launched although current_platform has no Triton")

    return KernelLaunch(launch)


def twin_launch(ns: dict[str, Any], kernel: str) -> KernelLaunch:
    """Route a release's unconditional kernel launch to the kernel's pure-torch twin, argument for argument.

    The launch happens before the allocator checks that the free list is deep enough (0.5.11, 0.5.21); on a short
    list the Triton kernel reads out of bounds and the allocator then returns None, discarding the output. The
    twin may raise there instead: the fault is noted, and ``Recorder`` asserts that the call returned None.
    """
    stand_in: KernelLaunch

    def extend(prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any, out: Any, bs_upper: int,
               page_size: int) -> None:
        try:
            ns["alloc_extend_naive"](prefix_lens, seq_lens, last_loc, free_pages, out, page_size, out.device)
        except (AssertionError, IndexError, RuntimeError):
            stand_in.faulted = True

    def decode(seq_lens: Any, last_loc: Any, free_pages: Any, out: Any, bs_upper: int, page_size: int) -> None:
        num_new_pages = ns["get_num_new_pages"](seq_lens=seq_lens, page_size=page_size, decode=True)
        try:
            ns["alloc_decode_naive"](seq_lens, last_loc, free_pages, out, page_size, num_new_pages)
        except (AssertionError, IndexError, RuntimeError):
            stand_in.faulted = True

    stand_in = KernelLaunch(extend if kernel == "alloc_extend_kernel" else decode)
    return stand_in


def stand_ins(wheel: Wheel) -> dict[str, str]:
    """Every name the cut code finds in its namespace that is not SGLang's, with the reason it is safe."""
    kernels = (
        "bound to a launcher that raises: with supports_triton False the allocator calls the naive twins"
        if wheel.paged_gates_triton
        else "launched unconditionally by this release's allocator; routed to the kernel's pure-torch twin "
        "(alloc_extend_naive / alloc_decode_naive) with the launch's arguments"
    )
    return {
        "current_platform": "capabilities.supports_triton = False: CPU torch has no Triton (read from 0.5.23 on)",
        "get_bool_env_var": "returns False: SGLANG_DEBUG_MEMORY_POOL off, its production default (debug asserts)",
        "is_hip / _is_hip": "False: not ROCm (only gates a torch.unique warm-up on the GPU)",
        "alloc_extend_kernel / alloc_decode_kernel": kernels,
        "torch, abc, typing names": "the real modules; TYPE_CHECKING False, so KVCache is never imported",
    }


def load_allocators(wheel: Wheel) -> dict[str, Any]:
    """Execute the wheel's cut defs, unchanged, in a namespace of their own; return that namespace."""
    ns: dict[str, Any] = {
        "__name__": f"sglang_{wheel.release.replace('.', '_')}_allocator",
        "torch": torch,
        "abc": abc,
        "TYPE_CHECKING": False,
        **{name: getattr(typing, name) for name in ("Any", "Dict", "Hashable", "List", "Optional", "Protocol")},
        "current_platform": SimpleNamespace(capabilities=SimpleNamespace(supports_triton=False)),
        "get_bool_env_var": lambda name, default="false": False,
        "is_hip": lambda: False,
        "_is_hip": False,
    }
    for kernel in KERNELS:
        ns[kernel] = never_launched(kernel) if wheel.paged_gates_triton else twin_launch(ns, kernel)
    for name in CUT_ORDER:
        cut = wheel.defs[name]
        flags = __future__.annotations.compiler_flag if cut.future_annotations else 0
        # Padding keeps the wheel's line numbers in tracebacks.
        code = compile("\n" * (cut.line - 1) + cut.source, f"{cut.wheel}!{cut.path}", "exec", flags=flags,
                       dont_inherit=True)
        exec(code, ns)
    return ns


def new_allocator(ns: dict[str, Any], page_size: int) -> Any:
    """An allocator as a disaggregated node builds it: sorted release list, no KV buffers behind it."""
    if page_size == 1:
        return ns["TokenToKVPoolAllocator"](POOL_PAGES[1], dtype=torch.int64, device="cpu", kvcache=None,
                                            need_sort=True)
    size = POOL_PAGES[page_size] * page_size
    return ns["PagedTokenToKVPoolAllocator"](size, page_size, dtype=torch.int64, device="cpu", kvcache=None,
                                             need_sort=True)


# ---------------------------------------------------------------------------------------------------------------
# Recording calls


def runs(values: Iterable[int]) -> list[list[int]]:
    """``[first, count]`` runs of consecutive ascending values, in the list's order: [5,6,7,100] -> [[5,3],[100,1]]."""
    out: list[list[int]] = []
    for value in values:
        if out and out[-1][0] + out[-1][1] == value:
            out[-1][1] += 1
        else:
            out.append([value, 1])
    return out


def as_tensor(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


class Recorder:
    """Wraps one allocator: every call goes through it and is recorded with the pool's state after it."""

    def __init__(self, allocator: Any, ns: dict[str, Any], page_size: int) -> None:
        self.allocator = allocator
        self.kernels: list[KernelLaunch] = [ns[k] for k in KERNELS]
        self.page_size = page_size
        self.calls: list[Json] = []
        self.merges: Counter[str] = Counter()

    @property
    def pool_pages(self) -> int:
        return POOL_PAGES[self.page_size]

    def free_pages(self) -> list[int]:
        return [int(p) for p in self.allocator.free_pages.tolist()]

    def staged_pages(self) -> list[int]:
        """Released pages not yet merged: the paged allocator's ``staged_pages`` (0.5.2x) or ``release_pages``."""
        staged = getattr(self.allocator, "staged_pages", None)
        if staged is None:
            tensor = self.allocator.release_pages
        else:
            tensor = torch.cat(staged) if staged else torch.empty((0,), dtype=torch.int64)
        return sorted(int(p) for p in tensor.tolist())

    def available_pages(self) -> int:
        return len(self.allocator.free_pages) + len(self.staged_pages())

    def _record(self, call: Json, tags: Json, out: torch.Tensor | None = None, rule: str | None = None,
                staged_before: int = 0) -> list[int] | None:
        faulted = any(k.faulted for k in self.kernels)
        for kernel in self.kernels:
            kernel.faulted = False
        assert not faulted or out is None, "a kernel twin faulted but the allocator did not return None"
        staged = self.staged_pages()
        if rule is not None:
            call["out"] = None if out is None else runs(int(i) for i in out.tolist())
            call["merged"] = staged_before > 0 and not staged
            self.merges[rule] += call["merged"]
        call.update(tags, free=runs(self.free_pages()), staged=runs(staged))
        self.calls.append(call)
        return None if out is None else [int(i) for i in out.tolist()]

    def clear(self, **tags: Any) -> None:
        """The allocator's ``clear``: what ``Scheduler.flush_cache`` does to an idle node's pool."""
        self.allocator.clear()
        self._record({"op": "clear"}, tags)

    def alloc(self, need_size: int, **tags: Any) -> list[int] | None:
        before = len(self.staged_pages())
        out = self.allocator.alloc(need_size)
        return self._record({"op": "alloc", "need_size": need_size}, tags, out, "alloc", before)

    def alloc_extend(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_loc: Sequence[int],
                     **tags: Any) -> list[int] | None:
        extend_num_tokens = sum(seq_lens) - sum(prefix_lens)
        before = len(self.staged_pages())
        out = self.allocator.alloc_extend(
            prefix_lens=as_tensor(prefix_lens), prefix_lens_cpu=as_tensor(prefix_lens), seq_lens=as_tensor(seq_lens),
            seq_lens_cpu=as_tensor(seq_lens), last_loc=as_tensor(last_loc), extend_num_tokens=extend_num_tokens,
        )
        call = {"op": "alloc_extend", "prefix_lens": list(prefix_lens), "seq_lens": list(seq_lens),
                "last_loc": list(last_loc), "extend_num_tokens": extend_num_tokens}
        return self._record(call, tags, out, "alloc_extend", before)

    def alloc_decode(self, seq_lens: Sequence[int], last_loc: Sequence[int], **tags: Any) -> list[int] | None:
        before = len(self.staged_pages())
        out = self.allocator.alloc_decode(seq_lens=as_tensor(seq_lens), seq_lens_cpu=as_tensor(seq_lens),
                                          last_loc=as_tensor(last_loc))
        call = {"op": "alloc_decode", "seq_lens": list(seq_lens), "last_loc": list(last_loc)}
        return self._record(call, tags, out, "alloc_decode", before)

    def free(self, slots: Sequence[int], **tags: Any) -> None:
        self.allocator.free(as_tensor(slots))
        self._record({"op": "free", "indices": runs(slots)}, tags)

    def free_group_begin(self, **tags: Any) -> None:
        self.allocator.free_group_begin()
        self._record({"op": "free_group_begin"}, tags)

    def free_group_end(self, **tags: Any) -> None:
        self.allocator.free_group_end()
        self._record({"op": "free_group_end"}, tags)

    def allocate_rows(self, prefix_lens: Sequence[int], seq_lens: Sequence[int], last_loc: Sequence[int],
                      **tags: Any) -> list[list[int]] | None:
        """An extend batch's new slots, split per request: ``alloc_extend`` when paged, one ``alloc`` at page size 1
        (the scheduler allocates the whole batch's extend tokens in one call there)."""
        lens = [s - p for p, s in zip(prefix_lens, seq_lens, strict=True)]
        if self.page_size == 1:
            out = self.alloc(sum(lens), **tags)
        else:
            out = self.alloc_extend(prefix_lens, seq_lens, last_loc, **tags)
        if out is None:
            return None
        starts = [sum(lens[:i]) for i in range(len(lens))]
        return [out[start:start + n] for start, n in zip(starts, lens, strict=True)]


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


# ---------------------------------------------------------------------------------------------------------------
# Scenario "calls": free-form traffic through every call


@dataclass
class Held:
    """A row of slots the script holds, as a request would: its slots in order and its length."""

    row: list[int]

    @property
    def seq_len(self) -> int:
        return len(self.row)


CALLS_DRIVER = (
    "Free-form traffic from random.Random(seed), {ops} operations on rows the script holds: alloc(n) (page-aligned "
    "n when paged), alloc_extend of 1-4 requests mixing new rows (prefix 0, last_loc -1) and continuations of held "
    "rows (prefix = the row's length, often not page-aligned, last_loc = its last slot), alloc_decode of 2-6 held "
    "rows (seq_lens = length + 1, last_loc = last slot), free of a whole row, and free_group_begin / several frees "
    "/ free_group_end. Frees are favoured while few pages remain; when the free list is short and pages are "
    "staged, the next call is steered to whichever merge rule has fired least so far. One over-sized alloc (and "
    "when paged one over-sized alloc_extend) returns None. At page size 1 only alloc and free exist."
)


def run_calls(rec: Recorder, rng: random.Random) -> Json:
    """Free-form traffic: every call, each merge rule, a None, rows freed alone and in groups."""
    held: list[Held] = []
    ops = 300
    rules = MERGE_RULES if rec.page_size > 1 else ("alloc",)
    for step in range(ops):
        if step == ops // 3:
            rec.alloc((rec.pool_pages + 1) * rec.page_size)  # more than the whole pool: None
            continue
        if step == 2 * ops // 3 and rec.page_size > 1:
            rec.alloc_extend([0], [(rec.pool_pages + 2) * rec.page_size], [-1])  # None
            continue
        steer = len(rec.allocator.free_pages) <= 6 and bool(rec.staged_pages())
        op = min(rules, key=lambda r: rec.merges[r]) if steer else choose_op(rec, rng, held)
        calls_op(rec, rng, held, op, steer)
    return {"driver": CALLS_DRIVER.format(ops=ops)}


FLUSH_DRIVER = (
    "The free-form traffic of the calls scenario ({ops} operations), then clear() (what Scheduler.flush_cache does to "
    "an idle node's pool; the rows held before are let go with it, unfreed), then {ops} more operations on new rows."
)


def run_flush(rec: Recorder, rng: random.Random) -> Json:
    """Traffic, the allocator's ``clear`` where its lists are far from fresh (pages staged, the free list out of
    order), and traffic again: the pages after it as a fresh allocator hands them out."""
    ops = 150
    rules = MERGE_RULES if rec.page_size > 1 else ("alloc",)
    for half in (0, 1):
        held: list[Held] = []
        for _ in range(ops):
            steer = len(rec.allocator.free_pages) <= 6 and bool(rec.staged_pages())
            op = min(rules, key=lambda r: rec.merges[r]) if steer else choose_op(rec, rng, held)
            calls_op(rec, rng, held, op, steer)
        if half == 0:
            free = rec.free_pages()
            assert rec.staged_pages() or free != sorted(free) or len(free) < rec.pool_pages, "a clear of a fresh pool"
            rec.clear()
    return {"driver": FLUSH_DRIVER.format(ops=ops)}


def choose_op(rec: Recorder, rng: random.Random, held: list[Held]) -> str:
    """A random next call, weighted towards frees while the pool is nearly full."""
    scarce = rec.available_pages() < rec.pool_pages // 3
    weights = {"alloc": 3, "free": 6 if scarce else 2, "group": 3 if scarce else 1}
    if rec.page_size > 1:
        weights |= {"alloc_extend": 3, "alloc_decode": 4}
    if not held:
        weights |= {"free": 0, "group": 0, "alloc_decode": 0}
    names = sorted(weights)
    return rng.choices(names, weights=[weights[n] for n in names])[0]


def calls_op(rec: Recorder, rng: random.Random, held: list[Held], op: str, steer: bool) -> None:
    """Perform one call of the free-form scenario on the held rows; steered, ask for more than the free list has."""
    ps, free = rec.page_size, len(rec.allocator.free_pages)
    if op == "alloc":
        pages = free + 1 if steer else rng.randint(1, 6) if ps > 1 else rng.randint(1, 80)
        row = rec.alloc(pages * ps)
        if row is not None:
            held.append(Held(row))
    elif op == "alloc_extend":
        calls_extend(rec, rng, held)
    elif op == "alloc_decode":
        bs = free + 1 if steer else rng.randint(2, 6)
        batch = rng.sample(held, min(bs, len(held)))
        out = rec.alloc_decode([h.seq_len + 1 for h in batch], [h.row[-1] for h in batch])
        for h, slot in zip(batch, out or [], strict=False):
            h.row.append(slot)
    elif op == "free":
        rec.free(held.pop(rng.randrange(len(held))).row)
    elif op == "group":
        rec.free_group_begin()
        for _ in range(min(len(held), rng.randint(2, 4))):
            rec.free(held.pop(rng.randrange(len(held))).row)
        rec.free_group_end()


def calls_extend(rec: Recorder, rng: random.Random, held: list[Held]) -> None:
    """An alloc_extend of 1-4 requests, some new, some continuing a held row past a partly filled page."""
    continued = rng.sample(held, min(len(held), rng.randint(0, 2)))
    new = rng.randint(0 if continued else 1, 4 - len(continued))
    prefix = [h.seq_len for h in continued] + [0] * new
    seq = [h.seq_len + rng.randint(1, 300) for h in continued] + [rng.randint(1, 600) for _ in range(new)]
    last_loc = [h.row[-1] for h in continued] + [-1] * new
    rows = rec.allocate_rows(prefix, seq, last_loc)
    if rows is None:
        return
    for h, extra in zip(continued, rows, strict=False):
        h.row.extend(extra)
    held.extend(Held(r) for r in rows[len(continued):])


# ---------------------------------------------------------------------------------------------------------------
# Scenario "prefill": batches with cached prefixes


PREFILL_DRIVER = (
    "A prefill node without a radix tree but with a script-held prefix cache, {iters} iterations from "
    "random.Random(seed). Each iteration: first the requests due are freed (each by free of its own slots, the part "
    "not taken from the cache; half of those whose own part holds a full page keep their first full pages as a new "
    "cache entry instead of freeing them, the cache holding at most 3 entries and freeing the oldest unused one "
    "when full); then one batch of 1-4 prompts (1 to a quarter of the pool's tokens new, a fifth of them a "
    "multiple of 64) is allocated: paged, alloc_extend with prefix_lens 0 (last_loc -1) "
    "or the length of a cache entry (a multiple of the page size; last_loc its last slot); at page size 1 one "
    "alloc of the batch's extend tokens. A batch that gets None is dropped. Requests are freed 1-4 iterations "
    "after their allocation."
)


@dataclass
class Prefill:
    """A prefilled request: its own new slots, the cache entry it read, when it is freed."""

    own: list[int]
    prefix: Held | None
    free_iter: int


def run_prefill(rec: Recorder, rng: random.Random) -> Json:
    """Prefill batches reading cached prefixes; the non-cached part freed a few iterations later."""
    iters, ps = 120, rec.page_size
    longest = rec.pool_pages * ps // 4  # a prompt's new tokens: up to a quarter of the pool
    cache: list[Held] = []
    live: list[Prefill] = []
    for k in range(iters):
        for req in [r for r in live if r.free_iter == k]:
            live.remove(req)
            keep = (len(req.own) // ps) * ps if req.prefix is None and rng.random() < 0.5 else 0
            if keep:
                keep = rng.randint(1, keep // ps) * ps
                remember_prefix(rec, cache, live, Held(req.own[:keep]))
            if len(req.own) > keep:
                rec.free(req.own[keep:], iter=k)
        batch = [(rng.choice(cache) if cache and rng.random() < 0.4 else None) for _ in range(rng.randint(1, 4))]
        prefix = [h.seq_len if h else 0 for h in batch]
        seq = [p + (rng.randint(1, longest // 64) * 64 if rng.random() < 0.2 else rng.randint(1, longest))
               for p in prefix]
        last_loc = [h.row[-1] if h else -1 for h in batch]
        rows = rec.allocate_rows(prefix, seq, last_loc, iter=k)
        for h, own in zip(batch, rows or [], strict=False):
            live.append(Prefill(own, h, k + rng.randint(1, 4)))
    return {"driver": PREFILL_DRIVER.format(iters=iters)}


def remember_prefix(rec: Recorder, cache: list[Held], live: list[Prefill], entry: Held) -> None:
    """Add a cache entry; when three are held, free the oldest that no live request reads."""
    if len(cache) == 3:
        unused = [h for h in cache if all(r.prefix is not h for r in live)]
        if not unused:
            rec.free(entry.row)
            return
        cache.remove(unused[0])
        rec.free(unused[0].row)
    cache.append(entry)


# ---------------------------------------------------------------------------------------------------------------
# Scenarios "decode-overlap" / "decode-no-overlap": a scripted decode node


@dataclass(frozen=True)
class Request:
    """One request of a decode node's stream."""

    rid: str
    prompt: int
    output: int
    arrive_iter: int
    transfer_iters: int

    def to_json(self) -> Json:
        return {"rid": self.rid, "prompt": self.prompt, "output": self.output, "arrive_iter": self.arrive_iter,
                "transfer_iters": self.transfer_iters}


@dataclass
class Decoding:
    """A request on the decode node: its row of slots and where it is in its life."""

    req: Request
    row: list[int]
    prealloc_iter: int
    produced: int = 1
    join_iter: int | None = None
    finish_iter: int | None = None
    free_iter: int | None = None

    @property
    def land_iter(self) -> int:
        return self.prealloc_iter + self.req.transfer_iters


DECODE_DRIVER = (
    "A decode node driven by the stream in 'requests', overlap scheduler {overlap}. Each iteration k = 0, 1, ...: "
    "(a) the requests arriving at k join the preallocation queue, in stream order. (b) Preallocation, FIFO with "
    "head-of-line blocking: a head whose prompt needs more pages than the whole pool is aborted (dropped, listed "
    "in 'aborted'); otherwise the head is preallocated only if, with it, the pages of all admitted and not yet "
    "freed requests at their final size, ceil((P+N+1)/page_size) each, fit in the pool, else it waits and "
    "preallocation stops for this iteration (admission rule of this driver, not SGLang's token budget); "
    "preallocation is alloc_extend(prefix_lens=[0], seq_lens=[P], last_loc=[-1], extend_num_tokens=P) when paged, "
    "alloc(P) at page size 1; its transfer lands at k + T. (c) Landing, in preallocation order: a request with "
    "N = 1 is finished at once and its row (P slots) freed by a plain free, outside any group; the others are "
    "appended to the running batch with length P and one output token (from prefill). (d) If the batch is "
    "non-empty, one allocation for the whole batch, in join order: alloc_decode(seq_lens=[len+1 ...], "
    "last_loc=[last slot ...]) when paged, alloc(batch size) at page size 1; each request appends its slot and "
    "len += 1. (e) Each unfinished request in the batch produces a token; one that has produced N is finished. "
    "{frees} A group is opened only when something is freed; each free is free(the request's whole row)."
)
FREES_NO_OVERLAP = (
    "Without overlap, those finished in this step are freed now, in batch order, inside one "
    "free_group_begin()/free_group_end(), and leave the batch: a request holds P+N-1 slots when freed."
)
FREES_OVERLAP = (
    "With overlap, those that finished in the previous iteration's step are freed now (after this iteration's "
    "step (d), which gave them one more slot), in batch order inside one free group, and leave the batch; those "
    "finishing in this step stay one more iteration: a request holds P+N slots when freed. Iterations go on while "
    "the batch holds anything, finished requests included."
)


class DecodeNode:
    """The decode loop the engine is held to: (a) arrivals, (b) preallocation, (c) landing, (d) step, (e) frees."""

    def __init__(self, rec: Recorder, requests: Sequence[Request], overlap: bool) -> None:
        self.rec = rec
        self.ps = rec.page_size
        self.overlap = overlap
        self.pending = list(requests)
        self.queue: list[Request] = []
        self.in_transfer: list[Decoding] = []
        self.batch: list[Decoding] = []
        self.admitted: list[Decoding] = []
        self.done: dict[str, Decoding] = {}
        self.aborted: list[str] = []
        self.waits = 0
        self.waited: list[str] = []
        self.stopped: Json | None = None

    def run(self) -> Json:
        k = 0
        while self.pending or self.queue or self.in_transfer or self.batch:
            self.arrive(k)
            self.preallocate(k)
            self.land(k)
            if not self.step(k):
                self.stopped = {"iter": k, "reason": "the step's allocation returned None"}
                break
            self.release(k)
            k += 1
        return self.outcome()

    def arrive(self, k: int) -> None:
        """(a) Requests arriving at k join the preallocation queue, in stream order."""
        self.queue += [r for r in self.pending if r.arrive_iter == k]
        self.pending = [r for r in self.pending if r.arrive_iter != k]

    def final_pages(self, req: Request) -> int:
        return pages_for(req.prompt + req.output + 1, self.ps)

    def preallocate(self, k: int) -> None:
        """(b) FIFO preallocation with head-of-line blocking; only a prompt larger than the pool is aborted."""
        while self.queue:
            head = self.queue[0]
            if pages_for(head.prompt, self.ps) > self.rec.pool_pages:
                self.aborted.append(self.queue.pop(0).rid)
                continue
            held = sum(self.final_pages(d.req) for d in self.admitted)
            if held + self.final_pages(head) > self.rec.pool_pages:
                assert self.admitted, f"{head.rid} can never be admitted: the stream is mis-sized"
                self.wait(head)
                return
            rows = self.rec.allocate_rows([0], [head.prompt], [-1], iter=k, rids=[head.rid])
            if rows is None:
                self.wait(head)
                return
            decoding = Decoding(self.queue.pop(0), rows[0], prealloc_iter=k)
            self.admitted.append(decoding)
            self.in_transfer.append(decoding)

    def wait(self, head: Request) -> None:
        self.waits += 1
        if head.rid not in self.waited:
            self.waited.append(head.rid)

    def land(self, k: int) -> None:
        """(c) Landed transfers: a one-token output finishes and frees at once, the rest join the batch's end."""
        for d in [d for d in self.in_transfer if d.land_iter == k]:
            self.in_transfer.remove(d)
            if d.req.output == 1:
                d.finish_iter = k
                self.rec.free(d.row, iter=k, rids=[d.req.rid])
                self.retire(d, k)
            else:
                d.join_iter = k
                self.batch.append(d)

    def step(self, k: int) -> bool:
        """(d) One slot for every request in the batch, in join order; (e, first half) the tokens produced."""
        if not self.batch:
            return True
        rids = [d.req.rid for d in self.batch]
        if self.ps == 1:
            out = self.rec.alloc(len(self.batch), iter=k, rids=rids)
        else:
            out = self.rec.alloc_decode([len(d.row) + 1 for d in self.batch], [d.row[-1] for d in self.batch],
                                        iter=k, rids=rids)
        if out is None:
            return False
        for d, slot in zip(self.batch, out, strict=True):
            d.row.append(slot)
            if d.finish_iter is None:
                d.produced += 1
                d.finish_iter = k if d.produced == d.req.output else None
        return True

    def release(self, k: int) -> None:
        """(e) Free, in batch order inside one free group, the requests whose last token is processed now."""
        finished_at = k - 1 if self.overlap else k
        leaving = [d for d in self.batch if d.finish_iter == finished_at]
        if not leaving:
            return
        rids = [d.req.rid for d in leaving]
        self.rec.free_group_begin(iter=k, rids=rids)
        for d in leaving:
            self.rec.free(d.row, iter=k, rids=[d.req.rid])
            self.batch.remove(d)
            self.retire(d, k)
        self.rec.free_group_end(iter=k, rids=rids)

    def retire(self, d: Decoding, k: int) -> None:
        d.free_iter = k
        self.admitted.remove(d)
        self.done[d.req.rid] = d

    def outcome(self) -> Json:
        out: Json = {
            rid: {"prealloc_iter": d.prealloc_iter, "land_iter": d.land_iter, "join_iter": d.join_iter,
                  "free_iter": d.free_iter, "slots": runs(d.row)}
            for rid, d in sorted(self.done.items(), key=lambda item: int(item[0][1:]))
        }
        out["aborted"] = self.aborted
        return out


def decode_stream(rng: random.Random, page_size: int) -> list[Request]:
    """40-60 requests: prompts 1..~1500 tokens when paged (1..~300 at page size 1), some page multiples, some 1;
    outputs mostly short, up to ~200 (~60), some 1; arrivals bunched so the pool runs short; one prompt
    larger than the pool."""
    prompt_max, output_max = (1500, 200) if page_size > 1 else (300, 60)
    pool_tokens = POOL_PAGES[page_size] * page_size
    n = rng.randint(40, 60)
    requests: list[Request] = []
    arrive = 0
    for i in range(n):
        draw = rng.random()
        if draw < 0.08:
            prompt = 1
        elif draw < 0.2:
            prompt = rng.randint(1, prompt_max // 64) * 64
        else:
            prompt = rng.randint(2, prompt_max)
        draw = rng.random()
        output = 1 if draw < 0.1 else rng.randint(2, output_max // 5) if draw < 0.75 else rng.randint(2, output_max)
        arrive += rng.choice((0, 0, 1, 2, 4, 8, 12))
        requests.append(Request(f"r{i}", prompt, output, arrive, rng.randint(1, 4)))
    big = rng.randrange(n)
    r = requests[big]
    requests[big] = Request(r.rid, pool_tokens + rng.randint(1, 200), r.output, r.arrive_iter, r.transfer_iters)
    return requests


def run_decode(rec: Recorder, rng: random.Random, overlap: bool) -> Json:
    requests = decode_stream(rng, rec.page_size)
    node = DecodeNode(rec, requests, overlap)
    outcome = node.run()
    driver = DECODE_DRIVER.format(overlap="on" if overlap else "off",
                                  frees=FREES_OVERLAP if overlap else FREES_NO_OVERLAP)
    doc: Json = {"driver": driver, "requests": [r.to_json() for r in requests], "outcome": outcome,
                 "prealloc_waits": node.waits, "waited": node.waited}
    if node.stopped is not None:
        doc["stopped"] = node.stopped
    return doc


# ---------------------------------------------------------------------------------------------------------------
# Fixtures and README


def compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def dump_fixture(doc: Json) -> str:
    """Sorted keys; lists of records one item a line, the outcome one request a line; otherwise compact."""
    lines = []
    for key in sorted(doc):
        value = doc[key]
        if isinstance(value, list) and value and isinstance(value[0], dict):
            body = "[\n" + ",\n".join(compact(v) for v in value) + "\n]"
        elif key == "outcome":
            body = "{\n" + ",\n".join(f"{json.dumps(k)}:{compact(v)}" for k, v in sorted(value.items())) + "\n}"
        else:
            body = json.dumps(value, sort_keys=True)
        lines.append(f"{json.dumps(key)}: {body}")
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    assert json.loads(text) == json.loads(json.dumps(doc))
    return text


def run_scenario(wheel: Wheel, ns: dict[str, Any], page_size: int, scenario: str, seed: int) -> Json:
    """Run one scenario on a fresh allocator of this release; return the fixture document."""
    rec = Recorder(new_allocator(ns, page_size), ns, page_size)
    rng = random.Random(seed)
    if scenario == "calls":
        doc = run_calls(rec, rng)
    elif scenario == "flush":
        doc = run_flush(rec, rng)
    elif scenario == "prefill":
        doc = run_prefill(rec, rng)
    else:
        doc = run_decode(rec, rng, overlap=scenario == "decode-overlap")
    names = PAGED_DEFS if page_size > 1 else TOKEN_DEFS
    doc |= {
        "release": wheel.release, "wheel": wheel.name, "wheel_sha256": wheel.sha256,
        "source": {name: wheel.defs[name].where(wheel.name) for name in names},
        "stand_ins": stand_ins(wheel) if page_size > 1 else {k: v for k, v in stand_ins(wheel).items()
                                                              if k.startswith("torch")},
        "notes": wheel.notes if page_size > 1 else [],
        "page_size": page_size, "size": POOL_PAGES[page_size] * page_size, "need_sort": True,
        "scenario": scenario, "seed": seed, "calls": rec.calls,
        "merges": {rule: rec.merges[rule] for rule in MERGE_RULES},
    }
    return doc


@dataclass
class Summary:
    """What the README reports about one fixture file."""

    path: str
    bytes: int
    calls: int
    merges: dict[str, int]
    nones: int
    waits: int | None
    waited: int | None
    key: str
    calls_digest: str


def identical_defs(wheels: Sequence[Wheel]) -> list[str]:
    """For each cut def, which releases share byte-identical source."""
    lines = []
    for name in CUT_ORDER:
        groups: dict[str, list[str]] = {}
        for w in wheels:
            cut = w.defs[name]
            groups.setdefault(cut.source, []).append(w.release + (" (borrowed)" if cut.wheel != w.name else ""))
        lines.append(f"- `{name}`: " + " | ".join(" = ".join(g) for g in groups.values()))
    return lines


README_HEAD = """\
# SGLang allocator fixtures

Every call made to SGLang's own KV-slot allocator, with its arguments, the indices it returned, the free list
after it and the staged (released, not yet merged) pages after it, for scripted call sequences. The allocator code
is cut out of the release wheels and run unchanged on CPU torch by `scripts/make_sglang_allocator_fixtures.py`;
tests hold replay's page pool to these files call by call and never need torch.

Regenerate (byte-identical for the same wheels):

    python3 -m venv /tmp/alloc-venv && /tmp/alloc-venv/bin/pip install torch==2.13.0   # CPU build
    for v in {releases}; do pip download --no-deps sglang==$v -d /tmp/wheels; done
    /tmp/alloc-venv/bin/python scripts/make_sglang_allocator_fixtures.py \\
        {wheels} \\
        --out tests/replay/allocator

## Format

One JSON file per release, page size, scenario and seed: `<release>/ps<page_size>-<scenario>-s<seed>.json`.
`calls` holds one call a line: `op` (`alloc`, `alloc_extend`, `alloc_decode`, `free`, `free_group_begin`,
`free_group_end`, `clear`), its arguments, `out` (the returned indices as RUNS, or null for None), `merged` (allocations
only: the staged pages were merged into the free list by this call), `free` (the free list after the call, in its
order, as PAGERUNS) and `staged` (the staged pages after the call, sorted, as PAGERUNS). RUNS are `[first, count]`
runs of consecutive ascending values covering the list in its order; page ids at page size 1 are token ids.
Decode scenarios tag calls with `iter` and `rids`, list the stream in `requests`, and give each request's whole row
of slots (in row order) in `outcome`, with `aborted` listing the requests dropped. `source` names the wheel file
and line where each def that ran starts; `stand_ins` names every non-SGLang name the cut code saw; `notes` says
what was borrowed. Allocators are built with `need_sort=True` (disaggregated mode), `kvcache=None`,
`device="cpu"`, `dtype=torch.int64`; `size` is the constructor's size argument in tokens (48 pages of 64 tokens,
600 slots at page size 1; page 0 / slot 0 is the reserved dummy, never handed out).

## Scenarios

- `calls`: free-form traffic through every call; each merge rule (`alloc`: pages > len(free); `alloc_extend`:
  extend_tokens // page_size + batch size + 1 > len(free); `alloc_decode`: batch size > len(free)) fires, frees
  alone and in groups, one call returning None (at page size 1 the token allocator has only `alloc` and `free`).
- `prefill`: batches of 1-4 prompts, some reading a script-held cached prefix (whole pages), freed 1-4 iterations
  later (the part not taken from the cache).
- `decode-overlap` / `decode-no-overlap`: a scripted decode node; its loop, stated in each file's `driver`, is
  the contract replay's engine is held to: (a) arrivals, (b) FIFO preallocation with head-of-line blocking,
  (c) landing, (d) one allocation for the running batch, (e) frees in one free group. With overlap a request
  holds P+N slots when freed, without P+N-1.
- `flush` (seed 1): the free-form traffic, then `clear` (what `Scheduler.flush_cache` runs on an idle node: the
  free list sorted afresh, nothing staged), then the traffic again on new rows.
"""


RADIX_SECTION = "<!-- prefill-radix:"


def cross_release(summaries: Sequence[Summary]) -> str:
    """Whether every release recorded the same calls (arguments, returns, pool states) for each scenario."""
    digests: dict[str, set[str]] = {}
    for s in summaries:
        digests.setdefault(s.key, set()).add(s.calls_digest)
    differing = sorted(key for key, d in digests.items() if len(d) > 1)
    text = "\n## Across releases\n\n"
    if not differing:
        return text + ("Every release recorded the same calls, returns, free lists, staged pages and outcomes for "
                       "every page size, scenario and seed: the files of one release differ from another's only in "
                       "`release`, `wheel`, `wheel_sha256`, `source`, `stand_ins` and `notes`.\n\n")
    return text + "Calls differ between releases for: " + ", ".join(f"`{k}`" for k in differing) + "\n\n"


def write_readme(out: Path, wheels: Sequence[Wheel], summaries: Sequence[Summary]) -> None:
    """The README: format, scenarios, where each def came from, the stand-ins, and per-file merge counts."""
    text = README_HEAD.format(releases=" ".join(w.release for w in wheels),
                              wheels=" \\\n        ".join(f"/tmp/wheels/{w.name}" for w in wheels))
    text += "\n## Sources\n\n| release | wheel | sha256 | def | starts at |\n|---|---|---|---|---|\n"
    for w in wheels:
        for name in CUT_ORDER:
            text += f"| {w.release} | {w.name} | {w.sha256[:16]}... | `{name}` | `{w.defs[name].where(w.name)}` |\n"
    text += "\nByte-identical sources across releases (`=` joins releases whose text is the same):\n\n"
    text += "\n".join(identical_defs(wheels)) + "\n"
    notes = [note for w in wheels for note in w.notes]
    text += "\nBorrowed defs:\n\n" + ("\n".join(f"- {n}" for n in notes) or "- none") + "\n"
    text += "\n## Stand-ins\n\n"
    for w in wheels:
        text += f"{w.release}:\n\n" + "".join(f"- `{k}`: {v}\n" for k, v in stand_ins(w).items()) + "\n"
    text += cross_release(summaries)
    text += "## Files\n\nMerges counted per rule (a merge: staged pages non-empty before the allocation, empty "
    text += "after); `None`: allocations that returned None; `waits`: iterations whose preallocation head waited "
    text += "(admission rule), and how many requests waited at least once.\n\n"
    text += "| file | bytes | calls | merges alloc | merges alloc_extend | merges alloc_decode | None | waits |\n"
    text += "|---|---|---|---|---|---|---|---|\n"
    for s in summaries:
        m = s.merges
        waits = "" if s.waits is None else f"{s.waits} ({s.waited} requests)"
        text += (f"| `{s.path}` | {s.bytes} | {s.calls} | {m['alloc']} | {m['alloc_extend']} | {m['alloc_decode']} "
                 f"| {s.nones} | {waits} |\n")
    path = out / "README.md"
    old = path.read_text() if path.exists() else ""
    if RADIX_SECTION in old:  # written by make_sglang_radix_fixtures.py: kept as it is
        text += "\n" + old[old.index(RADIX_SECTION):]
    path.write_text(text)


def check(doc: Json) -> None:
    """The sanity conditions every fixture must meet; a failure is a bug in the driver, not in SGLang."""
    name = f"{doc['release']} ps{doc['page_size']} {doc['scenario']} s{doc['seed']}"
    rules: tuple[str, ...] = MERGE_RULES if doc["page_size"] > 1 else ("alloc",)
    if doc["scenario"] == "flush":
        assert [c["op"] for c in doc["calls"]].count("clear") == 1, f"{name}: not one clear"
    if doc["scenario"] == "calls":
        assert all(doc["merges"][r] > 0 for r in rules), f"{name}: a merge rule never fired: {doc['merges']}"
        assert any(c.get("out", 0) is None for c in doc["calls"]), f"{name}: no call returned None"
    if doc["scenario"].startswith("decode"):
        rules = ("alloc_extend", "alloc_decode") if doc["page_size"] > 1 else ("alloc",)
        assert "stopped" not in doc, f"{name}: {doc.get('stopped')}"
        assert doc["prealloc_waits"] > 0, f"{name}: preallocation never waited"
        assert all(doc["merges"][r] > 0 for r in rules), f"{name}: a merge rule never fired: {doc['merges']}"
        assert doc["outcome"]["aborted"], f"{name}: nothing aborted"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", nargs="+", type=Path, help="sglang-X.Y.Z-*.whl files")
    parser.add_argument("--out", type=Path, default=Path("tests/replay/allocator"))
    args = parser.parse_args(argv)
    wheels = sorted((read_wheel(p) for p in args.wheels), key=lambda w: w.version)
    borrow_decode_twin(wheels)
    summaries = []
    for wheel in wheels:
        ns = load_allocators(wheel)
        folder = args.out / wheel.release
        folder.mkdir(parents=True, exist_ok=True)
        for page_size in sorted(POOL_PAGES):
            for scenario in SCENARIOS:
                for seed in SEEDS if scenario != "flush" else SEEDS[:1]:  # (one run: the clear is one call)
                    doc = run_scenario(wheel, ns, page_size, scenario, seed)
                    check(doc)
                    path = folder / f"ps{page_size}-{scenario}-s{seed}.json"
                    text = dump_fixture(doc)
                    path.write_text(text)
                    nones = sum(1 for c in doc["calls"] if "out" in c and c["out"] is None)
                    behaviour = compact([doc["calls"], doc.get("outcome")]).encode()
                    waited = doc.get("waited")
                    summaries.append(Summary(
                        str(path.relative_to(args.out)), len(text.encode()), len(doc["calls"]), doc["merges"], nones,
                        doc.get("prealloc_waits"), None if waited is None else len(waited), path.name,
                        hashlib.sha256(behaviour).hexdigest(),
                    ))
                    print(f"{path}: {len(text.encode())} bytes, merges {doc['merges']}")
    write_readme(args.out, wheels, summaries)


if __name__ == "__main__":
    main()
