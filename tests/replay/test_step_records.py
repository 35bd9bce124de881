"""A decode node's step records (schema v1.1: SGLang's ``Decode batch`` line) held to the replay's
steps, and pinning them where their place is exact: where the node's own count of decode steps
and its running batch fit the steps the replay ran, they are counted as fitting; where they do
not and every step count before them was decided by the evidence, a ``step_record_differs``
disagreement is listed and the victims named on that node are possible, not certain; where the
times had left some step counts undecided before them, the record is counted undecided.

The step records come from a generator that shares no code with ``replay/``
(tests/independent_logs.py, ``step_log``: written from docs/schema-v1.1.md) and from the
simulator, with and without the overlap scheduler."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from independent_logs import Layout, generate, strip_pages

import forensics
from forensics.case import Case
from kvforensics.job import run
from replay.replay import ReplayResult, replay
from replay.schedule import StepClock
from replay.simulate import Deployment, simulate_to

#: The generator's layouts with step records: every 8 steps, on the clock or drifting with times to
#: the millisecond, and a decode node restarting with requests in flight (its count starts again).
LAYOUTS = {
    "on the clock": Layout(step_log=8),
    "drifting by 30%, times to the millisecond": Layout(step_log=8, jitter_ns=300_000, ms_times=True),
    "drifting by 45%, times to the millisecond": Layout(step_log=8, jitter_ns=450_000, ms_times=True),
    "a restart in flight": Layout(step_log=5, restart=True, in_flight=True),
}
#: A small simulated deployment whose decode nodes log a step record every 10 steps.
SMALL = Deployment(prefill_nodes=2, decode_nodes=2, step_log_interval=10)


def _step_lines(logs: Path) -> int:
    """The step records of a log set."""
    return sum(json.loads(line)["kind"] == "step" for f in sorted(logs.glob("decode-*.jsonl"))
               for line in f.read_text().splitlines())


def _replayed(logs: Path, tmp: Path, name: str) -> ReplayResult:
    forensics.investigate([logs], tmp / f"{name}.duckdb")
    return replay(tmp / f"{name}.duckdb", "sglang-placeholder", tmp / f"{name}.replay")


def _differs(result: ReplayResult) -> list:
    return [d for d in result.disagreements if d.kind == "step_record_differs"]


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_independent_generators_step_records_fit_the_replays_steps(layout: str, tmp_path: Path) -> None:
    full = generate(tmp_path / "full", seed=3, requests=160, layout=LAYOUTS[layout])
    steps = _step_lines(full)
    assert steps > 100  # (the run decodes several requests side by side for many steps)
    result = _replayed(strip_pages(full, tmp_path / "bare"), tmp_path, "bare")
    assert result.step_records + result.step_records_undecided == steps and result.step_records_unchecked == 0
    assert _differs(result) == []
    if layout.startswith("drifting"):  # (the times leave steps undecided: some records rule out the replay's pick)
        assert 0 < result.step_records_undecided < 0.25 * steps
    else:
        assert result.step_records == steps


@pytest.mark.parametrize("overlap", [True, False])
def test_the_simulators_step_records_all_fit_the_replays_steps(overlap: bool, tmp_path: Path) -> None:
    simulate_to(tmp_path / "full", deployment=Deployment(**{**SMALL.__dict__, "overlap_schedule": overlap}),
                requests=250, seed=4)
    steps = _step_lines(tmp_path / "full")
    assert steps > 100
    result = _replayed(strip_pages(tmp_path / "full", tmp_path / "bare"), tmp_path, "bare")
    assert result.step_records == steps and result.step_records_undecided == 0
    assert result.disagreements == ()


def test_a_what_if_carries_the_step_records_and_reads_none(tmp_path: Path) -> None:
    """Another engine's replay (a what-if) runs another batch: the logged step count is not its own,
    so no record is pinned or held to it, and the replayed set carries them as logged."""
    simulate_to(tmp_path / "full", deployment=SMALL, requests=250, seed=4)
    bare = strip_pages(tmp_path / "full", tmp_path / "bare")
    forensics.investigate([bare], tmp_path / "bare.duckdb")
    result = replay(tmp_path / "bare.duckdb", "sglang-hardened", tmp_path / "what-if")
    assert result.mode == "what-if" and result.outcomes_changed > 0
    assert (result.step_records, result.step_records_undecided, result.step_records_unchecked) == (0, 0, 0)
    carried = sum(json.loads(line)["kind"] == "step" for f in sorted((tmp_path / "what-if" / "logs").iterdir())
                  for line in f.read_text().splitlines())
    assert carried == _step_lines(bare) > 0


def _tamper(logs: Path, out: Path, change: str, node: str = "decode-0") -> str:
    """A copy of ``logs`` with the 12th step record of ``node`` changed: ``running`` one more, or
    the record gone (the count then jumps by a record's steps); the node changed."""
    out.mkdir()
    for f in sorted(logs.iterdir()):
        lines = f.read_text().splitlines()
        if f.name == f"{node}.jsonl":
            at = [i for i, line in enumerate(lines) if json.loads(line)["kind"] == "step"][11]
            record = json.loads(lines[at])
            if change == "running":
                lines[at] = json.dumps({**record, "running": record["running"] + 1})
            else:
                del lines[at]
        (out / f.name).write_text("".join(line + "\n" for line in lines))
    return node


@pytest.mark.parametrize("change", ["running", "missing"])
def test_a_step_record_that_does_not_fit_is_a_listed_disagreement(change: str, tmp_path: Path) -> None:
    simulate_to(tmp_path / "full", deployment=SMALL, requests=250, seed=4)
    node = _tamper(strip_pages(tmp_path / "full", tmp_path / "bare"), tmp_path / "tampered", change)
    result = _replayed(tmp_path / "tampered", tmp_path, "tampered")
    assert result.ambiguous_steps == 0  # (every step count decided by the times: a misfit is the logs' word)
    differs = _differs(result)
    assert len(differs) == 1 and differs[0].node == node and result.disagreements == tuple(differs)
    said = "requests running" if change == "running" else "steps after the last one, at step"
    assert said in differs[0].detail, differs[0].detail


def test_where_the_times_left_steps_undecided_a_misfit_is_counted_undecided(tmp_path: Path) -> None:
    full = generate(tmp_path / "full", seed=3, requests=160, layout=LAYOUTS["on the clock"])
    honest = _replayed(strip_pages(full, tmp_path / "bare"), tmp_path, "bare")
    _tamper(tmp_path / "bare", tmp_path / "tampered", "running")
    result = _replayed(tmp_path / "tampered", tmp_path, "tampered")
    assert result.ambiguous_steps > 0 and _differs(result) == []
    assert (result.step_records, result.step_records_undecided) == (honest.step_records - 1, 1)


def test_where_the_step_log_disagrees_the_victims_on_that_node_are_only_possible(tmp_path: Path) -> None:
    simulate_to(tmp_path / "full", deployment=SMALL, requests=250, seed=4)
    bare = strip_pages(tmp_path / "full", tmp_path / "bare")
    run([bare], tmp_path / "agrees.duckdb", None)
    with Case(tmp_path / "agrees.duckdb") as case:
        agrees = case.exposures(delivered_only=True).to_dicts()
    node = _tamper(bare, tmp_path / "tampered", "running", min(r["node"] for r in agrees))
    run([tmp_path / "tampered"], tmp_path / "differs.duckdb", None)
    with Case(tmp_path / "differs.duckdb") as case:
        differs = case.exposures(delivered_only=True).to_dicts()
    on_node = [r for r in differs if r["node"] == node]
    assert on_node and {r["certainty"] for r in on_node} == {"possible"}
    assert all("could not follow this node's logs" in r["certainty_note"] for r in on_node)
    assert {r["certainty"] for r in agrees} == {"certain"}
    # the replay's own rows as before, and elsewhere as certain as before; beside them on that node, the
    # requests not ruled out since its boot's start (the replay cannot say from where its pages part)
    key = ("node", "reader_request", "victim_request")
    named = [r for r in differs if r["pages"] is not None]
    assert sorted(tuple(r[k] for k in key) for r in named) == sorted(tuple(r[k] for k in key) for r in agrees)
    beside = [r for r in differs if r["pages"] is None]
    assert beside and all(r["node"] == node and r["certainty_note"].startswith(
        "not ruled out: the replay could not follow this node's logs everywhere") for r in beside)
    assert {r["certainty"] for r in differs if r["node"] != node} <= {"certain"}


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30)), max_size=20), left=st.integers(0, 20),
       lo=st.integers(0, 60), span=st.integers(0, 40))
def test_the_batches_over_a_range_of_steps_are_each_steps_batch(rows: list[tuple[int, int]], left: int, lo: int,
                                                                 span: int) -> None:
    """The one-pass batches a bounded record is checked against, held to a request-by-request count."""
    clock = StepClock(None)
    for i, (first, allocs) in enumerate(rows):
        if i < left:
            clock._left.append((first, allocs))
        else:
            clock._rows[f"r{i}"] = (first, allocs)
    expected = [sum(1 for f, a in rows if f < p <= f + a) for p in range(lo, lo + span + 1)]
    assert clock._batches(lo, lo + span) == expected
