"""Every stop is said: SIGINT and SIGTERM, sent to the command at each of its steps, end it with one
line on stderr (what was interrupted, that the case is consistent, that the same command run again
finishes it) and exit 130 or 143; run again, the command finishes the case into the tables an
uninterrupted run makes. The signals are real, sent to a running ``kvforensics``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import psutil
import pytest
from conftest import said
from typer.testing import CliRunner

import forensics.store
from kvforensics.cli import EXIT_ERROR, app
from replay.simulate import simulate_to

KVF = str(Path(sys.executable).with_name("kvforensics"))
#: The command as its console script runs it, saying on stderr when each step begins ("step: NAME"),
#: so that a signal can be sent while that step works.
MARKED = """
import sys
import time
import forensics.ingestion.pipeline
import forensics.investigation
import kvforensics.job
from kvforensics.cli import main

def marked(name, step):
    def run(*args, **kwargs):
        print(f"step: {name}", file=sys.stderr, flush=True)
        return step(*args, **kwargs)
    return run

def held(name, step):  # (said, then held a moment: a stop sent on the mark lands inside the step)
    def run(*args, **kwargs):
        print(f"step: {name}", file=sys.stderr, flush=True)
        time.sleep(0.5)
        return step(*args, **kwargs)
    return run

forensics.ingestion.pipeline._Loading.transaction = held("ingest", forensics.ingestion.pipeline._Loading.transaction)
forensics.investigation.analyse = marked("analysis", forensics.investigation.analyse)
kvforensics.job.replay = marked("replay", kvforensics.job.replay)
kvforensics.job.report = marked("report", kvforensics.job.report)
sys.argv = ["kvforensics", *sys.argv[1:]]
main()
"""
#: :data:`MARKED`, with a replay's nodes spread over worker processes however small the case, a mark
#: once the workers' inputs are written (the workers start then), and workers that sleep an hour
#: before each chunk (tests/kvforensics/sleeping_workers.py): only a stop that kills them ends it.
PARALLEL = MARKED.replace("sys.argv = [", f"""import replay.nodes
replay.nodes.PARALLEL_FROM = 0
replay.nodes.CHUNK_ROWS = 200
export = replay.nodes._export
def exported(*args, **kwargs):
    files = export(*args, **kwargs)
    print("step: workers", file=sys.stderr, flush=True)
    return files
