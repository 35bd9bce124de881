"""Fixtures printed by SGLang's own code: one small prefill/decode run per release wheel.

    pip install -e ".[sglang]"    # uvicorn, for its formatters
    python scripts/make_sglang_fixtures.py WHEEL... [--out tests/adapters/releases]

Each wheel (``pip download --no-deps sglang==X``) is run in a subprocess of its own. The run is
scripted (which requests arrive, how long their prompts are, which transfer fails), but every
line is formatted by the release, through the pieces in replay/sglang_print/servers.py:
``configure_logger``'s format with the scheduler's DP/TP prefix, ``RequestLogger`` and its log
targets (text and JSON), ``GenerateReqInput`` as a dataclass, ``Req.log_time_stats`` with the
release's time-stats class, ``validate_input_length`` and ``set_finish_with_abort``,
``FINISH_ABORT.to_json``, the tokenizer's context-length check and the HTTP server's error line,
the transfer-failure messages with ``KVTransferError``, the ``server_args`` line, the pool line,
the batch statistics, and uvicorn's own formatters.

What the script chooses: the values (rids, token counts, times, hosts), and the keys of a
finished request's ``meta_info`` (assembled in the tokenizer manager, too entangled to run).
Each release's folder gets ``SOURCE.json``: the release, the wheel's SHA-256, and for each line
type the source file and line it came from. The queues' capacity check, which no consistent
run of this setup reaches, is printed outside the run into ``lines/`` (``capacity_lines``).

The run (``SCENARIO``): a prefill server at TP2 and a decode server at TP2 with DP attention
(DP2: each DP rank its own KV pool; the pool line printed by DP0's first scheduler only, as the
releases do), Mooncake, context 1,048,576 tokens, KV pool 681,280: two requests served, one
prompt longer than the pool (``validate_input_length``'s abort: up to 0.5.19 the prefill still
bootstraps and sends its one-token stub; 0.5.20 runs the stub's forward and then aborts its
sender, sending nothing, so decode waits until its waiting timeout; from 0.5.21 it is retired at
the bootstrap queue, its time stats still printed), one longer than the context (the tokenizer's
rejection on both servers), one whose KV transfer fails, two an integrity check of the release
catches, one in flight on decode when the decode server dies and starts again (a second start-up
in the same captured file, one more served by the new process after it), and one whose bootstrap
never completes (decode cannot reach the prefill's bootstrap server: its handshake fails; the
prefill times out in ``KVPoll.Bootstrapping``). One served request's prompt begins with an earlier
one's (:data:`PREFIXES`): the prefill's prefix cache gives it whole pages (:func:`cached_tokens`),
printed in its time stats from 0.5.12 and in its finish (``meta_info.cached_tokens``) on both
servers. Decode retracts one served request once (:data:`RETRACTED`): the scheduler's ``KV cache pool
is full. Retract requests.`` line halfway through its decode, and its finish's ``meta_info`` counts
it (``num_retractions``, ``total_retractions`` to 0.5.11; every finish carries the key, with the
server's ``weight_version``, as the release's tokenizer builds it). Decode prints its ``Decode
batch`` lines as its steps go (:meth:`Scenario._decode_steps`): every ``decode_log_interval``-th
step of a DP rank's scheduler, counted from the process's start, so DP0 TP0 and DP1 TP1 each print
theirs (one request in the running batch: the run never decodes two together on one DP rank), and
a long decode prints lines alike within a second.

Every server starts with its warmup, as the release sends it: one batch with an item per DP rank
before 0.5.18 (:meth:`Scenario._batched_warmup`), one request per DP rank from 0.5.18.

Three more runs, each in folders of its own beside the run's (SOURCE.json ``rotated``, ``hostile``
and ``reuse``): ``json-rotated/`` (0.5.8, 0.5.23: :data:`ROTATED`), the scenario with its arrivals
500 times apart in the JSON form to ``--log-requests-target`` folders, rolled over hourly by the
release's own ``TimedRotatingFileHandler`` (``utils/log_utils.py:40``) on the run's clock, the
older pieces gzipped as logrotate would; and ``hostile-<form>-level<L>/`` (:data:`HOSTILE_SETS`),
requests without a client rid (each server assigns its own) at ``--log-requests-level`` 2 or 3,
whose prompts and outputs hold text that looks like log lines (:func:`hostile_texts`), one
output of ~150 KB printed whole; and ``text-reuse/`` (0.5.11, 0.5.18, 0.5.20, 0.5.23:
:data:`REUSE_RELEASES`), the scenario after one long request on the over-long prompt's decode DP
pool, that pool smaller (:func:`reuse_run`). The hostile and reuse runs are probed by periodic
health checks (:meth:`Scenario._health_check`; SOURCE.json ``health_checks``). And, for every
release, two decode servers of other layouts serving the scenario's served requests, started with
``--enable-metrics-for-all-schedulers`` (:func:`batch_runs`, SOURCE.json ``batch_runs``):
``text-all-schedulers/`` at TP4 with DP attention DP2 (two schedulers a DP rank) and
``text-no-dp-attention/`` at TP2, whose other schedulers print their batch lines too where the
release lets them (to 0.5.8).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import random
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from replay.sglang_print.release import Release
from replay.sglang_print.servers import (
    BOOTSTRAP_WAIT,
    CLOCK,
    SCHEDULER,
    Lines,
    Printer,
    Server,
    Setup,
    Spec,
    aborts_after_forward,
    close_targets,
    decode_log_interval,
    drawn_uuids,
    every_scheduler_logs_decode_batches,
    flush_guarded,
    has_targets,
    layout_lines_of,
    marks_bootstrap_done,
    retires,
    server_args_fields,
    start_clock,
)

SETUP = Setup(epoch=dt.datetime(2026, 11, 2, 8, 0, 0, tzinfo=dt.UTC).timestamp())
PERF0 = SETUP.perf0
CONTEXT = SETUP.context
POOL = 681_280  # the prefill pool, tokens
MAX_REQ_INPUT_LEN = SETUP.max_req_input_len
#: decode's SGLANG_DISAGGREGATION_WAITING_TIMEOUT in the run, seconds (SGLang's default is 300)
WAITING_TIMEOUT = 1.5
DECODE_POOL = 1_114_112  # the decode pool (each DP rank's): a 700,000-token prompt fits
HOSTS = {"prefill": "10.0.0.11", "decode": "10.0.0.21"}
SPECS = {"prefill": Spec("prefill-0", "prefill", HOSTS["prefill"], 30000, POOL),
         "decode": Spec("decode-0", "decode", HOSTS["decode"], 30001, DECODE_POOL, dp_size=2)}

#: (rid, prompt tokens, output tokens, what happens, decode DP rank, arrival seconds after EPOCH)
SCENARIO = [
    ("req-a1", 1200, 64, "served", 0, 2.0),
    ("req-a2", 30500, 128, "served", 1, 3.5),
    ("req-long", 700_000, 32, "over_pool", 0, 6.0),
    ("req-huge", 1_200_000, 16, "over_context", 1, 8.0),
    ("req-fail", 4096, 32, "transfer_failed", 1, 10.0),
    ("req-room", 2048, 16, "room_mismatch", 0, 12.0),  # releases that check it (0.5.11 on)
    ("req-sum", 2048, 16, "checksum_mismatch", 1, 14.0),  # releases with --disaggregation-enable-kv-checksum
    ("req-a3", 900, 8, "served", 0, 16.0),
    # the decode server dies with it in flight (its KV landed, decoding) and starts again: a second
    # start-up inside the same captured file; the request ends with nothing more on decode
    ("req-crash", 2500, 64, "decode_restart", 0, 16.2),
    ("req-after", 700, 8, "served", 1, 16.6),  # served by the restarted process
    ("req-boot", 3000, 16, "bootstrap_failed", 1, 17.5),  # last: the prefill gives up 300 s later
]
#: Prefix-cache hits on prefill: rid -> (the earlier request whose prompt it begins with, how many
#: of its first tokens it shares). What the release then takes from the cache: :func:`cached_tokens`.
PREFIXES = {"req-a3": ("req-a1", 640)}
#: Served requests the decode scheduler retracted under memory pressure (its pages freed, its KV kept
#: on the host and restored into pages taken afresh), by rid: how many times. Each retraction is the
#: scheduler's warning on every scheduler of the request's DP rank, halfway through its decode, and
#: the finish's ``meta_info`` counts them (``num_retractions``; ``total_retractions`` to 0.5.11).
RETRACTED = {"req-a2": 1}
#: A decode step's time, seconds: each DP rank's scheduler runs one step per output token after
#: the first (which comes with the KV from the prefill)
STEP = 0.012
#: The warmup's output on decode (``max_new_tokens`` 8: seven decode steps on each DP rank)
WARMUP_DECODE_TOKENS = 8


def common_module(release: Release) -> str:
    """The module holding ``configure_logger`` in this release."""
    return "sglang.srt.utils.common" if release.has("sglang.srt.utils.common") else "sglang.srt.utils"


def cached_tokens(rid: str, prompt: int, scenario: list[tuple[str, int, int, str, int, float]],
                  page: int = SETUP.page) -> int:
    """The prompt tokens the prefill's prefix cache gives request ``rid`` (:data:`PREFIXES`), as
    every release computes them: the match is at most ``input_len - 1`` tokens
    (``Req.adjust_max_prefix_ids``, ``managers/schedule_batch.py``), page-aligned (``RadixKey.
    page_aligned`` / ``match_prefix``, ``mem_cache/radix_cache.py``), against the earlier request's
    pages in the tree (its prompt's whole pages: the earlier one served before it arrives);
    ``req.cached_tokens`` is what the match gave (``prepare_for_extend``). 0 without a hit."""
    if rid not in PREFIXES:
        return 0
    earlier, shared = PREFIXES[rid]
    before = {r: (p, outcome) for r, p, _, outcome, _, _ in scenario[: [s[0] for s in scenario].index(rid)]}
    assert before.get(earlier, (0, ""))[1] == "served", (rid, earlier)  # (its pages in the prefill's tree)
    held = before[earlier][0] // page * page
    return min(shared, held, prompt - 1) // page * page


def run(release: Release, out: Path) -> None:
    """The scenario through one release: writes the fixture folder ``out/<version>``."""
    start_clock(SETUP)
    folder = out / release.version
    shutil.rmtree(folder, ignore_errors=True)  # (the request-log targets append: a run starts clean)
    folder.mkdir(parents=True)
    sources: dict[str, str] = {}
    forms = ["text", "json"] if release.has("sglang.srt.utils.request_logger") else ["text"]
    if "SGLANG_LOG_MS" in release.source(common_module(release)):
        forms.append("text-ms")  # SGLANG_LOG_MS=1: the text form with milliseconds in each time
    for form in forms:
        for role in ("prefill", "decode"):
            # --log-requests-target: a folder named after the server, beside its stdout capture
            target = folder / form / f"{role}-0" if form == "json" and has_targets(release) else None
            server = Server(release, SPECS[role], SETUP, form.removesuffix("-ms"), target, log_ms=form == "text-ms")
            Scenario(server).play()
            (folder / form).mkdir(parents=True, exist_ok=True)
            (folder / form / f"{role}-0.log").write_text(server.out.getvalue(), encoding="utf-8")
            sources.update(server.sources)
    lines = capacity_lines(release, folder / "lines", sources)
    flags = flag_lines(release, folder / "lines", sources)
    layouts = layout_lines(release, folder / "lines", sources)
    flushes = flush_lines(release, folder / "lines", sources)
    retractions = retract_lines(release, folder / "lines", sources)
    rotation = rotated_run(release, folder / "json-rotated", sources) if release.version in ROTATED else None
    hostile = hostile_runs(release, folder, sources)
    reuse = reuse_run(release, folder / REUSE_FOLDER, sources) if release.version in REUSE_RELEASES else None
    batches = batch_runs(release, folder, sources)
    (folder / "SOURCE.json").write_text(json.dumps({
        "release": release.version, "wheel": release.wheel.name, "sha256": release.sha256,
        "made_by": "scripts/make_sglang_fixtures.py", "context_length": CONTEXT,
        "pool_tokens": {"prefill": POOL, "decode": DECODE_POOL},
        "max_req_input_len": MAX_REQ_INPUT_LEN, "page_size": SETUP.page,
        "retires_rejected_at_intake": retires(release),
        # what the release does with a prompt rejected at intake: "sent" (its one-token stub,
        # up to 0.5.19), "aborted" (the stub's forward, then its sender aborted: 0.5.20),
        # "retired" (at the bootstrap queue: 0.5.21 on)
        "over_long_prompt": "retired" if retires(release) else "aborted" if aborts_after_forward(release) else "sent",
        "decode_waiting_timeout_s": WAITING_TIMEOUT,
        "decode_log_interval": decode_log_interval(release),
        "scenario": [dict(zip(("rid", "prompt_tokens", "output_tokens", "outcome", "decode_dp_rank", "at_s"), s,
                              strict=True)) for s in SCENARIO],
        # requests whose prompt begins with an earlier one's: what the prefix cache gives them
        "prefix_cache_hits": [{"rid": rid, "prefix_of": earlier, "shared_tokens": shared,
                               "cached_tokens": cached_tokens(rid, prompt, SCENARIO)}
                              for rid, prompt, *_ in SCENARIO if rid in PREFIXES
                              for earlier, shared in [PREFIXES[rid]]],
        # served requests the decode scheduler retracted, and how many times
        "retracted": [{"rid": rid, "retractions": n} for rid, n in RETRACTED.items()],
        # decode servers of other layouts, started with --enable-metrics-for-all-schedulers
        "batch_runs": batches,
        "sources": dict(sorted(sources.items())),
        "lines": lines,
        "flag_lines": flags,
        # servers whose KV pool is of another layout than the plain paged one: their model runner's lines
        "layout_lines": layouts,
        # each server's cache flush: its warning while busy, then its flush, on the schedulers that print it
        "flush_lines": flushes,
        # a decode server's retraction under memory pressure, on every scheduler of its first DP rank
        "retract_lines": retractions,
        # the scenario again, its target files rotated by SGLang's handler and gzipped (0.5.8 on)
        **({"rotated": rotation} if rotation else {}),
        # the hostile run: server-assigned rids, user text like log lines at levels 2 and 3
        **({"hostile": {"scenario": [
            {"name": name, "prompt_tokens": p, "output_tokens": o, "outcome": outcome, "decode_dp_rank": dp,
             "at_s": at, "bootstrap_room": room_of(name), "rids": {node: assigned_rid(node, name)
                                                                    for node in ("prefill-0", "decode-0")}}
            for name, p, o, outcome, dp, at in HOSTILE], "sets": hostile, "user_mark": USER_MARK}}
           if hostile else {}),
        # the scenario after a long request on the over-long prompt's decode pool, that pool smaller
        **({"reuse": reuse} if reuse else {}),
    }, indent=2) + "\n", encoding="utf-8")


#: The capacity check's lines (lines/<server>.log): rid, prompt tokens and the pool, per role
CAPACITY = {"prefill": ("req-cap-p", 700_000, POOL), "decode": ("req-cap-d", 1_200_000, DECODE_POOL)}


def capacity_lines(release: Release, out: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """The disaggregation queues' capacity check (``Request R exceeds the maximum number of
    tokens: N > M``), printed by the release's f-string and logger on every scheduler of the
    request, into ``out/<server>.log``: lines outside the scripted run, because no consistent
    run of this setup reaches the check (``validate_input_length`` refuses such a prompt first,
    or the tokenizer does); each is described in SOURCE.json's ``lines``."""
    out.mkdir(parents=True)
    described = []
    for role in ("prefill", "decode"):
        rid, tokens, pool = CAPACITY[role]
        server = Server(release, SPECS[role], SETUP, "text", None)
        mod = f"sglang.srt.disaggregation.{role}"
        marker = "exceeds the maximum number of tokens"
        # the limit each release compares with is the pool: max_total_num_tokens, the decode's
        # capacity, or 0.5.23's max_input_len (max_bootstrap_input_len: the pool when KV is not sharded)
        limit = pool
        text = release.message(mod, marker)(rid=rid, origin_input_ids=range(tokens), input_len=tokens,
                                            max_total_num_tokens=pool, capacity=pool, max_input_len=pool)
        server.note(f"{role}_capacity_check", mod, marker)
        CLOCK.at(1.0)
        for prefix in server.schedulers(0):
            server.configure(prefix)
            logging.getLogger(mod).error(text)
        name = f"{SPECS[role].node}.log"
        (out / name).write_text(server.out.getvalue(), encoding="utf-8")
        sources.update(server.sources)
        described.append({"file": f"lines/{name}", "role": role, "kind": "capacity_check", "rid": rid,
                          "tokens": tokens, "limit_tokens": limit})
    return described


