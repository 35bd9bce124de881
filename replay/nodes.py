"""Replaying a case's nodes a chunk at a time: in this process, or, for a large case, spread over
worker processes (one a core), each replaying whole chunks.

A node's replay reads nothing of another node's (its requests' plans come with its records), so
nodes replay apart. A chunk is a run of nodes in node order, closed once it holds
:data:`CHUNK_ROWS` records: it depends on the case alone, never on how many processes replay it,
and each chunk writes its own files of the replayed log set (``part-CCCCC-NNNNN.jsonl``). So the
replayed set is the same files, byte for byte, whichever way it was made.

A worker reads its chunks' records from files the replay writes first (Arrow IPC, in the replay's
folder while it runs: ``.inputs``), not from the case: a DuckDB database is open in one process at
a time. Each worker starts from a fresh interpreter (``forkserver``), never a copy of this process
with the case's database open in it."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import shutil
import signal
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import forkserver
from pathlib import Path
from types import FrameType
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from forensics import compiled
from forensics.errors import BadOption
from replay import decode_fast
from replay.configs import WhatIf
from replay.drive import replay_node
from replay.engine import Disagreement, NodeConfig, NodeEngine, Plan, Request
from replay.events import ByNode, NodeQueries, NodeReader, node_statement, prepare
from replay.logset import LogSet
from replay.schedule import Schedule, StepClock
from replay.scratch import BATCH, reader

log = logging.getLogger(__name__)

#: A chunk of nodes is closed once it holds this many records (request, transfer and step).
CHUNK_ROWS = 1 << 14
#: The memory limits a query of the workers' inputs is run again under, in turn, where it ran out of
#: the replay's own (:func:`_export`).
EXPORT_MEMORY = ("1GiB", "2GiB")
#: Below this much work in all (records weighted by their node's role, :data:`_WEIGHT`: about 3 s
#: of it), the nodes are replayed in this process: a worker's start (a fresh interpreter importing
#: the engine) costs about a second.
PARALLEL_FROM = 1 << 17
#: The environment variable that sets how many processes replay a case's nodes (default: one a core).
JOBS_VARIABLE = "KVFORENSICS_JOBS"
#: Where a parallel replay keeps its workers' inputs while it runs, in its folder.
INPUTS = ".inputs"
#: What a row of each role costs, roughly, relative to a router's: a decode node's records drive
#: its steps (measured at 25,000 requests: 160, 68 and 26 us a record). Only the order chunks are
#: handed out in depends on it, never what they give.
_WEIGHT = {"decode": 6, "prefill": 3}


def default_jobs() -> int:
    """The processes a replay uses unless told: :data:`JOBS_VARIABLE`, or one a core it may run on."""
    told = os.environ.get(JOBS_VARIABLE, "").strip()
    if told:
        try:
            jobs = int(told)
        except ValueError:
            raise BadOption(f"{JOBS_VARIABLE}={told!r}: not a whole number of processes") from None
        if jobs < 1:
            raise BadOption(f"{JOBS_VARIABLE}={told!r}: at least 1 process")
        return jobs
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass
class Tally:
    """What the replay of some nodes found, added up over chunks in node order."""

    records: int = 0
    disagreements: list[Disagreement] = field(default_factory=list)
    ambiguous: int = 0  # events whose step count the evidence left undecided
    ambiguous_nodes: set[str] = field(default_factory=set)
    step_records: int = 0
    step_records_unchecked: int = 0
    step_records_undecided: int = 0
    guesses: dict[str, int] = field(default_factory=dict)  # prefill: cached prompts guessed, by node
    cache_flushes: int = 0  # SGLang's flush_cache read and applied: a node's pool started afresh
    #: (node, request) of the readers the replay could not give their pages (NodeEngine.unsupplied)
    unsupplied: list[tuple[str, str]] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.records += other.records
        self.disagreements += other.disagreements
        self.ambiguous += other.ambiguous
        self.ambiguous_nodes |= other.ambiguous_nodes
        self.step_records += other.step_records
        self.step_records_unchecked += other.step_records_unchecked
        self.step_records_undecided += other.step_records_undecided
        self.cache_flushes += other.cache_flushes
        self.unsupplied += other.unsupplied
        for node, n in other.guesses.items():
            self.guesses[node] = self.guesses.get(node, 0) + n

    @classmethod
    def of(cls, records: int, disagreements: list[Disagreement], clocks: list[StepClock],
           engines: list[NodeEngine]) -> Tally:
        guesses: dict[str, int] = {}
        for e in engines:
            if e.prefix_guesses:
                guesses[e.config.node] = guesses.get(e.config.node, 0) + e.prefix_guesses
        return cls(records, disagreements, sum(c.ambiguous for c in clocks), {c.node for c in clocks if c.ambiguous},
                   sum(c.step_records for c in clocks), sum(c.step_records_unchecked for c in clocks),
                   sum(c.step_records_undecided for c in clocks), guesses, sum(e.flushes for e in engines),
                   [(e.config.node, rid) for e in engines for rid in e.unsupplied])


@dataclass(frozen=True)
class Common:
    """What every chunk's replay is given alike."""

    engine: str
    what_if: WhatIf
    unlogged: dict[str, tuple[Request, Plan, str]]
    confirm: bool
    schedule: Schedule
    resolution: dict[str, int]  # each node's times' resolution in ns (NodeQueries.resolution)


