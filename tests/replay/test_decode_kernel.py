"""The compiled decode node (replay/decode_kernel.py, driven by replay/decode_fast.py) held to the
Python's replay of the same nodes (replay/drive.py, replay/engine.py, replay/schedule.py), its
reference: the same replayed log set, file for file and byte for byte, and the same figures,
disagreements and doubts in the same order.

Each case is replayed twice in this process, its decode nodes by the Python (``never``) and by the
kernel wherever it covers them (``always``, whatever their size), on simulated cases (page sizes 64
and 1, the overlap scheduler on and off, step records, small pools that merge and starve) and on
the independent generator's logs (tests/independent_logs.py: no code shared with the replay), under
confirmation, the hardened engine's and a larger prefill pool's what-ifs, and the earliest and
latest schedules. The rest of the replay's tests run with the kernel on every decode node it covers
(tests/conftest.py), each held to its own expectations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
import replay.decode_fast as decode_fast
from forensics import compiled
from replay import decode_kernel
from replay.logset import LogSet
from replay.replay import ReplayResult, WhatIf, replay
from replay.schedule import Schedule
from replay.simulate import Deployment, simulate_to

#: Three decode and two prefill nodes, a step record every 10 decode steps, small pools.
SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=3, step_log_interval=10)


def _files(result: ReplayResult) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted((result.out / "logs").iterdir())}


def _figures(result: ReplayResult) -> dict[str, Any]:
    return {k: v for k, v in result.as_dict().items() if k != "out"}


class _Nodes(list[str]):
    """The decode nodes the kernel replayed, as it finished each; ``columnar``: those of them read
    as columns (no transfer end carried to them), the others record by record."""

    columnar: list[str]


def _compiled(monkeypatch: pytest.MonkeyPatch) -> _Nodes:
    """The decode nodes the kernel replays from here on (:class:`_Nodes`)."""
    nodes = _Nodes()
    nodes.columnar = []
    close, columns = decode_fast._Run._close, decode_fast._Run.columns

    def closed(self: Any) -> None:
        nodes.append(self.node)
        close(self)

    def read(self: Any, batches: Any, carried: Any) -> None:
        nodes.columnar.append(self.node)
        columns(self, batches, carried)

    monkeypatch.setattr(decode_fast._Run, "_close", closed)
    monkeypatch.setattr(decode_fast._Run, "columns", read)
    return nodes


def _both(db: Path, out: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "sglang-placeholder",
          **options: Any) -> tuple[ReplayResult, _Nodes]:
    """``db`` replayed with its decode nodes in Python and by the kernel, held equal; the kernel's
    replay, and the nodes it replayed."""
    monkeypatch.setenv(decode_fast.VARIABLE, "never")
    nodes = _compiled(monkeypatch)
    python = replay(db, engine, out / "python", jobs=1, **options)
    assert nodes == []
    monkeypatch.setenv(decode_fast.VARIABLE, "always")
    fast = replay(db, engine, out / "kernel", jobs=1, **options)
    assert _files(fast) == _files(python)
    assert _figures(fast) == _figures(python)
    return fast, nodes


def _case(tmp: Path, deployment: Deployment, requests: int, seed: int) -> Path:
    simulate_to(tmp / "full", deployment=deployment, requests=requests, seed=seed)
    forensics.investigate([strip_pages(tmp / "full", tmp / "bare")], tmp / "bare.duckdb")
    return tmp / "bare.duckdb"


def test_a_simulated_case_under_every_replay_the_job_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = _case(tmp_path, SMALL, 300, 5)
    confirmed, nodes = _both(db, tmp_path / "confirm", monkeypatch)
    assert sorted(nodes) == ["decode-0", "decode-1", "decode-2"]
    assert sorted(nodes.columnar) == sorted(nodes)  # (the simulator's decode nodes log their transfer ends)
    assert confirmed.exposure["exposed_responses"] > 0 and confirmed.step_records > 50
    hardened, nodes = _both(db, tmp_path / "hardened", monkeypatch, "sglang-hardened")
    assert len(nodes) == 3 and hardened.mode == "what-if" and hardened.exposure["exposed_responses"] == 0
    _both(db, tmp_path / "pool", monkeypatch, what_if=WhatIf(prefill_pool_tokens=65_536))
    for pick in ("early", "late"):
        _, nodes = _both(db, tmp_path / pick, monkeypatch, schedule=Schedule(pick))
        assert len(nodes) == 3


@pytest.mark.parametrize(("page_size", "overlap", "pool"), [(1, True, 131_072), (1, False, 40_000),
                                                            (64, False, 65_536), (16, True, 30_000)])
def test_page_sizes_schedulers_and_small_pools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page_size: int,
                                               overlap: bool, pool: int) -> None:
    deployment = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=pool,
                            page_size=page_size, prefill_nodes=2, decode_nodes=2, overlap_schedule=overlap,
                            step_log_interval=7)
    db = _case(tmp_path, deployment, 250, page_size)
    confirmed, nodes = _both(db, tmp_path / "confirm", monkeypatch)
    assert len(nodes) == 2 and confirmed.records > 0
    _both(db, tmp_path / "hardened", monkeypatch, "sglang-hardened")


def test_a_decode_pool_too_small_for_its_prompts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Confirming, the logs followed where the pool cannot supply a served request (each listed); in a
    what-if, the request ended with its rejection logged: 400 where the prompt is larger than the
    whole pool, 503 where its pages are more than the pool has free."""
    deployment = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=12_000,
                            page_size=16, prefill_nodes=2, decode_nodes=2, step_log_interval=7)
    db = _case(tmp_path, deployment, 250, 3)
    confirmed, nodes = _both(db, tmp_path / "confirm", monkeypatch)
    assert len(nodes) == 2 and "pool_cannot_supply" in {d.kind for d in confirmed.disagreements}
    hardened, _ = _both(db, tmp_path / "hardened", monkeypatch, "sglang-hardened")
    written = b"".join(_files(hardened).values())
    assert b"kv_pool_exhausted" in written and b"prompt_exceeds_kv_pool" in written


