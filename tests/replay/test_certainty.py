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
from kvforensics.story import _notes

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


def _by_pair(rows: list[dict]) -> dict[tuple[str, str, str], dict]:
    """Exposure rows by (node, reader, victim)."""
    return {(r["node"], r["reader_request"], r["victim_request"]): r for r in rows}


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
    # (and the pairs: a figure of pairs counts possible ones too, and says how many are certain)
    pairs = _pairs([r for r in rows if r["certainty"] == "certain"])
    split = {"certain": len(pairs), "possible": len(_pairs(rows) - pairs)}
    assert summary.certainty["exposure_pairs"] == found.certainty["exposure_pairs"] == split
    assert (f"(reader, victim) pairs: {split['certain']:,} certain, {split['possible']:,} possible"
            in " ".join(_notes(found)))


@pytest.mark.parametrize("seed", [12, 13, 14, 15])
def test_after_a_retraction_the_victims_before_it_stay_certain_and_those_not_ruled_out_are_named(
        seed: int, tmp_path: Path) -> None:
    """The generator's decode nodes each retract a request at their 1,500th step (its pages freed,
    restored into pages taken afresh 20 steps later: ``Layout(retract=True)``), which the replay does
    not model; its finish says so. The victims of each node's readers that took their pages before
    the retracted request joined the batch (its ``decode_started`` in the replayed set) keep their
    certainty (certain unless another schedule the times allow names another), and every certain
    one is true. From there on the replay's pages are one layout of several: its names there are
    possible, and beside them every request whose data the reader's pages may have held is named a
    possible victim, "not ruled out", so that certain and possible together name every true victim
    and tenant (before, 154 of 165 and 232 of 255 true pairs at seeds 12 and 13)."""
    truth, rows, found, _ = _both(tmp_path, Layout(retract=True), seed)
    confirm = found.replays[0]
    retracted = {(d.node, d.request_id) for d in confirm.disagreements}
    assert {d.kind for d in confirm.disagreements} == {"decode_retracted"}
    assert {node for node, _ in retracted} == {"decode-0", "decode-1"}  # (each its finish's and its line's)
    assert sum(1 for _, rid in retracted if rid == "") == 2
    replayed = [json.loads(line) for f in sorted((confirm.out / "logs").glob("*.jsonl"))
                for line in f.read_text().splitlines()]
    # where each node retracted: its scheduler's line (the retracted request joined the batch before it)
    start = {r["node"]: (r.get("boot", 0), r["seq"]) for r in replayed if r.get("cache") == "retracted"}
    assert start.keys() == {"decode-0", "decode-1"}
    taken: dict[tuple[str, str], tuple[int, int]] = {}  # where each request took its pages on a node
    for r in replayed:
        if r.get("op") == "alloc":
            taken.setdefault((r["node"], r["request_id"]), (r.get("boot", 0), r["seq"]))
    before = [r for r in rows if taken[r["node"], r["reader_request"]] < start[r["node"]]]
    assert before  # (readers on both sides of a retracted request's start: at seeds 12 and 13 on one node only)
    assert not any("retracted" in (r["certainty_note"] or "") for r in before)
    for node in ("decode-0", "decode-1"):
        after = [r for r in rows if r["node"] == node and taken[node, r["reader_request"]] >= start[node]]
        assert after
        assert all(r["certainty"] == "possible" for r in after)
        # (a pair only another schedule names says so: it is possible on that count already)
        assert all("retracted" in r["certainty_note"] for r in after if r["pages"] is not None)
        assert any(r["certainty_note"].startswith("not ruled out: ") and r["pages"] is None for r in after)
        # the requests not ruled out, as a brute force over the replayed set works them out
        readers = {r["reader_request"] for r in rows if r["node"] == node}
        gone = {rid for n, rid in retracted if n == node and rid}
        brute = {(reader, w) for reader in readers if taken[node, reader] >= start[node]
                 for w in _not_ruled_out(replayed, node, start[node], reader, gone)}
        beside = _pairs([r for r in after if r["certainty_note"].startswith("not ruled out: ")])
        assert beside and beside <= brute <= _pairs(after), (sorted(beside - brute)[:3],
                                                             sorted(brute - _pairs(after))[:3])
    certain = _pairs([r for r in rows if r["certainty"] == "certain"])
    assert certain and certain <= _pairs(truth), sorted(certain - _pairs(truth))[:5]
    for key in ("victim_request", "victim_tenant"):  # (the 99%: here every one)
        true = _pairs(truth, key)
        assert true <= _pairs(rows, key), sorted(true - _pairs(rows, key))[:5]
    assert found.filled is not None and found.filled.not_ruled_out_listed and found.filled.not_ruled_out > 0
    assert (f"where a node's pages are not the replay's (decode retractions, or logs it could not follow): "
            f"{found.filled.not_ruled_out:,} (reader, request) pairs not ruled out by the evidence, each a possible "
            "victim (certainty_note 'not ruled out')") in _notes(found)
    if seed == 14:  # (the report says so too)
        from reports.render import report

        report(tmp_path / "request-level.duckdb", tmp_path / "report.html")
        text = " ".join((tmp_path / "report.html").read_text().split())
        assert (f"{found.filled.not_ruled_out:,} (reader, request) pairs are not ruled out by the evidence: each "
                "request is among the possible victims, &ldquo;not ruled out&rdquo;") in text