@dataclass(frozen=True)
class Chunk:
    """A run of nodes in node order, with what their replay is given of its own."""

    index: int
    nodes: tuple[str, ...]
    configs: dict[str, list[tuple[int, int, str, NodeConfig]]]
    roles: dict[str, str | None]
    extra: dict[str, list[dict[str, Any]]]
    weight: int  # records, weighted by role (_WEIGHT): the order chunks are handed out in
    run: int = 0  # which of the replays run together it is a chunk of (replay_nodes's ``runs``)
    #: its decode nodes replayed by the compiled kernel where it covers them (replay/decode_fast.py)
    fast: frozenset[str] = frozenset()


def chunked(nodes: list[str], rows: dict[str, int]) -> list[list[str]]:
    """``nodes`` (in order) as runs, each closed once it holds :data:`CHUNK_ROWS` of ``rows``."""
    chunks: list[list[str]] = []
    current: list[str] = []
    held = 0
    for node in nodes:
        current.append(node)
        held += rows.get(node, 0)
        if held >= CHUNK_ROWS:
            chunks.append(current)
            current, held = [], 0
    if current:
        chunks.append(current)
    return chunks


def work(nodes: list[str], rows: dict[str, int], roles: dict[str, str]) -> int:
    """The work of replaying ``nodes`` (``rows``: each one's records; ``roles``: the engine nodes'
    roles): their records, weighted by role (:data:`_WEIGHT`)."""
    return sum(rows.get(n, 0) * _WEIGHT.get(roles.get(n, ""), 1) for n in nodes)


def spreads(nodes: list[str], rows: dict[str, int], roles: dict[str, str], jobs: int, runs: int = 1) -> bool:
    """Whether ``nodes`` (in order; ``rows``: each one's records), replayed ``runs`` times (under as
    many schedules), are replayed over worker processes: where ``jobs`` allows more than one, their
    :func:`work` is :data:`PARALLEL_FROM` or more, and they make more than one chunk. (A replay under
    another schedule of two decode nodes of 31,000 records each and the router's 25,000 had taken
    8.5 s in one process, by their records alone.)"""
    return (jobs > 1 and runs * work(nodes, rows, roles) >= PARALLEL_FROM
            and runs * len(chunked(nodes, rows)) > 1)


def start_fork_server() -> None:
    """Start the process the workers are forked from, now: it imports this module (the engine,
    numpy, numba, DuckDB, Arrow: about a second) while this process plans the requests and writes
    the workers' inputs, instead of after (``forkserver``: the pool starts it on its first worker
    otherwise), and loads the engine's compiled kernels (replay/preload.py). Once a process: a
    server already running is kept. Where the compiled decode node is not cached yet, its compile
    (about 100 s, in the server, which the workers wait for) is said first (forensics.compiled)."""
    compiled.announce("decode nodes")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "replay.preload"])
    forkserver.ensure_running()


