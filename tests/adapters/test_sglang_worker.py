"""The SGLang adapter's lines read in a worker process, and the end of its second pass translated
in a forked copy of this process (forensics.adapters.sglang.worker): the same outcomes and notes,
line for line, as every line read and translated in this process, on every release fixture
(tests/adapters/releases/: lines printed by SGLang 0.5.5 to 0.5.23's own code), with the worker
started after a few lines and fed batches of a few, and the fork taking shares of the file from
a twentieth to all but its first line; and when the worker or the child dies mid-way, cannot
start, or is turned off."""

from __future__ import annotations

import marshal
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from forensics.adapters import Notes, Options, Untranslatable
from forensics.adapters.sglang import ADAPTERS as SGLANG
from forensics.adapters.sglang import adapter as sglang
from forensics.adapters.sglang import worker as sglang_worker
from forensics.adapters.sglang.formats import read_line
from forensics.ingestion.readers import translated

ROOT = Path(__file__).parent / "releases"
FILES = sorted(p for form in ("text", "json", "text-ms") for p in ROOT.glob(f"*/{form}/**/*.log"))


def _outcomes(path: Path, options: Options | None = None,
              notes: Notes | None = None) -> list[tuple[int, str, str]]:
    options = options or Options()
    text = path.read_text().splitlines()
    adapter = next(a for a in SGLANG if a.sniff(text[:64]))
    assert adapter.translate is not None

    def lines() -> Iterator[tuple[int, str]]:  # (as the readers give them: numbered, blank ones left out)
        return ((n, t) for n, t in enumerate(text, 1) if t.strip())

    return [(n, raw, repr(out)) for n, raw, out in translated(adapter, lines, path, options, notes or Notes())]


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A worker started after 3 lines of a file, fed batches of 4, 2 ahead."""
    monkeypatch.setattr(sglang_worker, "LOCAL_LINES", 3)
    monkeypatch.setattr(sglang_worker, "BATCH_LINES", 4)
    monkeypatch.setattr(sglang_worker, "DEPTH", 2)
    monkeypatch.setattr(sglang_worker, "AHEAD", 1)
    return monkeypatch


def _started(monkeypatch: pytest.MonkeyPatch) -> list[sglang_worker._Worker]:
    """The workers the adapter starts, as they start."""
    started: list[sglang_worker._Worker] = []
    start = sglang_worker._Worker.start.__func__  # type: ignore[attr-defined]

    def spy(cls: type, options: Options) -> sglang_worker._Worker | None:
        worker = start(cls, options)
        if worker is not None:
            started.append(worker)
        return worker

    monkeypatch.setattr(sglang_worker._Worker, "start", classmethod(spy))
    return started


def test_the_worker_reads_every_release_fixture_as_this_process_does(small_batches: pytest.MonkeyPatch) -> None:
    assert len(FILES) > 30
    alone = {}
    small_batches.setenv("KVFORENSICS_WORKERS", "0")
    for path in FILES:
        alone[path] = _outcomes(path)
    small_batches.setenv("KVFORENSICS_WORKERS", "1")
    started = _started(small_batches)
    for path in FILES:
        assert _outcomes(path) == alone[path], path
    assert len(started) >= len(FILES)  # (a worker for each file's first pass, at least)
    assert all(w.proc.returncode == 0 for w in started)  # (each ended at the end of its input)


def test_the_worker_reads_as_the_options_say(small_batches: pytest.MonkeyPatch) -> None:
    """--tenant-from reads request lines whole (the full parse, not the fast read): the worker is told."""
    path = ROOT / "0.5.23" / "text" / "prefill-0.log"
    options = Options(tenant_from="rid", year=2026)
    small_batches.setenv("KVFORENSICS_WORKERS", "0")
    alone = _outcomes(path, options)
    small_batches.setenv("KVFORENSICS_WORKERS", "1")
    started = _started(small_batches)
    assert _outcomes(path, options) == alone
    assert started and "tenant_id" in "".join(o for _, _, o in alone)


def test_a_worker_that_dies_mid_way_loses_no_line(small_batches: pytest.MonkeyPatch) -> None:
    path = ROOT / "0.5.23" / "text" / "decode-0.log"
    small_batches.setenv("KVFORENSICS_WORKERS", "0")
    alone = _outcomes(path)
    small_batches.setenv("KVFORENSICS_WORKERS", "1")
    receive = sglang_worker._Worker.receive
    calls = []

    def dying(self: sglang_worker._Worker, n: int) -> Any:
        calls.append(n)
        if len(calls) == 2:  # (killed between two batches: the ones it holds are read here)
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        return receive(self, n)

    small_batches.setattr(sglang_worker._Worker, "receive", dying)
    assert _outcomes(path) == alone
    assert len(calls) >= 2


@pytest.mark.parametrize("python", ["/nonexistent/python", "/bin/false"])
def test_a_worker_that_cannot_start_or_exits_at_once_leaves_the_reading_here(
        small_batches: pytest.MonkeyPatch, python: str) -> None:
    path = ROOT / "0.5.19" / "json" / "prefill-0.log"
    small_batches.setenv("KVFORENSICS_WORKERS", "0")
    alone = _outcomes(path)
    small_batches.setenv("KVFORENSICS_WORKERS", "1")
    small_batches.setattr(sys, "executable", python)
    assert _outcomes(path) == alone


def test_workers_are_as_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFORENSICS_WORKERS", "0")
    assert sglang_worker.workers() == 0
    monkeypatch.setenv("KVFORENSICS_WORKERS", "2")
    assert sglang_worker.workers() == 1  # (one: this process is the other reader)
    monkeypatch.setenv("KVFORENSICS_WORKERS", "")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert sglang_worker.workers() == 0  # (one core: nothing to share it with)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert sglang_worker.workers() == 1


def test_every_fixture_line_reads_the_same_from_the_wire() -> None:
    """What the worker sends of a line is what reading it here gives, but the message the
    passes no longer read: time, flags, ranks, format and value, line by line."""
    lines = [t for p in FILES for t in p.read_text().splitlines() if t.strip()]
    assert len(lines) > 2000
    options = Options()
    readings = [read_line(t, options) for t in lines]
    back = sglang_worker.decoded(marshal.loads(marshal.dumps(sglang_worker.encoded(readings))))
    kinds = set()
    for text, here, there in zip(lines, readings, back, strict=True):
        assert there is not None, text
        (line, k, value), (wired, k2, value2) = here, there
        assert (k2, wired.ts, wired.precise, wired.undated, wired.dp, wired.prefixed) == \
            (k, line.ts, line.precise, line.undated, line.dp, line.prefixed), text
        assert (wired.doc is None) == (line.doc is None) and wired.msg == ""
        if isinstance(value, Untranslatable):
            assert type(value2) is Untranslatable and str(value2) == str(value)
        else:
            assert type(value2) is type(value) and value2 == value, text
        kinds.add(type(value).__name__)
    assert {"RequestLine", "TimeStats", "Failure", "ErrorLine", "ConfigLine", "NoneType", "int"} <= kinds


def test_a_time_not_in_utc_or_a_value_of_another_type_is_read_here() -> None:
    import datetime as dt

    from forensics.adapters.sglang.log import LogLine

    other_zone = LogLine(dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1))), False, "x")
    utc = LogLine(dt.datetime(2026, 1, 1, tzinfo=dt.UTC), False, "x")
    heads, wires = sglang_worker.encoded([(other_zone, -1, None), (utc, 0, object()), (utc, -1, 200)])
    assert wires[:2] == [None, None] and wires[2] is not None
    assert sglang_worker.decoded((heads, wires))[2][1:] == (-1, 200)  # type: ignore[index]


@pytest.fixture
def small_forks(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The second pass forked for any file, the child's items sent 2 at a time; no reading worker."""
    monkeypatch.setattr(sglang_worker, "LOCAL_LINES", 10**9)
    monkeypatch.setattr(sglang, "FORK_LINES", 2)
    monkeypatch.setattr(sglang_worker, "FORK_BATCH", 2)
    return monkeypatch