def test_a_retraction_no_finish_counts_is_read_from_the_schedulers_line(tmp_path: Path) -> None:
    """Where no finish carries the retraction count (a request log without it), the line SGLang's
    scheduler prints at every retraction (``KV cache pool is full. Retract requests.``: a step with
    ``cache: "retracted"``) is what says the node's pages are no longer the replay's: one
    ``decode_retracted`` a node, naming no request, and from there on every victim possible, the
    requests not ruled out beside them; no certain victim wrong, every true one named. Without the
    line either, nothing says so: at seed 13 the job names 112 certain victims that are not."""
    full = generate(tmp_path / "full", seed=13, requests=200, layout=Layout(retract=True))
    forensics.investigate([full], tmp_path / "full.duckdb")
    with Case(tmp_path / "full.duckdb") as case:
        truth = _pairs(case.exposures(delivered_only=True).to_dicts())
    for lines in (True, False):
        folder = strip_pages(full, tmp_path / f"stripped-{lines}")
        for f in folder.glob("*.jsonl"):
            kept = [{k: v for k, v in r.items() if k != "retractions"}
                    for r in map(json.loads, f.read_text().splitlines()) if lines or r.get("cache") != "retracted"]
            f.write_text("".join(json.dumps(r) + "\n" for r in kept))
        found = run([folder], tmp_path / f"case-{lines}.duckdb", None)
        with Case(tmp_path / f"case-{lines}.duckdb") as case:
            rows = case.exposures(delivered_only=True).to_dicts()
        certain = _pairs([r for r in rows if r["certainty"] == "certain"])
        said = sorted((d.request_id, d.node, d.kind) for d in found.replays[0].disagreements)
        if lines:
            assert said == [("", "decode-0", "decode_retracted"), ("", "decode-1", "decode_retracted")]
            assert certain <= truth and truth <= _pairs(rows)
            assert any(r["certainty_note"].startswith("not ruled out: ") for r in rows if r["certainty_note"])
        else:
            assert said == [] and len(certain - truth) == 112