def replay_nodes(con: duckdb.DuckDBPyConnection, nodes: list[str], rows: dict[str, int],
                 configs: dict[str, list[tuple[int, int, str, NodeConfig]]], roles: dict[str, str],
                 runs: Sequence[tuple[Common, Path]], extra: dict[str, list[dict[str, Any]]], jobs: int,
                 blocked: frozenset[str] = frozenset()) -> list[Tally]:
    """Replay ``nodes`` (in order; ``rows``: each one's records) of the case open on ``con`` once for
    each of ``runs`` (what it is given alike, and the folder it writes into): in this process where
    ``jobs`` is 1 or the case is small, else over ``jobs`` worker processes, the chunks of every run
    in one pool (the nodes' rows read and written out for the workers once). What each run found.
    ``blocked``: decode nodes whose records the compiled kernel does not cover (decode_fast.blockers)."""
    chunks = [Chunk(i, tuple(run), {n: configs.get(n, []) for n in run}, {n: roles.get(n) for n in run},
                    {n: extra.get(n, []) for n in run}, work(run, rows, roles),
                    fast=frozenset(n for n in run if roles.get(n) == "decode" and n not in blocked
                                   and decode_fast.wanted(rows.get(n, 0))))
              for i, run in enumerate(chunked(nodes, rows))]
    tallies = [Tally() for _ in runs]
    if not spreads(nodes, rows, roles, min(jobs, len(runs) * len(chunks)), len(runs)):
        for tally, (common, logs) in zip(tallies, runs, strict=True):
            queries = NodeQueries(con, roles, common.resolution)
            try:
                for chunk in chunks:
                    tally.add(replay_chunk(queries, chunk, common, logs))
            finally:
                queries.close()
        return tallies
    inputs = runs[0][1].parent / INPUTS
    try:
        files = _export(con, roles, chunks, inputs)
        start_fork_server()  # (where the replay has not already)
        context = multiprocessing.get_context("forkserver")
        pool: ProcessPoolExecutor | None = None
        every = [dataclasses.replace(c, run=r) for r in range(len(runs)) for c in chunks]
        try:
            with _stops_held():  # (every worker is started, and known to the pool, before a stop is taken)
                pool = ProcessPoolExecutor(min(jobs, len(every)), mp_context=context, initializer=_start,
                                           initargs=(tuple(common for common, _ in runs),))
                handed = sorted(every, key=lambda c: (-c.weight, c.run, c.index))  # the largest first: they even out
                futures = {(c.run, c.index): pool.submit(_replay_from_files, c, files[c.index], runs[c.run][1])
                           for c in handed}
            for c in every:
                tallies[c.run].add(futures[c.run, c.index].result())
        except BaseException:  # (stopped, or a chunk failed: the others are not waited for)
            if pool is not None:
                _stop(pool)
            raise
        pool.shutdown()
    finally:
        shutil.rmtree(inputs, ignore_errors=True)
    return tallies


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """A stop (SIGINT, SIGTERM) that comes while the pool starts its workers, held back until they
    have all started, then taken as it came.

    The pool starts a worker as a chunk is submitted, and knows it once the fork server has said
    its process id. A stop taken between the two left a worker the pool did not know, so
    :func:`_stop` never ended it: it waited on its queue for good, holding the caller's stderr
    open. (Blocking the signals would not do: another thread of this process takes them, and
    Python runs the handler in the main thread all the same.) Only the main thread sets handlers:
    called from another, the stops are left as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        came.append(signum)

    before = {stop: signal.signal(stop, hold) for stop in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for stop, handler in before.items():  # (None: a handler set outside Python, which it cannot give back)
            signal.signal(stop, signal.SIG_DFL if handler is None else handler)
        if came:  # (its handler, given back, runs here: a stop raises now, inside the caller's try)
            signal.raise_signal(came[0])


def replay_chunk(queries: NodeReader, chunk: Chunk, common: Common, logs: Path) -> Tally:
    """Replay ``chunk``'s nodes in order, reading their records from ``queries`` (each of its
    ``events``, ``carried``, ``horizons`` and ``spans`` handing out a node's rows, as
    :class:`replay.events.NodeQueries` does), writing the chunk's files in ``logs``."""
    log = LogSet(into=logs, packed=True, part=f"part-{chunk.index:05d}")
    disagreements: list[Disagreement] = []
    clocks: list[StepClock] = []
    engines: list[NodeEngine] = []
    try:
        for node in chunk.nodes:
            replay_node(queries, node, chunk.configs[node], chunk.roles[node], common.engine, common.what_if, log,
                        common.unlogged, chunk.extra[node], common.confirm, disagreements, common.schedule,
                        clocks, engines, fast=node in chunk.fast)
            log.flush(node, logs)
    finally:
        log.close()
    return Tally.of(log.records, disagreements, clocks, engines)


_QUERIES = (("events", "node_events"), ("carried", "carried_ends"), ("horizons", "decode_horizons"),
            ("spans", "decode_spans"))


