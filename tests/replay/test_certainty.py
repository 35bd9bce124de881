"""Certain and possible victims from request-level evidence (issue #42 item 4), held to the page
records of a generator that shares no code with ``replay/`` (tests/independent_logs.py): its
decode steps drift off the clock, so a request's logged times place its steps only roughly, and
the whole job replays under every schedule the evidence allows. A victim named under all of
them is certain, one named under some possible; neither may be wrong where the other says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
from forensics.case import Case
from kvforensics.job import run

CASES = {
    "steps on the clock, times to the microsecond": (Layout(), 1),
    "steps drift by up to 30%, times to the millisecond": (Layout(jitter_ns=300_000, ms_times=True), 1),
    "steps drift by up to 45%, times to the millisecond": (Layout(jitter_ns=450_000, ms_times=True), 7),
    # (where the drift adds up away from the last start or finish: without the clock's drift window
    # three pairs were named certain and were wrong)
    "steps drift by up to 45%, times to the millisecond, another run": (Layout(jitter_ns=450_000, ms_times=True), 1),
    # (where the starts to come forbid steps the times allow: a clock that never looked ahead was
    # left with no schedule at a finish, a disagreement on logs that fit, every victim there possible)
    "steps drift by up to 45%, times to the millisecond, a third run": (Layout(jitter_ns=450_000, ms_times=True), 17),
    # (step records every 40 steps: before the ceiling, 89.5% of the true pairs were certain)
    "steps drift by up to 45%, times to the millisecond, step records": (
        Layout(jitter_ns=450_000, ms_times=True, step_log=40), 7),
}


def _pairs(rows: list[dict], key: str = "victim_request") -> set[tuple[str, str]]:
    return {(r["reader_request"], r[key]) for r in rows}


def _both(tmp: Path, layout: Layout, seed: int) -> tuple[list, list, Any, Any]:
    """A generated incident's exposures read off its page records (the truth) and named by the whole
    job from its request records alone; the job's result and the request-level case's summary."""
    full = generate(tmp / "full", seed=seed, requests=200, layout=layout)
    forensics.investigate([full], tmp / "full.duckdb")
    with Case(tmp / "full.duckdb") as case:
        truth = case.exposures(delivered_only=True).to_dicts()
    found = run([strip_pages(full, tmp / "stripped")], tmp / "request-level.duckdb", None)
    with Case(tmp / "request-level.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
        summary = case.summary()
    return truth, rows, found, summary


@pytest.fixture(scope="module", params=list(CASES))
def named(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list, object]:
    layout, seed = CASES[request.param]
    truth, rows, found, summary = _both(tmp_path_factory.mktemp("certainty"), layout, seed)
    return truth, rows, (request.param, found, summary)


def test_the_exposed_responses_are_exact_and_every_row_says_how_certain_its_victim_is(named: tuple) -> None:
    truth, rows, _ = named
    assert truth  # (the run holds an incident)
    assert {r["reader_request"] for r in rows} == {r["reader_request"] for r in truth}
    assert {r["certainty"] for r in rows} <= {"certain", "possible"}
    assert all(r["certainty_note"] for r in rows if r["certainty"] == "possible")
    assert all(r["certainty_note"] is None for r in rows if r["certainty"] == "certain")


@pytest.mark.parametrize("key", ["victim_request", "victim_tenant"])
def test_certain_victims_are_true_and_certain_with_possible_ones_name_every_true_one(named: tuple, key: str) -> None:
    truth, rows, _ = named
    true = _pairs(truth, key)
    certain = _pairs([r for r in rows if r["certainty"] == "certain"], key)
    either = _pairs(rows, key)
    assert certain <= true, sorted(certain - true)[:5]  # a certain victim is never a wrong one
    assert len(true & either) >= 0.99 * len(true), sorted(true - either)[:5]
    assert len(certain) >= 0.9 * len(true)


def test_where_the_times_decide_every_step_every_victim_is_certain_and_elsewhere_some_are_only_possible(
        named: tuple) -> None:
    _, rows, (name, found, _) = named
    possible = [r for r in rows if r["certainty"] == "possible"]
    confirm = found.replays[0]
    assert confirm.disagreements == ()
    assert confirm.ambiguous_steps > 0  # (times to a resolution near some step's launch: alternatives ran)
    if "on the clock" in name:
        assert possible == []
    else:
        assert possible  # (the drift leaves some victims undecided: they are said to be possible)
        only_other = [r for r in possible if r["pages"] is None]
        assert all(r["n_pages"] == 0 and "only under" in r["certainty_note"] for r in only_other)


def test_every_summary_counts_certain_and_possible_as_the_rows_say(named: tuple) -> None:
    _, rows, (_, found, summary) = named
    certain = {r["victim_request"] for r in rows if r["certainty"] == "certain"}
    every = {r["victim_request"] for r in rows}
    expected = {"certain": len(certain), "possible": len(every - certain)}
    assert summary.certainty["victim_requests"] == expected
    assert found.certainty is not None and found.certainty["victim_requests"] == expected
    assert found.as_dict()["certainty"]["victim_requests"] == expected


@pytest.mark.parametrize("seed", [14, 15])
def test_after_a_retraction_the_victims_read_before_it_stay_certain_and_are_true(seed: int, tmp_path: Path) -> None:
    """The generator's decode nodes each retract a request at their 1,500th step (its pages freed,
    restored into pages taken afresh 20 steps later: ``Layout(retract=True)``), which the replay does
    not model; its finish says so. Each node's victims read before the retracted request joined the
    batch (its ``decode_started`` in the replayed set) keep their certainty (certain unless another
    schedule the times allow names another), and every certain one is true; those read from there on
    are possible, each saying why. (From there on the replay's pages are one layout of several: it
    names victims that are not, and misses some that are; the docs say so.)"""
    truth, rows, found, _ = _both(tmp_path, Layout(retract=True), seed)
    confirm = found.replays[0]
    retracted = {(d.node, d.request_id) for d in confirm.disagreements}
    assert {d.kind for d in confirm.disagreements} == {"decode_retracted"}
    assert {node for node, _ in retracted} == {"decode-0", "decode-1"}
    replayed = [json.loads(line) for f in sorted((confirm.out / "logs").glob("*.jsonl"))
                for line in f.read_text().splitlines()]
    start = {r["node"]: (r.get("boot", 0), r["seq"]) for r in replayed
             if (r["node"], r.get("request_id")) in retracted and r.get("event") == "decode_started"}
    for node in ("decode-0", "decode-1"):
        on = [r for r in rows if r["node"] == node]
        before = [r for r in on if (r["boot"], r["first_seq"]) < start[node]]
        assert before and len(before) < len(on)  # (victims read on both sides of the retracted request's start)
        # (certain unless another schedule the times allow names another victim: the retraction is not why)
        assert any(r["certainty"] == "certain" for r in before)
        assert not any("retracted" in (r["certainty_note"] or "") for r in before)
        assert all(r["certainty"] == "possible" and "retracted" in r["certainty_note"]
                   for r in on if (r["boot"], r["first_seq"]) >= start[node])
    certain = _pairs([r for r in rows if r["certainty"] == "certain"])
    assert certain and certain <= _pairs(truth), sorted(certain - _pairs(truth))[:5]
