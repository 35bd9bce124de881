"""A case's nodes replayed in worker processes give what they give in one process: the same
replayed log set, file for file and byte for byte, and the same figures, disagreements and doubts
in the same order. The chunks of nodes depend on the case alone, never on the number of workers.

Each case is replayed twice, in this process (``jobs=1``) and over two workers (``jobs=2``), with
the chunks made small and the size below which a replay stays in one process set to nothing, so
that a small case runs in several chunks, some of several nodes, over both workers."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st
from independent_logs import Layout, generate, strip_pages

import forensics
import replay.nodes as nodes
from forensics.errors import BadOption
from replay.replay import ReplayResult, WhatIf, replay, replay_schedules
from replay.schedule import ALTERNATIVES
from replay.simulate import Deployment, simulate_to

#: Three decode and two prefill nodes, a step record every 10 decode steps, small pools.
DEPLOYMENT = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                        page_size=64, prefill_nodes=2, decode_nodes=3, step_log_interval=10)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes, "CHUNK_ROWS", 600)
    monkeypatch.setattr(nodes, "PARALLEL_FROM", 0)


def _files(result: ReplayResult) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((result.out / "logs").iterdir())}


def _figures(result: ReplayResult) -> dict:
    return {k: v for k, v in result.as_dict().items() if k != "out"}


def _both(db: Path, tmp: Path, engine: str = "sglang-placeholder", **options) -> ReplayResult:
    """``db`` replayed in this process and over two workers; the two held equal; the first."""
    one = replay(db, engine, tmp / f"{engine}-one", jobs=1, **options)
    two = replay(db, engine, tmp / f"{engine}-two", jobs=2, **options)
    assert _files(one) == _files(two)
    assert _figures(one) == _figures(two)
    return one


def _chunks(result: ReplayResult) -> int:
    """The chunks that wrote the replayed set (its files are named for them)."""
    return len({name.split("-")[1] for name in _files(result)})


def test_a_simulated_case_replays_the_same_over_workers(small_chunks: None, tmp_path: Path) -> None:
    simulate_to(tmp_path / "full", deployment=DEPLOYMENT, requests=300, seed=5)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    confirmed = _both(tmp_path / "bare.duckdb", tmp_path)
    assert confirmed.mode == "confirm" and confirmed.exposure["exposed_responses"] > 0
    assert confirmed.step_records > 50
    assert 3 <= _chunks(confirmed) < 6  # (six engine nodes and the router: some chunks hold several)
    # what-ifs: the fixed engine, and a prefill pool that holds the whole context window
    hardened = _both(tmp_path / "bare.duckdb", tmp_path, "sglang-hardened")
    assert hardened.mode == "what-if" and hardened.exposure["exposed_responses"] == 0
    _both(tmp_path / "bare.duckdb", tmp_path / "pool", what_if=WhatIf(prefill_pool_tokens=65_536))
    # and the replayed set is the simulated one, as a replay in one process gives it
    simulated = b"".join(f.read_bytes() for f in sorted((tmp_path / "full").iterdir()))
    assert b"".join(_files(confirmed).values()) == simulated


def test_a_workers_input_that_runs_out_of_memory_is_exported_again_under_more(
        small_chunks: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The workers' inputs: a query that runs out of the replay's memory after it wrote some of its
    files (node_events' sort did on 5 million records at 512 MiB) is run again from its start under
    the next of EXPORT_MEMORY, its files begun anew, and says so; the replayed set is the same bytes.
    Past the last limit the error is the replay's."""
    simulate_to(tmp_path / "full", deployment=DEPLOYMENT, requests=120, seed=3)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    before = replay(tmp_path / "bare.duckdb", "sglang-placeholder", tmp_path / "before", jobs=2)
    real = nodes._export_query
    limits: list[str] = []

    def short(con, name, sql_name, chunks, wanted, into, files, *, fails: int) -> None:
        limits.append(con.execute("SELECT current_setting('memory_limit')").fetchone()[0])
        real(con, name, sql_name, chunks, wanted, into, files)
        if name == "events" and len(limits) <= fails:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")

    monkeypatch.setattr(nodes, "EXPORT_MEMORY", ("1GiB", "2GiB"))
    monkeypatch.setattr(nodes, "_export_query", lambda *a: short(*a, fails=2))
    with caplog.at_level(logging.INFO, logger="replay.nodes"):
        after = replay(tmp_path / "bare.duckdb", "sglang-placeholder", tmp_path / "after", jobs=2)
    assert _files(after) == _files(before) and _figures(after)["exposure"] == _figures(before)["exposure"]
    assert limits[1:3] == ["1.0 GiB", "2.0 GiB"]  # (the events' query run three times, then the other three once)
    assert len(limits) == 6
    assert [r.getMessage() for r in caplog.records] == [
        "the replay's node_events query ran out of memory; run again under 1GiB",
        "the replay's node_events query ran out of memory; run again under 2GiB"]
    monkeypatch.setattr(nodes, "_export_query", lambda *a: short(*a, fails=99))
    with pytest.raises(duckdb.OutOfMemoryException):
        replay(tmp_path / "bare.duckdb", "sglang-placeholder", tmp_path / "never", jobs=2)