def _export(con: duckdb.DuckDBPyConnection, roles: dict[str, str], chunks: list[Chunk], into: Path
            ) -> list[dict[str, Path]]:
    """Each chunk's rows of the four queries a node's replay reads, in a file each (Arrow IPC),
    in order; the files by chunk and query (a query with no rows for a chunk has none).

    A query that runs out of the replay's memory (``replay.scratch.SCRATCH_MEMORY``: the node order's
    sort of every record a node replays grows with the case, about 300 MiB at 2.5 million) is run
    again from its start, its files begun anew, under each of :data:`EXPORT_MEMORY` in turn, and
    the raise is said (logger ``replay.nodes``); the limit the replay began with is restored when
    it ends (``replay.scratch.scratch``)."""
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    prepare(con, roles)
    files: list[dict[str, Path]] = [{} for _ in chunks]
    # the rows of the nodes replayed only: a replay of some nodes (``only``) reads no other's
    wanted = pa.array(sorted({node for chunk in chunks for node in chunk.nodes}), pa.string())
    for name, sql_name in _QUERIES:
        for more in (None, *EXPORT_MEMORY):  # (None: the replay's own limit)
            if more is not None:
                log.info("the replay's %s query ran out of memory; run again under %s", sql_name, more)
                con.execute(f"SET memory_limit = '{more}'")
            try:
                _export_query(con, name, sql_name, chunks, wanted, into, files)
                break
            except duckdb.OutOfMemoryException:
                for written in files:
                    if name in written:
                        written.pop(name).unlink(missing_ok=True)
                if more == EXPORT_MEMORY[-1]:
                    raise
    return files


def _export_query(con: duckdb.DuckDBPyConnection, name: str, sql_name: str, chunks: list[Chunk], wanted: pa.Array,
                  into: Path, files: list[dict[str, Path]]) -> None:
    """:func:`_export` of the query ``sql_name``: its rows of ``wanted`` nodes, each chunk's to its file
    (``files[chunk][name]``)."""
    last = [chunk.nodes[-1] for chunk in chunks]
    cur = reader(con)
    writer = None
    try:
        j = 0
        for batch in cur.sql(node_statement(sql_name)).to_arrow_reader(BATCH):
            batch = batch.filter(pc.is_in(batch.column(0), value_set=wanted))
            while batch.num_rows and j < len(chunks):
                # (the rows are in node order: those of chunk j come first, up to its last node)
                n = pc.sum(pc.cast(pc.less_equal(batch.column(0), last[j]), pa.int64())).as_py() or 0
                if n:
                    if writer is None:
                        files[j][name] = into / f"{j:05d}.{name}.arrows"
                        writer = pa.ipc.new_stream(files[j][name], batch.schema)
                    writer.write_batch(batch.slice(0, n))
                if n == batch.num_rows:
                    break
                batch = batch.slice(n)
                if writer is not None:
                    writer.close()
                    writer = None
                j += 1
    finally:
        if writer is not None:
            writer.close()
        cur.close()


class _FileQueries:
    """A chunk's rows of each query, read back from its files, handed out a node at a time."""

    def __init__(self, files: dict[str, Path], resolution: dict[str, int]) -> None:
        self.resolution = resolution
        self.events = ByNode(_batches(files.get("events")))
        self.carried = ByNode(_batches(files.get("carried")))
        self.horizons = ByNode(_batches(files.get("horizons")))
        self.spans = ByNode(_batches(files.get("spans")))


def _batches(path: Path | None) -> Iterator[pa.RecordBatch]:
    """The batches of an Arrow IPC file, as the replay's query gave them."""
    if path is None:
        return
    with pa.ipc.open_stream(pa.memory_map(str(path))) as stream:
        yield from stream


def _stop(pool: ProcessPoolExecutor) -> None:
    """End ``pool`` now: its queued chunks cancelled, its workers killed (what they wrote is in
    the replay's folder, which the next replay replaces)."""
    kill = getattr(pool, "kill_workers", None)  # (Python 3.14)
    if kill is not None:
        kill()
        return
    # Below 3.14, what ``kill_workers`` does: the workers are taken before ``shutdown``, which
    # forgets them (``_processes`` set to None), and killed after it.
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()  # (a worker ignores the stop signals: _start)
    for process in processes:
        process.join()


_COMMONS: tuple[Common, ...] = ()


def _start(commons: tuple[Common, ...]) -> None:
    """A worker's start: what every chunk of each run is given alike, once. A worker ignores the
    stop signals (SIGINT, SIGTERM): a Ctrl-C reaches the whole process group, and the replay's own
    process, which says what was stopped, ends its workers (``_stop``)."""
    global _COMMONS
    _COMMONS = commons
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_IGN)


def _replay_from_files(chunk: Chunk, files: dict[str, Path], logs: Path) -> Tally:
    """A worker's task: :func:`replay_chunk` of ``chunk`` (of its run), its rows read from ``files``."""
    common = _COMMONS[chunk.run]
    return replay_chunk(_FileQueries(files, common.resolution), chunk, common, logs)