#: Servers started with other scheduling flags than the run's (lines/<node>-flags.log): the
#: arguments given, and schema v1.1's fields their config should state (docs/schema-v1.1.md)
FLAGS = {
    "prefill": ({"disable_radix_cache": True}, {"prefix_cache": False}),
    "decode": ({"disable_overlap_schedule": True, "disaggregation_decode_enable_radix_cache": True,
                "speculative_algorithm": "EAGLE", "disaggregation_decode_enable_offload_kvcache": True},
               {"overlap_schedule": False, "prefix_cache": True, "speculative_decoding": True, "kv_offload": True}),
}


def flag_lines(release: Release, out: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """The start-up of each server with the scheduling flags of :data:`FLAGS`: its ``server_args``
    line and pool line, printed by the release's code as the run prints them (a server started
    with ``--disable-overlap-schedule``, say), into ``out/<node>-flags.log``. A flag the release
    does not have is left out, and so is the field it would set (``expected``)."""
    described = []
    fields = server_args_fields(release)
    for role in ("prefill", "decode"):
        given, expected = FLAGS[role]
        args = {k: v for k, v in given.items() if k in fields}
        decode_cache = "disaggregation_decode_enable_radix_cache"
        if decode_cache in given and decode_cache not in args:
            expected = {k: v for k, v in expected.items() if k != "prefix_cache"} | {"prefix_cache": False}
        for arg, said in (("speculative_algorithm", "speculative_decoding"),
                          ("disaggregation_decode_enable_offload_kvcache", "kv_offload")):
            if arg in given and arg not in args:
                expected = {k: v for k, v in expected.items() if k != said}
        spec = dataclasses.replace(SPECS[role], args=tuple(sorted(args.items())))
        server = Server(release, spec, SETUP, "text", None)
        CLOCK.at(0.0)
        Printer(server).startup()
        name = f"{spec.node}-flags.log"
        (out / name).write_text(server.out.getvalue(), encoding="utf-8")
        sources.update(server.sources)
        described.append({"file": f"lines/{name}", "role": role, "args": args, "expected": expected})
    return described


#: What each layout's server states on its configs (schema v1.1): the ``swa`` and ``unified`` pools
#: are not the plain paged one; the ``linear`` model's requests hold recurrent state besides.
LAYOUT_EXPECTED = {"swa": {"hybrid_pool": True, "recurrent_state": False},
                   "swa_only": {"hybrid_pool": True, "recurrent_state": False},
                   "linear": {"hybrid_pool": False, "recurrent_state": True},
                   "unified": {"hybrid_pool": True, "recurrent_state": False}}


def layout_lines(release: Release, out: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """The start-up of each server whose KV pool is of another layout (``servers.LAYOUTS``, as the
    release prints it: its model runner's lines through the release's strings and loggers, before
    the pool line), into ``out/<node>-<layout>.log``; the unified memory pool where the release has
    it (0.5.18 on), started with ``--enable-unified-memory``. Each is described in SOURCE.json's
    ``layout_lines`` with the fields its configs should state (:data:`LAYOUT_EXPECTED`)."""
    described = []
    fields = server_args_fields(release)
    for layout, expected in LAYOUT_EXPECTED.items():
        printed = [marker for _, marker, _ in layout_lines_of(release, layout)]
        if not printed:
            continue  # (a layout the release does not have)
        args = {"enable_unified_memory": True} if layout == "unified" and "enable_unified_memory" in fields else {}
        for role in ("prefill", "decode"):
            spec = dataclasses.replace(SPECS[role], args=tuple(sorted(args.items())))
            server = Server(release, spec, SETUP, "text", None)
            CLOCK.at(0.0)
            Printer(server).startup(layout)
            name = f"{spec.node}-{layout}.log"
            (out / name).write_text(server.out.getvalue(), encoding="utf-8")
            sources.update(server.sources)
            described.append({"file": f"lines/{name}", "role": role, "layout": layout, "args": args,
                              "printed": printed, "expected": expected})
    return described


def flush_lines(release: Release, out: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """``Scheduler.flush_cache``'s lines on each server (``out/<node>-flush.log``, after its
    start-up): asked while busy, the release's warning that it did not flush (its f-string, through
    the root logger as the release calls it, on every scheduler); then, idle, its
    ``Cache flushed successfully!`` on the schedulers that print it (``Printer.cache_flushed``):
    every one, where the release prints it unguarded (to 0.5.12), else each DP rank's stats-logging
    rank (attention-TP rank 0: ``if self.metrics_reporter.is_stats_logging_rank``, 0.5.18 on).
    Outside the scripted run: a flush there would change every page after it. Each is described in
    SOURCE.json's ``flush_lines``: the nodes whose pools it flushed (a DP rank's pool is a node of
    its own)."""
    guarded = flush_guarded(release)
    busy = release.message(SCHEDULER, "Cache not flushed because")
    described = []
    for role in ("prefill", "decode"):
        spec = SPECS[role]
        server = Server(release, spec, SETUP, "text", None)
        CLOCK.at(0.0)
        printer = Printer(server)
        printer.startup()
        server.note("cache_not_flushed", SCHEDULER, "Cache not flushed because")
        ranks: list[int | None] = list(range(spec.dp_size)) if spec.dp_size > 1 else [None]
        CLOCK.at(1.0)
        for dp in ranks:
            for prefix in server.schedulers(dp):
                server.configure(prefix)
                logging.warning(busy(waiting_queue=range(2), reqs=range(3)))
        CLOCK.at(2.0)
        printer.cache_flushed()
        name = f"{spec.node}-flush.log"
        (out / name).write_text(server.out.getvalue(), encoding="utf-8")
        sources.update(server.sources)
        described.append({"file": f"lines/{name}", "role": role, "printed_by": "each DP rank's first scheduler"
                          if guarded else "every scheduler",
                          "flushed": [spec.node if dp is None else f"{spec.node}.dp{dp}" for dp in ranks]})
    return described


def retract_lines(release: Release, out: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """``Scheduler.update_running_batch``'s line where it retracts running requests under memory
    pressure (``out/decode-0-retract.log``, after the decode server's start-up): built and logged by
    the release's own statements (``Printer.retracted``: ``KV cache pool is full. Retract requests.
    #retracted_reqs: 1, ...``), on every scheduler of its first DP rank. Outside the scripted run: a
    retraction there would change every page after it. Described in SOURCE.json's
    ``retract_lines``: the node whose pool it freed pages of (a DP rank's pool is a node of its own)."""
    spec = SPECS["decode"]
    server = Server(release, spec, SETUP, "text", None)
    CLOCK.at(0.0)
    printer = Printer(server)
    printer.startup()
    CLOCK.at(3.0)
    printer.retracted()
    name = f"{spec.node}-retract.log"
    (out / name).write_text(server.out.getvalue(), encoding="utf-8")
    sources.update(server.sources)
    return [{"file": f"lines/{name}", "role": "decode", "printed_by": "every scheduler of the DP rank",
             "retracted": [spec.node if spec.dp_size <= 1 else f"{spec.node}.dp0"]}]


class Scenario(Printer):
    """The scripted run on one server: start-up, requests, noise. ``scenario`` is
    :data:`SCENARIO` unless given; with ``texts`` (name: prompt and output text) a request is
    sent as its prompt's text, and a served one answers with the output's; with
    ``assign_rids`` no client gives a rid and the server assigns its own (``assigned``: name to
    rid, drawn from a generator seeded with the node)."""

    def __init__(self, server: Server, scenario: list[tuple[str, int, int, str, int, float]] | None = None,
                 texts: dict[str, tuple[str, str]] | None = None, assign_rids: bool = False,
                 health: tuple[tuple[float, bool], ...] = ()):
        super().__init__(server)
        self.scenario = SCENARIO if scenario is None else scenario
        self.texts = texts or {}
        self.assign_rids = assign_rids
        self.assigned: dict[str, str] = {}
        #: the probes of ``/health_generate`` (:meth:`_health_check`): (seconds, whether the server is busy then)
        self.health = health
        self.health_rids: list[str] = []
        self._silent = False  # (:meth:`_answered_elsewhere`)
        #: each DP rank's decode steps since its scheduler process started (``forward_ct_decode``)
        self.steps: dict[int, int] = {}
        #: when each DP rank's last decode ends (run seconds): the run never decodes two requests
        #: together on one DP rank, so every batch line's running batch is one request
        self.decoding_until: dict[int, float] = {}
        self.interval = decode_log_interval(self.r)
        #: started with --enable-metrics-for-all-schedulers, in a release whose every scheduler then
        #: prints its decode batch line (not only each DP rank's first)
        self.every_scheduler = (dict(server.spec.args).get("enable_metrics_for_all_schedulers") is True
                                and every_scheduler_logs_decode_batches(self.r))

    # -- the run ---------------------------------------------------------------------------

    def play(self) -> None:
        s = self.s
        CLOCK.at(0.0)
        self.startup()
        self.warmup(0.5)
        probes = sorted(self.health)
        for rid, prompt, output, outcome, dp_rank, at in self.scenario:
            while probes and probes[0][0] < at:  # (a probe while a request runs: the run writes through Lines)
                self._health_check(*probes.pop(0))
            self._request(rid, prompt, output, outcome, dp_rank, at)
        for probe in probes:
            self._health_check(*probe)
        if s.role == "prefill":  # (decode's batch lines are its steps': :meth:`_decode_steps`)
            CLOCK.at(max(at for *_, at in self.scenario) + 1.0 + BOOTSTRAP_WAIT)
            s.configure(s.schedulers(0)[0])
            self._batch_line()

    def startup(self) -> None:
        """The server's start-up (a new process: its schedulers' step counts start at 0)."""
        self.steps.clear()
        self.decoding_until.clear()
        super().startup()

    def _decode_steps(self, dp_rank: int, first: float, count: int) -> None:
        """``count`` decode steps of one request on ``dp_rank``'s scheduler(s), the first ending at
        ``first`` (run seconds), one every :data:`STEP`. The scheduler counts its decode steps from
        its process's start (``forward_ct_decode``) and after every ``decode_log_interval``-th it
        prints its ``Decode batch`` line: each DP rank's first scheduler (attention-TP rank 0),
        and with --enable-metrics-for-all-schedulers, where the release lets them, the others
        (:func:`every_scheduler_logs_decode_batches`). On a prefill server: nothing."""
        s = self.s
        if s.role != "decode" or count <= 0:
            return
        rank = dp_rank if s.spec.dp_size > 1 else 0
        assert first >= self.decoding_until.get(rank, 0.0), (s.spec.node, rank, first)  # (one at a time)
        self.decoding_until[rank] = first + (count - 1) * STEP
        printers = s.schedulers(rank if s.spec.dp_size > 1 else None)
        for k in range(count):
            self.steps[rank] = self.steps.get(rank, 0) + 1
            if self.steps[rank] % self.interval:
                continue
            CLOCK.at(first + k * STEP)
            for module in ("sglang.srt.server_args", "sglang.srt.arg_groups.fields.observability"):
                s.note("decode_log_interval", module, "decode_log_interval: ")
            for prefix in printers if self.every_scheduler else printers[:1]:
                s.configure(prefix)
                self._batch_line(running=1)

    @contextlib.contextmanager
    def _answered_elsewhere(self) -> Iterator[None]:
        """Meanwhile a finish prints no access line of its own (the HTTP answer is another's)."""
        self._silent = True
        try:
            yield
        finally:
            self._silent = False

    def _access(self, status: int) -> None:
        if not self._silent:
            super()._access(status)

    def warmup(self, at: float) -> bool:
        """The start-up warmup: one ``/generate`` per DP rank from 0.5.18 (:meth:`Printer.warmup`),
        the batched one before (:meth:`_batched_warmup`); on decode, its steps on each DP rank."""
        done = super().warmup(at) or self._batched_warmup(at)
        if done:
            for rank in range(self.s.spec.dp_size):
                self._decode_steps(rank, at + 0.02, WARMUP_DECODE_TOKENS - 1)
        return done

    def _batched_warmup(self, at: float) -> bool:
        """The start-up warmup of a disaggregated server before 0.5.18 (``_execute_server_warmup``
        in ``entrypoints/http_server.py``): ONE ``/generate`` whose fields are lists, one item per
        DP rank (the release's own ``json_data``: bootstrap host 2.2.2.2, the rooms
        ``i * (2**63 // dp_size) + i % tp_size``, four token ids each), sent by the server itself
        with no rid (``normalize_batch_and_arguments`` assigns one per item, drawn here from a
        seeded generator). The tokenizer logs the batch once as it arrives (``rid=[...]``) and
        each item as it finishes (``obj[i]``: a single request); uvicorn logs the one POST, and
        the warmup its start and its end (``resp:`` the items' outputs). False, printing
        nothing, where the release has no such warmup."""
        import ast

        r, s = self.r, self.s
        mod = "sglang.srt.entrypoints.http_server"
        if "Start of pd disaggregation warmup" not in r.source(mod):
            return False
        function = next(n for n in ast.walk(r.tree(mod))
                        if isinstance(n, ast.FunctionDef) and n.name == "_execute_server_warmup")
        request = next(n for n in ast.walk(function) if isinstance(n, ast.Dict)
                       and any(isinstance(k, ast.Constant) and k.value == "bootstrap_host" for k in n.keys))
        fake = next(ast.literal_eval(n.value) for n in r.tree("sglang.srt.disaggregation.utils").body
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FAKE_BOOTSTRAP_HOST"
                                                         for t in n.targets))
        json_data: Any = r.message_of(mod, request)(FAKE_BOOTSTRAP_HOST=fake, dp_size=s.spec.dp_size,
                                                    tp_size=s.spec.tp_size)  # (the dict, evaluated)
        CLOCK.at(at)
        s.configure("")
        log = logging.getLogger(mod)
        log.info(r.message(mod, "Start of pd disaggregation warmup")())
        s.note("warmup", mod, "Start of pd disaggregation warmup")
        cls = self.io.GenerateReqInput
        fields = {f.name for f in dataclasses.fields(cls)}
        with drawn_uuids(f"{s.spec.node}-warmup-{at}"):
            obj = cls(**{k: v for k, v in json_data.items() if k in fields})
            obj.normalize_batch_and_arguments()
        assert isinstance(obj.rid, list) and len(obj.rid) == s.spec.dp_size, obj.rid
        self.request_logger.log_received_request(obj)
        output = 8 if s.role == "decode" else 1
        answers = []
        with self._answered_elsewhere():  # (one POST: its access line below)
            for i in range(s.spec.dp_size):
                item = obj[i]
                self._finish(item, item.rid, len(item.input_ids), output, None, at + 0.05 + 0.01 * i)
                meta = {"id": item.rid, "finish_reason": self.finish.FINISH_LENGTH(length=output).to_json(),
                        "prompt_tokens": len(item.input_ids), "completion_tokens": output, "cached_tokens": 0,
                        "e2e_latency": 0.5}
                answers.append({"text": "", "output_ids": [1] * output, "meta_info": meta})
        self._access(200)
        CLOCK.at(at + 0.1)
        s.configure("")
        done = next(m for m in ("Disaggregation warmup request completed", "End of prefill disaggregation mode warmup")
                    if m in r.source(mod))
        log.info(r.message(mod, done)(status_code=200, json=lambda: answers))
        s.note("warmup_done", mod, done)
        if "End of disaggregation warmup" in r.source(mod):
            log.info(r.message(mod, "End of disaggregation warmup")())
        return True

    def _health_check(self, at: float, busy: bool) -> None:
        """A probe of ``/health_generate`` (``health_generate`` in ``entrypoints/http_server.py``):
        the release's own rid (``HEALTH_CHECK_`` and the time, or from 0.5.23 a uuid4 hex) and
        sampling parameters, one token ``[0]``, ``log_metrics=False``, bootstrap host 2.2.2.2 and
        room 0 (a disaggregated server's); logged by the request logger as it arrives. An idle
        scheduler runs it: one token out, its finish logged; a busy one skips it
        (``is_health_check_generate_req`` and not ``is_fully_idle``): no finish line. Either way the
        handler answers 200 after its first one-second sleep: uvicorn's ``GET`` access line."""
        import ast
        import uuid

        r, s = self.r, self.s
        mod = "sglang.srt.entrypoints.http_server"
        handler = next(n for n in ast.walk(r.tree(mod)) if isinstance(n, ast.AsyncFunctionDef)
                       and n.name == "health_generate")
        assigned = {n.targets[0].id: n.value for n in ast.walk(handler) if isinstance(n, ast.Assign)
                    and isinstance(n.targets[0], ast.Name) and n.targets[0].id in ("rid", "sampling_params")}
        prefix = next((ast.literal_eval(n.value) for n in r.tree("sglang.srt.constants").body
                       if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "HEALTH_CHECK_RID_PREFIX"),
                      None) if r.has("sglang.srt.constants") else None
        fake = next(ast.literal_eval(n.value) for n in r.tree("sglang.srt.disaggregation.utils").body
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "FAKE_BOOTSTRAP_HOST"
                                                         for t in n.targets))
        CLOCK.at(at)
        s.configure("")
        with drawn_uuids(f"{s.spec.node}-health-{at}"):
            rid = r.message_of(mod, assigned["rid"])(HEALTH_CHECK_RID_PREFIX=prefix, uuid=uuid,
                                                    time=types.SimpleNamespace(time=lambda: CLOCK.now))
        sampling = r.message_of(mod, assigned["sampling_params"])()
        s.note("health_check", mod, "async def health_generate")
        cls = self.io.GenerateReqInput
        obj = cls(rid=rid, input_ids=[0], sampling_params=sampling, log_metrics=False)
        obj.bootstrap_host, obj.bootstrap_room = fake, 0
        obj.normalize_batch_and_arguments()
        self.health_rids.append(rid)
        self.request_logger.log_received_request(obj)
        if not busy:
            with self._answered_elsewhere():  # (its answer is the GET below)
                self._finish(obj, rid, 1, 1, None, at + 0.02)
        CLOCK.at(at + 1.0)
        s.configure("")
        self.access.info('%s - "%s %s HTTP/%s" %d', "10.0.0.5:47310", "GET", "/health_generate", "1.1", 200)

    def _request(self, rid: str, prompt: int, output: int, outcome: str, dp_rank: int, at: float) -> None:
        s, r = self.s, self.r
        room = room_of(rid)
        CLOCK.at(at)
        s.configure("")
        name, (text, answer) = rid, self.texts.get(rid, (None, ""))
        if self.assign_rids:
            with drawn_uuids(f"{s.spec.node}-{name}"):
                obj = self._obj(None, prompt, output, room, HOSTS["prefill"], text)
            rid = self.assigned[name] = obj.rid
            assert rid == assigned_rid(s.spec.node, name), (rid, name)  # (the texts name it in advance)
        else:
            obj = self._obj(rid, prompt, output, room, HOSTS["prefill"], text)
        self._objs[rid] = obj
        if outcome == "over_context":
            self._context_rejection(obj, prompt, at)
            return
        self.request_logger.log_received_request(obj)
        CLOCK.at(at + 0.01)
        req = self._req(rid, prompt, room)
        # (decode takes the prefill's count with the KV: ``cached_tokens`` in the transfer's metadata)
        req.cached_tokens = cached_tokens(name, prompt, self.scenario)
        if req.cached_tokens:
            self._note_prefix_cache()
        ts = req.time_stats
        aborted: dict[str, Any] | None = None
        schedulers = s.schedulers(dp_rank)
        t = at + 0.01
        if s.role == "prefill":
            ts.prefill_bootstrap_queue_entry_time = CLOCK.perf()
            if hasattr(ts, "bootstrap_done_time"):
                ts.bootstrap_done_time = CLOCK.perf() + 0.004
            if outcome == "over_pool":
                aborted = self._validate(req, schedulers)
                if retires(r):  # retired at the bootstrap queue: never prefilled nor sent
                    self._retired(req, schedulers, at + 0.05)
                    self._finish(obj, rid, 1, 0, aborted, at + 0.05)
                    return
            t += 0.005
            ts.wait_queue_entry_time = PERF0 + t
            ts.forward_entry_time = PERF0 + t + 0.002
            t += 0.002 + (0.001 if aborted else prompt / 200_000)
            ts.completion_time = PERF0 + t
            ts.prefill_transfer_queue_entry_time = PERF0 + t
            if hasattr(ts, "transfer_total_mb"):
                ts.transfer_total_mb = len(req.origin_input_ids) * 0.0625
                ts.transfer_speed_gb_s = 18.4
            # (0.5.20 aborts the stub after its forward, before the send: no output token, nothing sent)
            req.output_ids = [] if aborted and aborts_after_forward(r) else [1]
            if outcome == "bootstrap_failed":
                self._bootstrap_failed(req, room, schedulers, at + 0.01)
                self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500),
                             CLOCK.now - CLOCK.epoch + 0.01)
                return
            if outcome == "transfer_failed":
                CLOCK.at(t + 0.2)
                self._transfer_failed(req, room, schedulers, "prefill")
                self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.21)
                return
            CLOCK.at(t)
            for prefix in schedulers:
                s.configure(prefix)
                req.has_log_time_stats = False
                self._log_time_stats(req)
            s.configure("")
            self._finish(obj, rid, len(req.origin_input_ids), len(req.output_ids), aborted, t + 0.001,
                         cached=req.cached_tokens)
            return
        # decode
        ts.decode_prealloc_queue_entry_time = PERF0 + t
        ts.decode_transfer_queue_entry_time = PERF0 + t + 0.003
        if marks_bootstrap_done(r):  # (the handshake done 1 ms in, the pages taken 2 ms after it)
            ts.bootstrap_done_time = PERF0 + t + 0.001
        if outcome == "over_pool" and retires(r):
            CLOCK.at(t + 0.3)
            self._transfer_failed(req, room, schedulers, "decode", reason="Prefill bootstrap failed")
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.31)
            return
        if outcome == "over_pool" and aborts_after_forward(r):
            # the prefill's sender aborts without telling decode (CommonKVSender.abort): decode
            # waits for the KV until its waiting timeout fails the transfer (300 s by default;
            # the run sets SGLANG_DISAGGREGATION_WAITING_TIMEOUT to keep its lines in time order)
            wait = WAITING_TIMEOUT
            CLOCK.at(t + wait)
            reason = r.message(self._conn(), "in KVPoll.WaitingForInput")(bootstrap_room=room, elapsed=wait)
            self.s.note("decode_waiting_timeout", self._conn(), "in KVPoll.WaitingForInput")
            self._transfer_failed(req, room, schedulers, "decode", reason=reason)
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + wait + 0.01)
            return
        if outcome == "decode_restart":  # its KV lands, it decodes, the process dies: nothing more of it
            first, crash = t + 0.003 + prompt / 400_000 + 0.02 + 0.001 + STEP, t + 0.15
            self._decode_steps(dp_rank, first, min(output - 1, max(0, int((crash - first) / STEP) + 1)))
            CLOCK.at(t + 0.15)
            self.startup()  # (the server started again: server_args, the pool line, uvicorn, its warmup)
            self.warmup(t + 0.2)
            return
        if outcome == "bootstrap_failed":
            self._bootstrap_failed(req, room, schedulers, t + 0.05)
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.06)
            return
        if outcome == "transfer_failed":
            CLOCK.at(t + 0.25)
            self._transfer_failed(req, room, schedulers, "decode")
            self._finish(obj, rid, prompt, 0, self._abort_json(self._last_error, 500), t + 0.26)
            return
        if outcome in ("room_mismatch", "checksum_mismatch") and self._integrity(req, room, outcome, schedulers, t):
            return
        t += 0.003 + prompt / 400_000 + 0.02
        ts.wait_queue_entry_time = PERF0 + t
        ts.forward_entry_time = PERF0 + t + 0.001
        self._decode_steps(dp_rank, t + 0.001 + STEP, output - 1)
        for k in range(RETRACTED.get(rid, 0)):
            self._retracted(schedulers, t + 0.001 + (output // 2 + k) * STEP)
        t += 0.001 + output * STEP
        ts.completion_time = PERF0 + t
        req.output_ids = [1] * output
        CLOCK.at(t)
        for prefix in schedulers:
            s.configure(prefix)
            self._log_time_stats(req)
        s.configure("")
        self._finish(obj, rid, prompt, output, None, t + 0.002, text=answer, cached=req.cached_tokens,
                     retractions=RETRACTED.get(rid, 0))

    def _retracted(self, schedulers: list[str], at: float) -> None:
        """The decode scheduler retracts one request because its pool is full
        (``Scheduler.update_running_batch``): its line, on every scheduler of the DP rank
        (``Printer.retracted``)."""
        CLOCK.at(at)
        self.retracted(1, schedulers)
        self.s.configure("")

    def _note_prefix_cache(self) -> None:
        """Where the release computes a prefix-cache hit (:func:`cached_tokens`), for SOURCE.json."""
        note = self.s.note
        note("prefix_cache_limit", "sglang.srt.managers.schedule_batch", "max_prefix_len = input_len - 1")
        for marker in ("len(key) // self.page_size * self.page_size", "len(self) // page_size * page_size"):
            note("prefix_cache_page_aligned", "sglang.srt.mem_cache.radix_cache", marker)
        note("prefix_cache_count", "sglang.srt.managers.schedule_batch", "cached_tokens += ")
        if self.s.role == "decode":  # (the prefill's count, from the transfer's metadata)
            note("decode_cached_tokens", "sglang.srt.disaggregation.decode", "req.cached_tokens = cached_tokens")

    def _retired(self, req: Any, schedulers: list[str], at: float) -> None:
        """A request retired at the prefill bootstrap queue (0.5.21 on:
        ``retire_unadmitted_request``) is still finished and streamed, so with time-stats logging
        its line is printed, by the first scheduler of its TP group only (``attn_tp_rank == 0``),
        with the time stats as the retirement leaves them: no attempt, no output, no time set
        (the queue's entry time is stamped only after ``add`` returns)."""
        CLOCK.at(at)
        req.time_stats = self.time_stats(disagg_mode=self.dm.PREFILL)
        req.prefill_attempt_count = 0
        req.output_ids = []
        self.s.configure(schedulers[0])
        self._log_time_stats(req)
        self.s.configure("")
        self.s.note("retired_time_stats", "sglang.srt.disaggregation.prefill", "retire_unadmitted_request")

    def _integrity(self, req: Any, room: int, outcome: str, schedulers: list[str], t: float) -> bool:
        """A decode-side integrity check that fails, where the release has it; False where not
        (the request is then served as any other)."""
        mod = "sglang.srt.disaggregation.decode"
        src = self.r.source(mod)
        if outcome == "room_mismatch":
            if "Context corruption detected" not in src:
                return False
            first = self.r.message(mod, "Context corruption detected")
            line = first(rid=req.rid, expected_room=room, actual_room=room + 1, idx=3)
            abort = "Metadata corruption detected - bootstrap_room mismatch"
            self.s.note("room_mismatch", mod, "Context corruption detected")
        else:
            if "KV checksum mismatch req=" not in src:
                return False
            line = self.r.message(mod, "KV checksum mismatch req=")(
                rid=req.rid, bootstrap_room=room, expected=0x5A17C0DE, actual=0x5A17C0DF)
            abort = "KV checksum mismatch"
            self.s.note("checksum_mismatch", mod, "KV checksum mismatch req=")
        CLOCK.at(t + 0.05)
        for prefix in schedulers:
            self.s.configure(prefix)
            logging.getLogger(mod).error(line)
        self._finish(self._obj_of(req), req.rid, len(req.origin_input_ids), 0, self._abort_json(abort, 500), t + 0.06)
        return True


#: The rotated run: the scenario's arrivals spread this many times wider (08:16 to 10:26), so that
#: the hourly ``TimedRotatingFileHandler`` of ``--log-requests-target`` rolls each file over twice
ROTATION_SCALE = 500
#: The releases given a rotated run: the first with target files (bare JSON lines in them, to 0.5.11)
#: and the newest (``[time] {...}``, from 0.5.12). The handler is the same call in every release
#: from 0.5.8 to 0.5.23 (``utils/log_utils.py:40``); a run for each would cost ~110 KB of fixtures.
ROTATED = ("0.5.8", "0.5.23")


def rotated_run(release: Release, out: Path, sources: dict[str, str]) -> dict[str, Any]:
    """The scenario, its arrivals :data:`ROTATION_SCALE` times apart, printed in the JSON form to
    ``--log-requests-target`` folders (``out/<node>/``) through the release's own
    ``TimedRotatingFileHandler`` (``when="H"``, ``backupCount=0``: ``utils/log_utils.py``),
    whose rollover runs on the run's clock and names each piece ``HOST_RANK.log.%Y-%m-%d_%H``;
    then every rotated piece but the newest gzipped, as an operator's logrotate does
    (``compress``, ``delaycompress``). What it printed, for SOURCE.json's ``rotated``."""
    scenario = [(rid, p, o, outcome, dp, at * ROTATION_SCALE) for rid, p, o, outcome, dp, at in SCENARIO]
    start_clock(SETUP)
    pieces = {}
    for role in ("prefill", "decode"):
        target = out / f"{role}-0"
        server = Server(release, SPECS[role], SETUP, "json", target)
        server.note("request_target_rotation", "sglang.srt.utils.log_utils", "TimedRotatingFileHandler(")
        printer = Scenario(server, scenario)
        printer.play()
        (out / f"{role}-0.log").write_text(server.out.getvalue(), encoding="utf-8")
        close_targets(printer)
        pieces[f"{role}-0"] = logrotate(target)
        sources.update(server.sources)
    return {"folder": out.name, "arrivals_scaled_by": ROTATION_SCALE, "pieces": pieces,
            "scenario": [dict(zip(("rid", "prompt_tokens", "output_tokens", "outcome", "decode_dp_rank", "at_s"), s,
                                  strict=True)) for s in scenario]}


def logrotate(folder: Path) -> list[str]:
    """Gzip every piece the handler rotated but the newest (``compress`` with ``delaycompress``;
    the gzip header without a name or time, so that a run prints the same bytes); the folder's
    files, oldest first."""
    import gzip

    rotated = sorted(p for p in folder.iterdir() if re.search(r"\.log\.\d{4}-\d\d-\d\d_\d\d$", p.name))
    assert len(rotated) >= 2, f"{folder}: the run should roll its target file over twice"
    for p in rotated[:-1]:
        p.with_name(f"{p.name}.gz").write_bytes(gzip.compress(p.read_bytes(), mtime=0))
        p.unlink()
    return sorted((p.name for p in folder.iterdir()), key=lambda n: (n.endswith(".log"), n))


#: The reuse run (:func:`reuse_run`): its folder, its releases (one of each era), the decode pool of
#: each DP rank (tokens: the over-long prompt of :data:`SCENARIO` and decode's 512-token admission
#: reserve fit in it, and it is smaller than the context), the long request first on the over-long
#: prompt's DP rank (a prompt prefill admits: under ``max_req_input_len``), and how much later the
#: rest of :data:`SCENARIO` comes (seconds: once that request is over on both servers)
REUSE_FOLDER = "text-reuse"
REUSE_RELEASES = ("0.5.11", "0.5.18", "0.5.20", "0.5.23")
REUSE_DECODE_POOL = 704_512
REUSE_FIRST = ("req-v", 650_000, 64, "served", 0, 2.0)
REUSE_SHIFT = 6.0
#: The reuse run's probes of ``/health_generate`` on both servers, every few seconds: (seconds, whether
#: the servers are busy then: the long request in prefill's forward and in decode's steps)
REUSE_HEALTH = ((4.0, True), (7.0, False), (17.0, False), (23.0, False))


def reuse_scenario() -> list[tuple[str, int, int, str, int, float]]:
    """:data:`REUSE_FIRST`, then :data:`SCENARIO` :data:`REUSE_SHIFT` seconds later."""
    return [REUSE_FIRST] + [(rid, p, o, outcome, dp, round(at + REUSE_SHIFT, 3))
                            for rid, p, o, outcome, dp, at in SCENARIO]


def reuse_run(release: Release, out: Path, sources: dict[str, str]) -> dict[str, Any]:
    """The scenario after one long request on the same decode DP pool as the over-long prompt,
    in the text form, the decode pool :data:`REUSE_DECODE_POOL` tokens: the long request's pages
    are written (its prompt by the transfer) and freed before the over-long prompt arrives, so
    that a release sending the one-token stub has decode read, besides pages never written,
    pages that request wrote (so many that no allocation order avoids them). What it printed,
    for SOURCE.json's ``reuse``."""
    scenario = reuse_scenario()
    start_clock(SETUP)
    out.mkdir(parents=True)
    checks: dict[str, list[str]] = {}
    for role in ("prefill", "decode"):
        spec = SPECS[role] if role == "prefill" else dataclasses.replace(SPECS[role], pool=REUSE_DECODE_POOL)
        server = Server(release, spec, SETUP, "text", None, out=Lines())  # (a probe inside a request's lines)
        printer = Scenario(server, scenario, health=REUSE_HEALTH)
        printer.play()
        (out / f"{role}-0.log").write_text(server.out.getvalue(), encoding="utf-8")
        sources.update(server.sources)
        checks[f"{role}-0"] = printer.health_rids
    return {"folder": out.name, "form": "text", "pool_tokens": {"prefill": POOL, "decode": REUSE_DECODE_POOL},
            "scenario": [dict(zip(("rid", "prompt_tokens", "output_tokens", "outcome", "decode_dp_rank", "at_s"), s,
                                  strict=True)) for s in scenario],
            "health_checks": _health(REUSE_HEALTH, checks)}


def _health(probes: tuple[tuple[float, bool], ...], rids: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The health checks of a run, for SOURCE.json: each probe's time, whether the servers were
    busy (no finish line), and the rid each server logged."""
    return [{"at_s": at, "busy": busy, "rids": {node: ids[n] for node, ids in rids.items()}}
            for n, (at, busy) in enumerate(sorted(probes))]


#: The decode servers of other layouts (:func:`batch_runs`): (folder, TP size, DP size: above 1 with
#: DP attention). At TP4 with DP attention DP2 each DP rank has two schedulers (DP0: TP0 and TP1,
#: DP1: TP2 and TP3); at TP2 without DP attention, one pool, TP0 its first scheduler and TP1 the other.
BATCH_LAYOUTS = (("text-all-schedulers", 4, 2), ("text-no-dp-attention", 2, 1))
#: What those servers are started with (where the release has the flag): every scheduler's metrics
BATCH_ARGS = (("enable_metrics", True), ("enable_metrics_for_all_schedulers", True))


def batch_runs(release: Release, folder: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """The served requests of :data:`SCENARIO` on a decode server of each of :data:`BATCH_LAYOUTS`,
    started with :data:`BATCH_ARGS`, in the text form, into ``folder/<layout>/decode-0.log``: its
    ``Decode batch`` lines from each DP rank's first scheduler and, where the release prints them
    with the flag (to 0.5.8: :func:`every_scheduler_logs_decode_batches`), from the others. What
    each printed, for SOURCE.json's ``batch_runs``."""
    scenario = [s for s in SCENARIO if s[3] == "served"]
    fields = server_args_fields(release)
    described = []
    for name, tp, dp in BATCH_LAYOUTS:
        out = folder / name
        out.mkdir(parents=True)
        start_clock(SETUP)
        args = tuple((k, v) for k, v in BATCH_ARGS if k in fields)
        server = Server(release, dataclasses.replace(SPECS["decode"], tp_size=tp, dp_size=dp, args=args), SETUP,
                        "text", None)
        printer = Scenario(server, scenario)
        printer.play()
        (out / "decode-0.log").write_text(server.out.getvalue(), encoding="utf-8")
        sources.update(server.sources)
        described.append({"folder": name, "role": "decode", "tp_size": tp, "dp_size": dp, "dp_attention": dp > 1,
                          "args": dict(args), "every_scheduler_prints": printer.every_scheduler,
                          "scenario": [dict(zip(("rid", "prompt_tokens", "output_tokens", "outcome", "decode_dp_rank",
                                                 "at_s"), s, strict=True)) for s in scenario]})
    return described


#: The hostile run: no client gives a rid (each server assigns its own), and the prompts and
#: outputs hold text that looks like log lines. (name, prompt tokens, output tokens, outcome,
#: decode DP rank, arrival seconds)
HOSTILE = [
    ("evil-receive", 1500, 24, "served", 0, 2.0),
    ("evil-fail", 3100, 16, "transfer_failed", 0, 4.0),
    ("evil-context", 1_300_000, 8, "over_context", 1, 5.0),
    ("evil-pool", 700_000, 8, "over_pool", 1, 6.0),
    ("evil-long", 800, 40, "served", 0, 7.0),
]
#: The releases given a hostile run, and its sets: (form, --log-requests-level, whether
#: ``evil-long``'s output is the ~150 KB line: printed whole at level 3, once in all the fixtures).
#: 0.5.11: JSON to target files, bare (no time of their own), each string cut to 2,048 characters;
#: 0.5.23: the text form, nothing cut. (Fixtures cost: ~100 and ~260 KB.)
HOSTILE_SETS = {"0.5.11": (("json", 2, False),), "0.5.23": (("text", 3, True),)}
#: The hostile runs' probes of ``/health_generate`` on both servers, both while they are idle (each
#: printed before the next request: a --log-requests-target file is written in the order printed)
HOSTILE_HEALTH = ((3.0, False), (9.0, False))
#: In every user text: what a test looks for in printed output
USER_MARK = "<<user text>>"


def assigned_rid(node: str, name: str) -> str:
    """The rid ``node``'s server assigns request ``name`` (:func:`drawn_uuids`' first draw)."""
    import uuid

    return uuid.UUID(int=random.Random(f"{node}-{name}").getrandbits(128), version=4).hex


def room_of(name: str) -> int:
    """The bootstrap room the router gives request ``name`` (as :meth:`Scenario._request` does)."""
    return 9_000_000_000 + sum(map(ord, name)) * 7919


def hostile_texts(long: bool) -> dict[str, tuple[str, str]]:
    """Each hostile request's prompt and output: fake request-log lines (text and JSON) naming
    other requests by their rids and rooms, fake time stats, ``server_args``, pool, length,
    integrity and transfer-failure lines, access lines, a KV pool's layout lines, quotes, CR/LF,
    NUL, ANSI escapes, the Unicode line separators a JSON dump leaves raw; times in 2031, outside
    the run."""
    other = {n: (assigned_rid("prefill-0", n), assigned_rid("decode-0", n), room_of(n)) for n, *_ in HOSTILE}
    p_rid, d_rid, room = other["evil-fail"]
    lines = [
        f"[2031-01-01 00:00:01] Receive: obj=GenerateReqInput(rid='{p_rid}', sampling_params={{'max_new_tokens': 9}}, "
        f"bootstrap_host='10.0.0.11', bootstrap_room={room})",
        f"[2031-01-01 00:00:02] Finish: obj=GenerateReqInput(rid='{d_rid}', bootstrap_room={room}), out={{'meta_info': "
        f"{{'id': '{d_rid}', 'finish_reason': {{'type': 'abort', "
        "'message': 'KV checksum mismatch', 'status_code': 500}, "
        "'prompt_tokens': 5, 'completion_tokens': 0}}",
        f'{{"timestamp": "2031-01-01T00:00:03.000000", "event": "request.finished", "rid": "{d_rid}", "obj": {{"rid": '
        f'"{d_rid}", "bootstrap_room": {room}}}, "out": {{"meta_info": {{"id": "{d_rid}", "finish_reason": {{"type": '
        '"abort", "message": "x", "status_code": 500}, "prompt_tokens": 5, "completion_tokens": 0}}}',
        f"[2031-01-01 00:00:04 DP1 TP1] ReqTimeStats(rid={d_rid}, bootstrap_room={room}, input_len=5, output_len=0, "
        "entry_time=1924992004.000, type=decode)",
        "[2031-01-01 00:00:05] server_args=ServerArgs(disaggregation_mode='prefill', page_size=1, context_length=8)",
        "[2031-01-01 00:00:06 TP0] max_total_num_tokens=64, chunked_prefill_size=8, max_prefill_tokens=8, "
        "max_running_requests=1, context_len=8, available_gpu_mem=1.00 GB",
        f"[2031-01-01 00:00:07 TP0] Decode transfer failed for request rank=0 req.rid='{d_rid}' "
        f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
        "Failed to get kvcache from prefill instance, it might be dead",
        f"[2031-01-01 00:00:08 TP0] Input length (900000 tokens) exceeds the maximum allowed length (681278 tokens). "
        f"Use a shorter input or enable --allow-auto-truncate. self.rid='{p_rid}'",
        f"[2031-01-01 00:00:09 TP0] Context corruption detected: Request {d_rid} (index 3) expected bootstrap_room "
        f"{room}, got {room + 1}",
        "[2031-01-01 00:00:10] [http_server] Error: The input (2000000 tokens) is longer than the model's context "
        "length (1048576 tokens).",
        'INFO:     10.0.0.2:51822 - "POST /generate HTTP/1.1" 500 Internal Server Error',
        "[2031-01-01 00:00:11 TP0] Use sliding window memory pool. full_layer_tokens=64, swa_layer_tokens=32",
        "[2031-01-01 00:00:12 TP0] Mamba Cache is allocated. max_mamba_cache_size: 1, conv_state size: 0.01GB, "
        "ssm_state size: 0.01GB ",
    ]
    seps = ["\n", "\r\n", "\r", "\x00", "\u2028", "\x85", "\x1b[31m", "\n\x1b[0m", "\u2029", "\x0b"]
    fake = [f"{line}{seps[i % len(seps)]}" for i, line in enumerate(lines)]
    quoted = f"{USER_MARK} it's a \"quoted\" 'log' \\ {{braces}} (parens) [brackets], rid='req-a1' "
    out = {}
    for n, (name, *_rest) in enumerate(HOSTILE):  # (each prompt and output three of the fake lines, in turn)
        prompt = quoted + "".join(fake[(3 * n + k) % len(fake)] for k in range(3))
        answer = f"{USER_MARK} " + "".join(fake[(3 * n + 5 + k) % len(fake)] for k in range(3)) + quoted
        if name == "evil-long":
            size = 150_000 if long else 3_000
            whole = quoted + "".join(fake)
            answer = (whole * (size // len(whole) + 1))[:size]
        out[name] = (prompt, answer)
    return out


def hostile_runs(release: Release, folder: Path, sources: dict[str, str]) -> list[dict[str, Any]]:
    """The hostile run through the release's request logger at each of its sets'
    ``--log-requests-level`` (:data:`HOSTILE_SETS`), into ``folder/hostile-<form>-level<L>``
    (the JSON form to ``--log-requests-target`` folders where the release has them). Each set,
    for SOURCE.json's ``hostile``."""
    described = []
    for form, level, long in HOSTILE_SETS.get(release.version, ()):
        out = folder / f"hostile-{form}-level{level}"
        texts = hostile_texts(long)
        start_clock(SETUP)
        checks: dict[str, list[str]] = {}
        for role in ("prefill", "decode"):
            target = out / f"{role}-0" if form == "json" and has_targets(release) else None
            server = Server(release, SPECS[role], SETUP, form, target, level=level)
            printer = Scenario(server, HOSTILE, texts, assign_rids=True, health=HOSTILE_HEALTH)
            printer.play()
            checks[f"{role}-0"] = printer.health_rids
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{role}-0.log").write_text(server.out.getvalue(), encoding="utf-8")
            close_targets(printer)
            sources.update(server.sources)
        described.append({"folder": out.name, "form": form, "log_requests_level": level,
                          "longest_line_chars": len(texts["evil-long"][1]) if level == 3 else None,
                          "health_checks": _health(HOSTILE_HEALTH, checks)})
    return described


def vary(seed: int) -> None:
    """Another run of the same shape: request ids, prompt and output lengths, DP ranks and
    arrival times drawn from ``seed`` (each outcome keeps a prompt length that gives it)."""
    rng = random.Random(seed)
    at, out = 2.0, []
    for rid, prompt, output, outcome, _, _ in SCENARIO:
        if outcome == "over_pool":
            prompt = rng.randrange(MAX_REQ_INPUT_LEN + 1, min(CONTEXT, DECODE_POOL) - 1)
        elif outcome == "over_context":
            prompt = rng.randrange(CONTEXT, 2 * CONTEXT)
        else:
            prompt = rng.randrange(16, 60_000)
        output = rng.randrange(1, 200)
        out.append((f"{rid}-{rng.randrange(16**6):06x}", prompt, output, outcome, rng.randrange(2), round(at, 3)))
        at += 0.05 + prompt / 400_000 + output * 0.012 + rng.uniform(0.5, 1.5)
    renamed = {old[0]: new[0] for old, new in zip(SCENARIO, out, strict=True)}
    hits = {renamed[rid]: (renamed[earlier], shared) for rid, (earlier, shared) in PREFIXES.items()}
    SCENARIO[:] = out
    PREFIXES.clear()
    PREFIXES.update(hits)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=Path("tests/adapters/releases"))
    parser.add_argument("--seed", type=int, help="another run of the same shape (scripts/check_sglang_releases.py)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seed is not None:
        vary(args.seed)
    if args.one:
        run(Release(args.wheels[0]), args.out)
        return 0
    seed = ["--seed", str(args.seed)] if args.seed is not None else []
    for wheel in args.wheels:
        done = subprocess.run([sys.executable, __file__, "--one", "--out", str(args.out), *seed, str(wheel)],
                              check=False)
        print(f"{wheel.name}: {'ok' if done.returncode == 0 else 'FAILED'}")
        if done.returncode:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