replay.nodes._export = exported
sys.path.insert(0, {str(Path(__file__).parent)!r})
import sleeping_workers
replay.nodes._replay_from_files = sleeping_workers.replay_from_files
sys.argv = [""", 1)
#: Columns that differ between two runs of one command: when, by which version, into which folder.
RUN_COLUMNS = {"ingested_at", "refused_at", "toolkit_version", "out"}


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A log set the whole job takes seconds over (each step long enough to be stopped in)."""
    out = tmp_path_factory.mktemp("stops") / "logs"
    simulate_to(out, requests=400, seed=1)
    return out


def _uninterrupted(logs: Path, folder: Path, *more: str) -> Path:
    db = folder / "case.duckdb"
    subprocess.run([KVF, "investigate", str(logs), "--db", str(db), *more], check=True, capture_output=True)
    return db


@pytest.fixture(scope="module")
def analysed(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The case ``investigate`` makes uninterrupted."""
    return _uninterrupted(logs, tmp_path_factory.mktemp("analysed"))


@pytest.fixture(scope="module")
def reported(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The case ``investigate --out`` makes uninterrupted (its replays included)."""
    folder = tmp_path_factory.mktemp("reported")
    return _uninterrupted(logs, folder, "--out", str(folder / "r.html"))


def tables(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table of a case, its rows sorted, without the columns that differ from run to run."""
    con = duckdb.connect(str(db), read_only=True)
    try:
        out = {}
        for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall():
            columns = [f'"{c}"' for (c,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [table]
            ).fetchall() if c not in RUN_COLUMNS]
            out[table] = sorted(con.execute(f'SELECT {", ".join(columns)} FROM "{table}"').fetchall(), key=repr)
        return out
    finally:
        con.close()


def stop(args: list[str], until: Callable[[subprocess.Popen[str], list[str]], bool], sig: signal.Signals,
         *, after: float = 0.0) -> tuple[int, list[str]]:
    """Run ``args``, send ``sig`` once ``until(process, its stderr lines so far)`` holds (and
    ``after`` seconds more); its exit code and the lines it said on stderr (step marks left out)."""
    lines: list[str] = []
    # (its own session: whatever is left of it afterwards, a worker that outlived it included, is
    # ended by its group, so that a failure here is a failure, never a hang)
    with subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 60
            while not until(proc, lines):
                assert proc.poll() is None, f"ended before the signal: {lines}"
                assert time.monotonic() < deadline, "the step never began"
                time.sleep(0.005)
            time.sleep(after)
            proc.send_signal(sig)
            code = proc.wait(timeout=60)
            reader.join(timeout=30)
            outlived = reader.is_alive()  # (its stderr still open: a process it started is still running)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        reader.join()
    assert not outlived, f"a process the command started outlived it: {lines}"
    return code, [line.rstrip("\n") for line in lines if not line.startswith("step: ")]


def loading(proc: subprocess.Popen[str], lines: list[str]) -> bool:
    """The command is loading its modules (DuckDB's is in; polars, typer and the library to come)."""
    return "_duckdb" in Path(f"/proc/{proc.pid}/maps").read_text()


def step_began(name: str) -> Callable[[subprocess.Popen[str], list[str]], bool]:
    """The step ``name`` has begun (said by :data:`MARKED`)."""
    return lambda proc, lines: f"step: {name}\n" in lines


def said_one_stop(code: int, lines: list[str], sig: signal.Signals, step: str) -> None:
    assert code == 128 + sig, lines
    lines = said(lines)  # (the phases that ended before it, a line each, are progress)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"kvforensics: stopped by {sig.name} during {step};"), lines
    assert lines[0].endswith("run the same command again to finish"), lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_while_the_command_starts_is_said_and_writes_nothing(logs: Path, tmp_path: Path,
                                                                   sig: signal.Signals) -> None:
    db = tmp_path / "case.duckdb"
    code, lines = stop([KVF, "investigate", str(logs), "--db", str(db)], loading, sig)
    said_one_stop(code, lines, sig, "the start-up")
    assert "nothing was written" in lines[0]
    assert list(tmp_path.iterdir()) == []


#: A child whose stop arrives while the modules load, inside code that must not be unwound (as
#: DuckDB's module initialisation: an exception passing through it aborts the process, SIGABRT).
UNWINDING = """
import os, signal, sys, time
import kvforensics.cli as cli
cli._Stop.started = False
cli._arm([cli._on_stop] * len(cli.STOP_SIGNALS))
try:
    os.kill(os.getpid(), int(sys.argv[1]))
    time.sleep(5)
finally:
    print("unwound", flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_stop_while_the_modules_load_ends_there_without_unwinding_them(sig: signal.Signals) -> None:
    """The start-up's stop is said and the process ends where it is: raised as an exception, it
    unwound through the module being initialised, and inside DuckDB's that aborted the process
    (3 runs in 64 with SIGINT sent 28 to 60 ms after the start: exit -6, "Critical nanobind error")."""
    done = subprocess.run([sys.executable, "-c", UNWINDING, str(int(sig))], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout == ""
    said_one_stop(done.returncode, done.stderr.splitlines(), sig, "the start-up")


def test_a_stop_in_the_ingest_leaves_whole_files_and_a_rerun_finishes_the_case(
    logs: Path, analysed: Path, tmp_path: Path
) -> None:
    """The stop is sent as a transaction of files begins (it was sent 50 ms after the case file
    appeared, and a loaded machine had ingested every file by then)."""
    db = tmp_path / "case.duckdb"
    code, lines = stop([sys.executable, "-c", MARKED, "investigate", str(logs), "--db", str(db)],
                       step_began("ingest"), signal.SIGINT, after=0.05)
    said_one_stop(code, lines, signal.SIGINT, "the ingest")
    assert "the case is consistent" in said(lines)[0]
    subprocess.run([KVF, "investigate", str(logs), "--db", str(db)], check=True, capture_output=True)
    assert tables(db) == tables(analysed)


def test_a_stop_in_the_analysis_is_said_and_a_rerun_finishes_the_case(
    logs: Path, analysed: Path, tmp_path: Path
) -> None:
    db = tmp_path / "case.duckdb"
    args = ["investigate", str(logs), "--db", str(db)]
    code, lines = stop([sys.executable, "-c", MARKED, *args], step_began("analysis"), signal.SIGTERM, after=0.05)
    said_one_stop(code, lines, signal.SIGTERM, "the analysis")
    subprocess.run([KVF, *args], check=True, capture_output=True)
    assert tables(db) == tables(analysed)


@pytest.mark.parametrize(("step", "sig"), [("replay", signal.SIGINT), ("report", signal.SIGTERM)],
                         ids=["replay-SIGINT", "report-SIGTERM"])
def test_a_stop_in_the_whole_job_is_said_and_a_rerun_finishes_it(
    logs: Path, reported: Path, tmp_path: Path, step: str, sig: signal.Signals
) -> None:
    db, out = tmp_path / "case.duckdb", tmp_path / "r.html"
    args = ["investigate", str(logs), "--db", str(db), "--out", str(out)]
    code, lines = stop([sys.executable, "-c", MARKED, *args], step_began(step), sig, after=0.05)
    said_one_stop(code, lines, sig, f"the {step}")
    assert "the case is consistent" in said(lines)[0] and not out.exists()
    subprocess.run([KVF, *args], check=True, capture_output=True)
    assert tables(db) == tables(reported) and out.is_file()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
@pytest.mark.parametrize("when", ["starting", "running"])
def test_a_stop_while_the_replays_workers_start_or_run_kills_them_and_a_rerun_finishes_the_job(
    logs: Path, reported: Path, tmp_path: Path, sig: signal.Signals, when: str
) -> None:
    """The workers sleep an hour before their chunks, so the command ends in time only if the stop
    kills them; and none may be left behind (:func:`stop` fails where one still holds its stderr).
    ``starting``: the stop is sent as the pool begins to start them (a stop taken while the pool
    started a worker once left that worker running, unknown to the pool); ``running``: once the
    fork server and both workers are up."""
    db, out = tmp_path / "case.duckdb", tmp_path / "r.html"
    args = ["--jobs", "2", "investigate", str(logs), "--db", str(db), "--out", str(out)]
    workers: list[psutil.Process] = []

    def working(proc: subprocess.Popen[str], lines: list[str]) -> bool:
        if "step: workers\n" not in lines:
            return False
        workers[:] = psutil.Process(proc.pid).children(recursive=True)  # (the fork server and its workers)
        return when == "starting" or len(workers) >= 3

    code, lines = stop([sys.executable, "-c", PARALLEL, *args], working, sig)
    said_one_stop(code, lines, sig, "the replay")
    assert "the case is consistent" in said(lines)[0] and not out.exists()
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    subprocess.run([KVF, *args], check=True, capture_output=True)
    assert tables(db) == tables(reported) and out.is_file()


def test_a_stop_in_a_simulation_is_said_and_leaves_its_folder_empty_for_a_rerun(tmp_path: Path) -> None:
    """(100,000 requests: their folder is begun within a second and written for minutes; a million
    took 5 s to begin it.)"""
    out = tmp_path / "logs"

    def writing(proc: subprocess.Popen[str], lines: list[str]) -> bool:
        return any(p.name.startswith(".logs.writing-") for p in tmp_path.iterdir())

    code, lines = stop([KVF, "simulate", "--out", str(out), "--requests", "100000"], writing, signal.SIGTERM,
                       after=0.2)
    said_one_stop(code, lines, signal.SIGTERM, "the simulation")
    assert "no log set was written" in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == ["logs"] and list(out.iterdir()) == []


def test_a_case_is_never_named_before_its_schema_is_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop while a new case is made leaves nothing at its path (and nothing beside it): the
    schema goes into a file beside it, which takes the case's name only once whole."""
    def stopped(con: duckdb.DuckDBPyConnection) -> None:
        con.execute("CREATE TABLE case_meta (key VARCHAR)")
        raise KeyboardInterrupt

    monkeypatch.setattr(forensics.store, "_write_schema", stopped)
    with pytest.raises(KeyboardInterrupt):
        forensics.store.connect(tmp_path / "case.duckdb")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_database_an_older_stop_left_is_said_and_the_ingest_makes_it_a_case(tmp_path: Path) -> None:
    db = tmp_path / "case.duckdb"
    duckdb.connect(str(db)).close()  # (what an ingest stopped before its schema left, before cases were made whole)
    runner = CliRunner()
    refused = runner.invoke(app, ["sql", "SELECT count(*) FROM files", "--db", str(db)])
    assert refused.exit_code == EXIT_ERROR and "run the ingest again" in refused.stderr
    example = Path(__file__).parents[1] / "fixtures" / "examples" / "placeholder" / "events.jsonl"
    assert runner.invoke(app, ["ingest", str(example), "--db", str(db)]).exit_code == 0
    assert runner.invoke(app, ["sql", "SELECT count(*) FROM files", "--db", str(db)]).exit_code == 0