LAYOUTS = [
    Layout(),
    Layout(ends="decode", step_log=5),
    Layout(ends="prefill", jitter_ns=400_000),
    Layout(ends="neither", ms_times=True),
    Layout(in_flight=True, step_log=3),
    Layout(chunks=3, skew_ns=2_000_000),
    Layout(capped_prompt_pages=4, step_log=4),
    Layout(seqless_router=True, prefix_cache=True),
    Layout(restart=True),
    Layout(flush=True, step_log=5),  # (a cache flush: the Python's)
    Layout(retract=True),  # (a retraction: the Python's)
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=[repr(layout)[7:-1] or "default" for layout in LAYOUTS])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_independent_generators_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: Layout,
                                         seed: int) -> None:
    generate(tmp_path / "full", seed=seed, layout=layout)
    forensics.investigate([strip_pages(tmp_path / "full", tmp_path / "bare")], tmp_path / "bare.duckdb")
    confirmed, nodes = _both(tmp_path / "bare.duckdb", tmp_path / "confirm", monkeypatch)
    with duckdb.connect(str(tmp_path / "bare.duckdb"), read_only=True) as con:
        blocked = decode_fast.blockers(con)
        decode = {n for (n,) in con.execute("SELECT DISTINCT node FROM records WHERE kind = 'config' "
                                            "AND role = 'decode'").fetchall()}
    if layout.flush or layout.retract:  # (a flush, a retraction: that node is the Python's)
        assert blocked
    assert set(nodes) == decode - blocked  # (every decode node it covers; the others in Python)
    assert sorted(nodes.columnar) == sorted(nodes)  # (transfer ends carried to them placed among the columns)
    _both(tmp_path / "bare.duckdb", tmp_path / "hardened", monkeypatch, "sglang-hardened")