def test_doubts_and_disagreements_come_out_the_same_over_workers(small_chunks: None, tmp_path: Path) -> None:
    """The independent generator's drifting steps leave counts undecided; one step record changed
    gives a disagreement: both are counted and listed alike, in the same order."""
    layout = Layout(step_log=8, jitter_ns=300_000, ms_times=True)
    full = generate(tmp_path / "full", seed=3, requests=160, layout=layout)
    bare = strip_pages(full, tmp_path / "bare")
    decode = bare / "decode-1.jsonl"
    records = [json.loads(line) for line in decode.read_text().splitlines()]
    step = [r for r in records if r["kind"] == "step"][3]
    step["running"] += 1
    decode.write_text("".join(json.dumps(r) + "\n" for r in records))
    forensics.investigate([bare], tmp_path / "bare.duckdb")
    result = _both(tmp_path / "bare.duckdb", tmp_path)
    assert result.ambiguous_steps > 0 and result.ambiguous_nodes
    assert result.step_records_undecided + len([d for d in result.disagreements
                                                if d.kind == "step_record_differs"]) > 0
    assert _chunks(result) >= 2


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_other_schedules_replayed_in_one_pass_are_each_replay_alone(
        small_chunks: None, tmp_path: Path, jobs: int) -> None:
    """``replay_schedules`` (the whole job's replays under the other schedules the evidence allows,
    planned and read once, their chunks in one pool) gives, for each schedule, the files and figures
    of the replay under it alone, in one process and over workers; and the schedules do differ."""
    layout = Layout(step_log=8, jitter_ns=450_000, ms_times=True)
    full = generate(tmp_path / "full", seed=7, requests=160, layout=layout)
    forensics.investigate([strip_pages(full, tmp_path / "bare")], tmp_path / "bare.duckdb")
    db = tmp_path / "bare.duckdb"
    confirmed = replay(db, "sglang-placeholder", tmp_path / "confirmed", jobs=1)
    varied = frozenset(confirmed.ambiguous_nodes)
    assert varied
    together = replay_schedules(db, "sglang-placeholder", [(s, tmp_path / "together" / s.name) for s in ALTERNATIVES],
                                only=varied, jobs=jobs)
    for schedule, one in zip(ALTERNATIVES, together, strict=True):
        alone = replay(db, "sglang-placeholder", tmp_path / "alone" / schedule.name, schedule=schedule, only=varied,
                       jobs=1)
        assert _files(one) == _files(alone) and _files(one)
        assert _figures(one) == _figures(alone)
        assert one.schedule == schedule
    assert len({b"".join(_files(one).values()) for one in together}) > 1