def _forks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The children the second pass forks, as it forks them (their process ids)."""
    children: list[int] = []
    fork = os.fork

    def spy() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", spy)
    return children


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the second pass forks on Linux only")
def test_the_forked_second_pass_translates_every_release_fixture_as_this_process_does(
        small_forks: pytest.MonkeyPatch) -> None:
    """Outcomes and notes, at shares that put the split before, among and after the decode
    request lines (whose times carry from one line to the next across it)."""
    small_forks.setenv("KVFORENSICS_WORKERS", "0")
    alone = {}
    for path in FILES:
        notes = Notes()
        alone[path] = _outcomes(path, notes=notes), notes.rows()
    small_forks.setenv("KVFORENSICS_WORKERS", "1")
    children = _forks(small_forks)
    for share in (0.05, 0.3, 0.5, 0.8, 0.999):
        small_forks.setattr(sglang, "FORK_SHARE", share)
        for path in FILES:
            notes = Notes()
            assert (_outcomes(path, notes=notes), notes.rows()) == alone[path], (share, path)
    assert len(children) >= 5 * len(FILES)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the second pass forks on Linux only")
def test_a_child_that_dies_mid_way_or_cannot_fork_loses_no_line(small_forks: pytest.MonkeyPatch) -> None:
    path = ROOT / "0.5.23" / "text" / "decode-0.log"
    small_forks.setenv("KVFORENSICS_WORKERS", "0")
    notes = Notes()
    alone = _outcomes(path, notes=notes), notes.rows()
    small_forks.setenv("KVFORENSICS_WORKERS", "1")
    small_forks.setattr(sglang, "FORK_SHARE", 0.9)
    forked = sglang_worker.forked
    given: list[int] = []

    class Counted(sglang_worker.Forked):
        def __next__(self) -> Any:
            item = super().__next__()
            given.append(item is not None)
            return item

    def dying(n: int, work: Any) -> sglang_worker.Forked:
        def work_then_die(i: int) -> Any:
            if i == 5:  # (killed after two batches of two: the rest translated here)
                os.kill(os.getpid(), signal.SIGKILL)
            return work(i)

        child = forked(n, work_then_die)
        child.__class__ = Counted
        return child

    small_forks.setattr(sglang_worker, "forked", dying)
    notes = Notes()
    assert (_outcomes(path, notes=notes), notes.rows()) == alone
    assert given[:4] == [True] * 4 and not any(given[4:]) and len(given) > 8

    def no_fork() -> int:
        raise OSError("no more processes")

    small_forks.setattr(sglang_worker, "forked", forked)
    small_forks.setattr(os, "fork", no_fork)
    notes = Notes()
    assert (_outcomes(path, notes=notes), notes.rows()) == alone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the second pass forks on Linux only")
def test_a_second_pass_left_early_ends_its_child(small_forks: pytest.MonkeyPatch) -> None:
    small_forks.setenv("KVFORENSICS_WORKERS", "1")
    children = _forks(small_forks)
    path = ROOT / "0.5.23" / "text" / "prefill-0.log"
    text = path.read_text().splitlines()
    adapter = next(a for a in SGLANG if a.sniff(text[:64]))
    assert adapter.translate is not None
    outcomes = translated(adapter, lambda: enumerate(text, 1), path, Options(), Notes())
    next(outcomes)
    assert len(children) == 1
    outcomes.close()  # type: ignore[attr-defined]
    with pytest.raises(ChildProcessError):  # (waited for: no zombie left)
        os.waitpid(children[0], os.WNOHANG)


def test_the_second_pass_forks_only_where_a_worker_may_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVFORENSICS_WORKERS", "0")
    assert not sglang_worker.forks()
    monkeypatch.setenv("KVFORENSICS_WORKERS", "1")
    assert sglang_worker.forks() == sys.platform.startswith("linux")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not sglang_worker.forks()