def test_a_node_that_does_not_start_its_boot_goes_back_to_the_python(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a node's first record does not come after its config in its boot, the columnar reader
    hands its records back to the Python, as the record reader does: the same bytes."""
    monkeypatch.setattr(decode_fast, "_starts", lambda *_: False)
    db = _case(tmp_path, SMALL, 150, 6)
    confirmed, nodes = _both(db, tmp_path / "confirm", monkeypatch)
    assert nodes == [] and confirmed.records > 0


def test_its_memory_follows_the_requests_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request's row is let go once the node's records of it end (out of the running batch), and
    taken by a later request: the rows a node holds are the requests in flight, not all it saw."""
    rows: list[tuple[int, int]] = []
    close = decode_fast._Run._close

    def watched(self: Any) -> None:
        close(self)
        rows.append((len(self.slot_list), self.requests))

    monkeypatch.setattr(decode_fast._Run, "_close", watched)
    monkeypatch.setattr(decode_fast, "BATCH", 64)  # (rows let go in a call are taken in the next)
    db = _case(tmp_path, SMALL, 600, 4)
    _both(db, tmp_path / "confirm", monkeypatch)
    assert len(rows) == 3 and all(seen > 150 for _, seen in rows)
    assert all(held < seen / 3 for held, seen in rows)


def test_a_packed_file_closes_where_the_python_closes_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's lines start a new file of the packed log set after the call of the writer that
    reaches its limit, as the Python's do (a decode step's three page records are one call)."""
    import replay.logset as logset

    monkeypatch.setattr(logset, "PART_RECORDS", 101)
    monkeypatch.setattr(decode_fast, "PART_RECORDS", 101)
    db = _case(tmp_path, SMALL, 120, 3)
    confirmed, nodes = _both(db, tmp_path / "confirm", monkeypatch)
    assert len(nodes) == 3
    assert len(_files(confirmed)) > 20  # (many files, each closed where a call reached 101 records)


def test_the_kernel_stops_where_the_python_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page string of no pages is the Python's ValueError, not an empty field."""
    log = LogSet()
    run = decode_fast._Run("n", 0, decode_fast.NodeConfig("n", "decode", 8, 1, 4), log, {}, False, Schedule(),
                           None, None, [])
    run.S[decode_kernel.S_ERROR] = decode_kernel.ERR_NO_PAGES
    with pytest.raises(ValueError, match="never empty"):
        run._drain()


def test_the_kernel_writes_times_and_page_strings_as_the_python_does() -> None:
    """Its own texts, against replay.logset.ts_text and forensics.emit.page_string, over the times
    int64 nanoseconds hold and page arrays in and out of order, with repeats."""
    from forensics.emit import page_string
    from replay.logset import ts_text

    rng = np.random.default_rng(7)
    S = np.zeros(decode_kernel.NS, np.int64)
    out = np.empty(16, np.uint8)
    # (times in int64 nanoseconds: 1677 to 2262; a case with others is the Python's, decode_fast.BLOCKERS)
    times = [0, 999, 1000, -1, -1000, 1_789_000_000_123_456_789, 2**63 - 1, -(2**63) + 1000,
             951_782_400_000_000_000, 4_107_542_400_000_000_000]  # (2000-02-29, 2100-03-01)
    times += rng.integers(-(2**63) + 1000, 2**63 - 1, 300).tolist()
    for ns in times:
        S[decode_kernel.S_OUT] = 0
        out = decode_kernel._ts(out, S, int(ns))
        assert out[:S[decode_kernel.S_OUT]].tobytes().decode() == ts_text(int(ns))
    for n in [1, 2, 3, 64, 65, 300]:
        for _ in range(20):
            pages = rng.integers(0, 3 * n, n).astype(np.int64)
            if rng.random() < 0.5:
                pages = np.sort(np.unique(pages))
            S[decode_kernel.S_OUT] = 0
            out = decode_kernel._pages(out, S, pages, 0, len(pages))
            assert out[:S[decode_kernel.S_OUT]].tobytes().decode() == page_string(pages)


def test_the_first_run_says_it_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel is one of the compiled parts a first run waits for, said where it is taken."""
    said: list[str] = []
    monkeypatch.setattr(compiled, "announce", said.append)
    monkeypatch.setattr(decode_fast, "_CALLS", iter(range(1, 10)))
    assert "decode nodes" in compiled.PARTS
    assert compiled.taken(decode_fast._CALLS, 0, "decode nodes") and said == ["decode nodes"]