def test_a_replay_killed_with_its_workers_inputs_left_is_replaced_by_the_next(
        small_chunks: None, tmp_path: Path) -> None:
    simulate_to(tmp_path / "full", deployment=DEPLOYMENT, requests=120, seed=6)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    out = tmp_path / "replayed"
    (out / nodes.INPUTS).mkdir(parents=True)  # as a kill mid-way leaves it
    (out / nodes.INPUTS / "00000.events.arrows").write_bytes(b"half a file")
    (out / "logs").mkdir()
    (out / "logs" / "part-00003-00000.jsonl").write_text('{"kind":"kv"')
    done = replay(tmp_path / "bare.duckdb", "sglang-placeholder", out, jobs=2)
    assert not (out / nodes.INPUTS).exists()
    again = replay(tmp_path / "bare.duckdb", "sglang-placeholder", tmp_path / "again", jobs=1)
    assert _files(done) == _files(again) and _figures(done) == _figures(again)


@given(st.lists(st.integers(0, 400), max_size=40))
def test_chunks_are_runs_of_nodes_closed_at_their_size(sizes: list[int]) -> None:
    names = [f"node-{i:03d}" for i in range(len(sizes))]
    rows = dict(zip(names, sizes, strict=True))
    chunks = nodes.chunked(names, rows)
    assert [n for chunk in chunks for n in chunk] == names  # every node once, in order
    for chunk in chunks[:-1]:  # each closed by its last node, not before
        assert sum(rows[n] for n in chunk) >= nodes.CHUNK_ROWS
        assert sum(rows[n] for n in chunk[:-1]) < nodes.CHUNK_ROWS
    assert not chunks or sum(rows[n] for n in chunks[-1][:-1]) < nodes.CHUNK_ROWS