def test_past_the_budget_the_requests_not_ruled_out_are_counted_and_said_not_listed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each reader after a retraction has every request that let its pages go on its node before it
    as a candidate: they grow as readers times requests. Past a budget of pairs the job lists none
    of them, and says so with their count (the replay's own names there stay possible)."""
    from forensics.exposure import tiers

    monkeypatch.setattr(tiers, "NOT_RULED_OUT_PAIRS", 10)
    _, rows, found, _ = _both(tmp_path, Layout(retract=True), 14)
    assert found.filled is not None and not found.filled.not_ruled_out_listed and found.filled.not_ruled_out > 10
    assert not any((r["certainty_note"] or "").startswith("not ruled out") for r in rows)
    assert any("retracted" in (r["certainty_note"] or "") for r in rows)
    said = found.as_dict()["filled_by_replay"]
    assert (said["not_ruled_out"], said["not_ruled_out_listed"]) == (found.filled.not_ruled_out, False)
    assert (f"where a node's pages are not the replay's (decode retractions, or logs it could not follow): "
            f"{found.filled.not_ruled_out:,} (reader, request) pairs not ruled out by the evidence, past 10: not "
            "listed; the victims named there are possible and others there may be missed") in _notes(found)
    # the report says so too (the case keeps the count)
    from reports.render import report

    report(tmp_path / "request-level.duckdb", tmp_path / "report.html")
    text = " ".join((tmp_path / "report.html").read_text().split())
    assert (f"Where a node's pages are not the replay's (after decode retractions, which it does not model, or where "
            f"it could not follow the node's logs), {found.filled.not_ruled_out:,} (reader, request) pairs are not "
            "ruled out by the evidence: past 10, they are not listed") in text

PRINTED = Path(__file__).resolve().parents[1] / "adapters" / "printed"


@pytest.mark.parametrize("run_name", sorted(p.name for p in PRINTED.glob("*-retract*")))
def test_a_retraction_in_logs_sglang_printed_leaves_every_true_victim_named_and_no_certain_one_wrong(
        run_name: str, tmp_path: Path) -> None:
    """Generator runs whose decode nodes each retract a request, as SGLang 0.5.11 (``total_retractions``
    in a finish's meta_info) and 0.5.19 (``num_retractions``; with ``Decode batch`` lines) print them
    (tests/adapters/printed, made by scripts/make_sglang_printed_runs.py through each release's own
    code from the generator's log set, which this test makes again). Read through the SGLang adapter,
    the whole job lists one retraction a decode node, names no certain victim that the generator's
    page records do not, and names every true victim and tenant, certain or possible."""
    import gzip

    from forensics.adapters import read_tenant_map
    from forensics.adapters.base import Options

    folder = PRINTED / run_name
    made = json.loads((folder / "RUN.json").read_text())
    assert json.loads((folder / "SOURCE.json").read_text())["release"] == made["release"] == run_name.split("-")[0]
    full = generate(tmp_path / "full", seed=made["seed"], requests=made["requests"], layout=Layout(**made["layout"]))
    forensics.investigate([full], tmp_path / "full.duckdb")
    with Case(tmp_path / "full.duckdb") as case:
        truth = case.exposures(delivered_only=True).to_dicts()
    assert truth
    logs = tmp_path / "sglang"
    logs.mkdir()
    for gz in sorted(folder.glob("*.log.gz")):
        (logs / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    found = run(sorted(logs.glob("*.log")), tmp_path / "sglang.duckdb", None,
                options=Options(tenants=read_tenant_map(folder / "tenants.json")))
    with Case(tmp_path / "sglang.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
    confirm = found.replays[0]
    # (each decode node's: its finish's count, and its scheduler's line)
    assert sorted((d.kind, d.node) for d in confirm.disagreements) == [("decode_retracted", "decode-0")] * 2 + [
        ("decode_retracted", "decode-1")] * 2
    assert {r["reader_request"] for r in rows} == {r["reader_request"] for r in truth}
    certain = _pairs([r for r in rows if r["certainty"] == "certain"])
    assert certain <= _pairs(truth), sorted(certain - _pairs(truth))[:5]
    for key in ("victim_request", "victim_tenant"):
        assert _pairs(truth, key) <= _pairs(rows, key), sorted(_pairs(truth, key) - _pairs(rows, key))[:5]
    assert any((r["certainty_note"] or "").startswith("not ruled out: ") for r in rows)

@pytest.mark.parametrize("seed", [12, 13])
def test_where_the_pool_could_not_supply_a_reader_every_true_reader_and_victim_is_named(
        seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The generator's decode nodes preallocate at most 2,000 pages for a prompt
    (``Layout(capped_prompt_pages=2000)``; ``bench/generate.py``'s do a quarter of their pool), where
    the spec's engine takes the whole prompt's pages: an over-long prompt's placeholder reads those
    2,000, stale. Following the logs, the replay then cannot supply some of them
    (``pool_cannot_supply``), gives them no pages, and its pages part from the node's. Before, it
    named none of those readers and missed true victims: at seed 12, 10 of 13 true readers, 48 of 205
    true (reader, victim) pairs and 45 of 65 (reader, tenant) pairs; at seed 13, 10 of 14, 133 of
    242, 56 of 79. Now every reader that read pages it did not write on such a node (one it gave no
    pages, or whose pages held nothing in it) is named, with every request whose data may have been
    in the node's pool then a possible victim, "not ruled out": every true reader, victim and tenant
    is named, none certain. Past the budget, none is listed, and the readers the replay names no
    victim of are still counted and said possibly exposed (never "not exposed")."""
    truth, rows, found, summary = _both(tmp_path, Layout(capped_prompt_pages=2000), seed)
    assert f"(reader, victim) pairs: 0 certain, {len(_pairs(rows)):,} possible" in summary._repr_html_()
    confirm = found.replays[0]
    assert {d.kind for d in confirm.disagreements} == {"pool_cannot_supply"}
    assert confirm.unsupplied and {n for n, _ in confirm.unsupplied} <= {"decode-0", "decode-1"}
    assert {(n, rid) for n, rid in confirm.unsupplied} <= {(d.node, d.request_id) for d in confirm.disagreements}
    assert {r["reader_request"] for r in truth} <= {r["reader_request"] for r in rows}
    for key in ("victim_request", "victim_tenant"):
        assert _pairs(truth, key) <= _pairs(rows, key), sorted(_pairs(truth, key) - _pairs(rows, key))[:5]
    assert all(r["certainty"] == "possible" for r in rows)
    unsupplied = {rid for _, rid in confirm.unsupplied}
    assert all(r["certainty_note"].startswith("not ruled out: the replay could not give the reader its pages")
               for r in rows if r["reader_request"] in unsupplied)
    assert any(r["certainty_note"].startswith("not ruled out: the replay could not follow this node's logs")
               for r in rows)
    # the readers it names no victim of: the unsupplied ones, and those whose pages held nothing in it
    without = {r["reader_request"] for r in rows} - {r["reader_request"] for r in rows if r["pages"] is not None}
    assert unsupplied & without and found.filled is not None and found.filled.possible_readers == len(without)
    assert any(line.startswith(f"{len(without)} delivered responses read pages their transfer did not write where "
                               "the replay could not follow the logs") for line in _notes(found))
    # past the budget: no pair listed, the readers still counted and said possibly exposed
    from forensics.exposure import tiers
    from kvforensics.story import verdict

    monkeypatch.setattr(tiers, "NOT_RULED_OUT_PAIRS", 10)
    found = run([tmp_path / "stripped"], tmp_path / "budget.duckdb", None)
    assert found.filled is not None and not found.filled.not_ruled_out_listed
    assert found.filled.possible_readers == len(without)
    with Case(tmp_path / "budget.duckdb") as case:
        listed = case.exposures(delivered_only=True).to_dicts()
    assert not any((r["certainty_note"] or "").startswith("not ruled out") for r in listed)
    said = verdict(found, [])
    assert said.startswith("Possibly exposed: ") and "Not exposed" not in said
    from reports.render import report

    report(tmp_path / "budget.duckdb", tmp_path / "report.html")
    text = " ".join((tmp_path / "report.html").read_text().split())
    assert (f"{len(without)} delivered responses may have read other requests' content</b> on nodes without page "
            "records where the replay could not follow the logs") in text
    assert "No delivered response attended to another request's pages in this case." not in text
    assert "0 of all the pairs, page records' included, are certain" in text


def _pages(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _not_ruled_out(replayed: list[dict], node: str, split: tuple[int, int], reader: str,
                   retracted: set[str]) -> set[str]:
    """The requests whose data ``reader``'s pages may have held on ``node``, by their definition
    (forensics/sql/not_ruled_out.sql), walked record by record: what each page held at the split,
    or was written after it, by a request that let its pages go before the reader took its own
    (a retracted request: at the first retraction line while it ran, else from its start; a
    retracted reader took them up to its last page record)."""
    boot, at = split
    on = sorted((r for r in replayed if r["node"] == node and r.get("boot", 0) == boot and r.get("seq") is not None),
                key=lambda r: r["seq"])
    mine = [r["seq"] for r in on if r.get("kind") == "kv" and r["request_id"] == reader]
    taken = max(mine) if reader in retracted else min(r["seq"] for r in on if r.get("kind") == "kv"
                                                       and r["request_id"] == reader and r["op"] == "alloc")
    held: dict[int, str] = {}
    since: dict[str, int] = {}
    released: dict[str, int] = {}
    for r in on:
        if r.get("kind") == "kv" and r["op"] == "write":
            if r["seq"] < at:
                held.update(dict.fromkeys(_pages(r["pages"]), r["request_id"]))
            else:
                since.setdefault(r["request_id"], r["seq"])
        elif r.get("kind") == "kv" and r["op"] == "free":
            released.setdefault(r["request_id"], r["seq"])
    lines = [r["seq"] for r in on if r.get("cache") == "retracted"]
    for w in retracted:
        began = next(r["seq"] for r in on if r.get("event") == "decode_started" and r.get("request_id") == w)
        ended = next((r["seq"] for r in on if r.get("event") == "finished" and r.get("request_id") == w
                      and r["seq"] > began), 1 << 62)
        gone = min((q for q in lines if began < q < ended), default=began)
        released[w] = min(released.get(w, gone), gone)
    for w in held.values():
        since[w] = at
    return {w for w, s in since.items() if w != reader and w in released and max(s, released[w]) < taken}


def test_a_node_whose_replay_did_not_follow_its_logs_is_not_replayed_under_other_schedules(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The capped layout with steps that drift off the clock: the decode nodes' times leave some
    steps open, and their replay cannot follow their logs (``pool_cannot_supply``). There every
    victim is possible under any schedule, and every request not ruled out is named already, so the
    job replays those nodes under no other schedule (at 3,000 requests of bench/generate.py's
    incident, 12.0 of the job's 17.0 s): its rows are those it gave with the other schedules
    replayed there, column for column."""
    from forensics.exposure.tiers import fill_from_replay
    from kvforensics import job
    from replay.schedule import ALTERNATIVES

    full = generate(tmp_path / "full", seed=12, requests=200,
                    layout=Layout(capped_prompt_pages=2000, jitter_ns=450_000, ms_times=True))
    stripped = strip_pages(full, tmp_path / "stripped")
    asked: list[frozenset[str] | None] = []
    real, real_schedules = job.replay, job.replay_schedules

    def counted(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("only"))
        return real(*args, **kwargs)

    def counted_schedules(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("only"))
        return real_schedules(*args, **kwargs)

    monkeypatch.setattr(job, "replay", counted)
    monkeypatch.setattr(job, "replay_schedules", counted_schedules)
    db = tmp_path / "request-level.duckdb"
    found = run([stripped], db, None)
    confirm = found.replays[0]
    disagreeing = {d.node for d in confirm.disagreements}
    assert confirm.ambiguous_nodes and set(confirm.ambiguous_nodes) <= disagreeing  # (both, on the same nodes)
    assert asked == [None]  # the confirming replay only
    with Case(db) as case:
        rows = case.exposures().to_dicts()
    assert rows and all(r["certainty"] == "possible" for r in rows)

    # the same fill with every ambiguous node replayed under the other schedules, as before
    varied = frozenset(confirm.ambiguous_nodes)
    alternatives = [(s.name, real(db, confirm.engine, tmp_path / s.name, schedule=s, only=varied).out
                     / "replay.duckdb") for s in ALTERNATIVES]
    before = fill_from_replay(db, confirm.out / "replay.duckdb", alternatives, sorted(disagreeing), sorted(varied),
                              (), confirm.unsupplied)
    with Case(db) as case:
        again = case.exposures().to_dicts()
    assert before == found.filled
    was, now = _by_pair(again), _by_pair(rows)
    assert set(was) == set(now) and len(was) == len(again) == len(rows)
    changed = [k for k in was if was[k] != now[k]]
    # a pair only another schedule named was said so (its first row under it); now it is one of the
    # requests not ruled out (at its reader's first row), as any other there
    for k in changed:
        assert was[k]["certainty_note"] == ("the replay could not follow this node's logs everywhere "
                                            "(replay_disagreements)")
        assert now[k]["certainty_note"].startswith("not ruled out: the replay could not follow this node's logs")
        assert {f for f in was[k] if was[k][f] != now[k][f]} <= {"certainty_note", "first_seq", "first_ts"}
    assert len(changed) <= len(rows) // 100


def test_where_page_records_name_every_victim_no_pair_is_said_not_ruled_out(tmp_path: Path) -> None:
    """The capped layout with its page records kept: the confirming replay still cannot follow the
    decode nodes' logs (``pool_cannot_supply``), but no node needs it: the page records say whose
    data each page held, every victim is certain, and nothing says that pairs are not ruled out.
    (Before, the pairs not ruled out were counted on every disagreeing node, filled or not: at 5
    million records of bench/generate.py's incident, 981,734,731 of them, and the story said the
    victims there were possible and others might be missed.)"""
    full = generate(tmp_path / "full", seed=12, requests=200, layout=Layout(capped_prompt_pages=2000))
    found = run([full], tmp_path / "case.duckdb", tmp_path / "report.html")  # (with a report: the replays run)
    assert {d.kind for d in found.replays[0].disagreements} == {"pool_cannot_supply"}
    assert found.filled is not None and found.filled.nodes == () and found.filled.not_ruled_out == 0
    assert found.certainty is not None and found.certainty["victim_requests"]["possible"] == 0
    assert found.certainty["victim_requests"]["certain"] > 0
    assert not any("not ruled out" in line for line in _notes(found))


def test_where_every_node_logged_its_page_records_no_other_schedule_is_replayed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Drifting steps leave some decode events' steps undecided, but every node logged its page
    records: they name the victims, the fill takes no row from the replay, and the job replays no
    other schedule (at 5 million records of bench/generate.py's incident they had taken 676.6 of the
    job's 1,089.9 s, for nothing). Where a node lacks them, it does (test_one_case.py)."""
    from kvforensics import job

    full = generate(tmp_path / "full", seed=7, requests=200, layout=Layout(jitter_ns=450_000, ms_times=True))
    called: list[object] = []
    monkeypatch.setattr(job, "replay_schedules", lambda *a, **k: called.append(k) or [])
    found = run([full], tmp_path / "case.duckdb", tmp_path / "report.html")
    assert found.replays[0].ambiguous_nodes and not found.replays[0].disagreements
    assert called == []
    assert found.filled is not None and found.filled.nodes == () and found.filled.rows == 0
    assert found.certainty is not None and found.certainty["victim_requests"]["possible"] == 0
    assert found.certainty["victim_requests"]["certain"] > 0