@pytest.mark.parametrize(("told", "jobs"), [("3", 3), (" 1 ", 1), ("", None)])
def test_the_number_of_workers_is_told_or_one_a_core(told: str, jobs: int | None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nodes.JOBS_VARIABLE, told)
    assert nodes.default_jobs() == (jobs if jobs is not None else len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("told", ["two", "0", "-1"])
def test_a_number_of_workers_that_is_none_is_refused(told: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nodes.JOBS_VARIABLE, told)
    with pytest.raises(BadOption, match=nodes.JOBS_VARIABLE):
        nodes.default_jobs()



def test_the_command_lines_jobs_reach_every_replay(small_chunks: None, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from kvforensics import cli

    assert cli.JOBS_VARIABLE == nodes.JOBS_VARIABLE
    monkeypatch.setenv(nodes.JOBS_VARIABLE, "")  # (restored after: the option sets it for the process)
    simulate_to(tmp_path / "full", deployment=DEPLOYMENT, requests=120, seed=6)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    runner = CliRunner()
    told = runner.invoke(cli.app, ["--jobs", "2", "replay", "--db", str(tmp_path / "bare.duckdb"),
                                   "--out", str(tmp_path / "two"), "--json"])
    assert told.exit_code == 0, told.output
    assert os.environ[nodes.JOBS_VARIABLE] == "2"
    one = replay(tmp_path / "bare.duckdb", "sglang-placeholder", tmp_path / "one", jobs=1)
    assert json.loads(told.stdout)["exposure"] == one.exposure
    assert {f.name: f.read_bytes() for f in sorted((tmp_path / "two" / "logs").iterdir())} == _files(one)
    refused = runner.invoke(cli.app, ["--jobs", "0", "replay", "--db", str(tmp_path / "bare.duckdb")])
    assert refused.exit_code == 2
    told_badly = runner.invoke(cli.app, ["replay", "--db", str(tmp_path / "bare.duckdb")],
                               env={nodes.JOBS_VARIABLE: "two"})
    assert told_badly.exit_code == 1 and "KVFORENSICS_JOBS='two': not a whole number" in told_badly.output


class _Came(Exception):
    """What the test's own stop handler raises."""


def test_a_stop_while_the_workers_start_is_held_then_taken_with_the_handler_it_had() -> None:
    """``_stops_held``: a signal that comes inside it runs no handler there (the code after it runs
    on); on leaving, the handler the signal had is back and is run once."""
    assert threading.current_thread() is threading.main_thread()  # (handlers are the main thread's)
    came: list[int] = []

    def handler(signum: int, frame: object) -> None:
        came.append(signum)
        raise _Came()

    before = signal.signal(signal.SIGTERM, handler)
    try:
        ran_on = False
        with pytest.raises(_Came):
            with nodes._stops_held():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):  # (time for a handler to run, were it not held)
                    pass
                assert came == []
                ran_on = True
        assert ran_on and came == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is handler
        with nodes._stops_held():  # no stop: nothing is raised, and nothing run
            pass
        assert came == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_first_run_says_which_of_the_replays_kernels_it_compiles(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each of the replay's kernels (decode steps, page strings, the step clock's bound), where a
    process first takes it and no machine code of it is cached, is said once on the logger
    ``forensics.compiled``, which the command line prints (the bound takes about 7 s to compile:
    a replay in one process paused mid-loop in silence)."""
    import itertools

    import numpy as np

    from forensics import compiled
    from replay import engine, pagetext, schedule

    asked: list[str] = []
    monkeypatch.setattr(compiled, "uncached", lambda part: asked.append(part) is None)
    monkeypatch.setattr(schedule, "_CALLS", itertools.count(schedule.COMPILED_FROM))
    monkeypatch.setattr(pagetext, "_CALLS", itertools.count(pagetext.COMPILED_FROM))
    monkeypatch.setattr(engine, "_RUNS", itertools.count(engine.KERNEL_FROM))
    with caplog.at_level(logging.INFO, logger="forensics.compiled"):
        for _ in range(3):
            schedule.Horizon([(2, 6, 3)]).ceiling(1, [(7, 10)])
            pagetext.page_text(np.arange(1, 200, dtype=np.int64))
        simulate_to(tmp_path / "sim", deployment=DEPLOYMENT, requests=30, seed=1)  # (its decode steps)
    parts = ["ceiling", "page strings", "steps"]
    assert sorted(asked) == parts
    assert sorted(caplog.messages) == sorted(f"compiling {compiled.PARTS[p][0]} for this machine, once per install "
                                             f"(about {compiled.PARTS[p][3]} s)" for p in parts)


def test_the_fork_servers_preload_loads_the_compiled_kernels_for_the_workers() -> None:
    """replay.preload, which the fork server imports before it forks the workers, leaves the engine's
    step kernel, the page-string kernel and the step clock's ceiling loaded and taken from a worker's
    first call on (a worker loading them itself cost about a third of a second each); imported in a fresh
    interpreter, as the fork server does, and nowhere else in a replay in one process."""
    code = ("import replay.engine as e, replay.pagetext as p, replay.schedule as s, replay.decode_fast as d\n"
            "before = (next(e._RUNS), next(p._CALLS), next(s._CALLS))\n"
            "import replay.preload\n"
            "print(before, next(e._RUNS) > e.KERNEL_FROM, next(p._CALLS) > p.COMPILED_FROM,\n"
            "      next(s._CALLS) > s.COMPILED_FROM, e.kernel.run.signatures != [], p.runs.signatures != [],\n"
            "      s.kernel.ceiling.signatures != [], d.k.run.signatures != [])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out == ["(1,", "1,", "1)", "True", "True", "True", "True", "True", "True", "True"]
    from forensics import compiled

    said: list[str] = []
    with pytest.MonkeyPatch.context() as patch:  # (the decode node's long first compile is said before it)
        patch.setattr(compiled, "uncached", lambda part: part == "decode nodes")
        patch.setattr(compiled.log, "info", lambda line: said.append(line))
        nodes.start_fork_server()  # (and the fork server is told to import it)
    from multiprocessing import forkserver

    assert "replay.preload" in forkserver._forkserver._preload_modules
    assert said == [f"compiling {compiled.PARTS['decode nodes'][0]} for this machine, once per install (about "
                    f"{compiled.PARTS['decode nodes'][3]} s)"]
