"""The replay follows the evidence however the deployment logged it, and never contradicts it
silently: held to a generator that shares no code with ``replay/`` (tests/independent_logs.py,
written from reference-engine.md), in each evidence layout, with the page records stripped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from independent_logs import Layout, generate, strip_pages
from typer.testing import CliRunner

import forensics
from forensics.exposure.reference import expand
from kvforensics.cli import EXIT_DISAGREES, app
from replay.engine import NodeConfig
from replay.replay import logged_engine, replay

LAYOUTS = {
    "both sides log the transfer": Layout(),
    "prefill logs its end only": Layout(ends="prefill"),
    "decode logs start and end only": Layout(ends="decode", starts="decode"),
    "no start, prefill's end, clocks 30 ms apart": Layout(ends="prefill", starts="none", skew_ns=30_000_000),
    "a decode node restarts; the router logs no seq": Layout(restart=True, seqless_router=True),
    "a decode node restarts with requests in flight": Layout(restart=True, in_flight=True),
    "a restart in flight, prefill's end only, clocks apart": Layout(restart=True, in_flight=True, ends="prefill",
                                                                    skew_ns=20_000_000),
    "each request's KV in three transfers": Layout(chunks=3),
    "three transfers, decode logs their ends only": Layout(chunks=3, ends="decode", starts="none"),
    "no transfer records at all": Layout(ends="none", starts="none"),
    "no transfer end, clocks 30 ms apart, a restart in flight": Layout(ends="none", skew_ns=30_000_000, restart=True,
                                                                      in_flight=True),
    "three transfers, no end logged": Layout(chunks=3, ends="none", starts="decode"),
    "prefill keeps prompts in its prefix cache": Layout(prefix_cache=True),
}


def figures_and_replay(tmp: Path, seed: int, layout: Layout, requests: int = 200) -> tuple[dict[str, int], object]:
    full = generate(tmp / "full", seed=seed, requests=requests, layout=layout)
    figures = forensics.investigate([full], tmp / "full.duckdb").exposure
    stripped = strip_pages(full, tmp / "stripped")
    forensics.investigate([stripped], tmp / "stripped.duckdb")
    return figures, replay(tmp / "stripped.duckdb", "sglang-placeholder", tmp / "replay")


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_replay_of_request_level_evidence_gives_the_page_logs_figures(tmp_path: Path, name: str) -> None:
    figures, result = figures_and_replay(tmp_path, seed=11, layout=LAYOUTS[name])
    assert figures["exposed_responses"] > 0  # (the set holds an incident)
    assert result.mode == "confirm"
    assert result.exposure == figures
    assert result.disagreements == ()
    assert result.outcomes_changed == 0


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# (found by Hypothesis: requests decoding when their node restarts took no steps in the replay, and
# one whose last record was its decode start was let go at once, so later pages came out shifted)
@example(10_000, "prefill", "prefill", 5_000_000, "in flight")
@given(st.integers(0, 10_000), st.sampled_from(["prefill", "decode", "both", "none"]),
       st.sampled_from(["prefill", "decode", "both", "none"]), st.sampled_from([0, 5_000_000]),
       st.sampled_from(["none", "between requests", "in flight"]))
def test_any_layout_of_any_run_replays_exactly(tmp_path: Path, seed: int, ends: str, starts: str, skew: int,
                                               restart: str) -> None:
    tmp = tmp_path / f"run-{seed}-{ends}-{starts}-{skew}-{restart}"
    shutil.rmtree(tmp, ignore_errors=True)
    layout = Layout(ends=ends, starts=starts, skew_ns=skew, restart=restart != "none", in_flight=restart == "in flight")
    figures, result = figures_and_replay(tmp, seed, layout, requests=120)
    assert result.exposure == figures
    assert result.disagreements == ()


def test_prefills_prefix_cache_gives_the_logged_prefill_pages_page_for_page(tmp_path: Path) -> None:
    """The generator's own prefix cache (its prompts' full pages kept after their transfers, the
    least recently touched freed when a prompt's pages are short): replayed from the full logs,
    every allocation, prefill's after its evictions included, is the logged one. The cache had to
    evict: a prefill node allocated more pages than its pool holds, and only evictions free
    cached pages."""
    full = generate(tmp_path / "full", seed=11, requests=200, layout=Layout(prefix_cache=True))
    allocated = {}
    for f in full.glob("prefill-*.jsonl"):
        records = [json.loads(line) for line in f.read_text().splitlines()]
        pool = next(r["pool_pages"] for r in records if r["kind"] == "config")
        allocated[f.stem] = (sum(len(expand(r["pages"])) for r in records
                                 if r["kind"] == "kv" and r["op"] == "alloc"), pool)
    assert any(n > pool for n, pool in allocated.values()), allocated
    forensics.investigate([full], tmp_path / "full.duckdb")
    result = replay(tmp_path / "full.duckdb", "sglang-placeholder", tmp_path / "replay")
    assert result.disagreements == () and result.agreement is not None
    assert result.agreement.reproduced_allocations == result.agreement.logged_allocations


def test_logs_that_contradict_the_pool_give_listed_disagreements(tmp_path: Path) -> None:
    """A logged success no allocator could have placed: decode's pool, as its config states it,
    is far too small for the prompts the logs show served. Confirmation follows the logs and
    lists each such request; the command exits with its own code."""
    full = generate(tmp_path / "full", seed=3, requests=80)
    for f in full.glob("decode-*.jsonl"):
        records = [json.loads(line) for line in f.read_text().splitlines()]
        for r in records:
            if r["kind"] == "config":
                r["pool_pages"] = 40
        f.write_text("".join(json.dumps(r) + "\n" for r in records if r["kind"] != "kv"))
    stripped = strip_pages(full, tmp_path / "stripped")
    db = tmp_path / "case.duckdb"
    forensics.investigate([stripped], db)
    result = replay(db, "sglang-placeholder", tmp_path / "replay")
    assert result.mode == "confirm" and len(result.disagreements) > 10
    assert {d.kind for d in result.disagreements} == {"pool_cannot_supply"}
    assert all(d.node.startswith("decode-") for d in result.disagreements)
    case = forensics.Case(db, read_only=True)
    kept = case.sql("SELECT count(*) AS n FROM replay_disagreements")["n"][0]
    case.close()
    assert kept == len(result.disagreements)
    cli = CliRunner().invoke(app, ["replay", "--db", str(db), "--out", str(tmp_path / "again")])
    assert cli.exit_code == EXIT_DISAGREES
    assert f"confirmed, with {len(result.disagreements)} disagreements" in cli.stdout
    as_json = CliRunner().invoke(app, ["replay", "--db", str(db), "--out", str(tmp_path / "again"), "--json"])
    assert as_json.exit_code == EXIT_DISAGREES
    assert json.loads(as_json.stdout)["disagreements"]["count"] == len(result.disagreements)


def test_a_what_if_says_how_many_logged_outcomes_it_changed(tmp_path: Path) -> None:
    full = generate(tmp_path / "full", seed=5, requests=150)
    stripped = strip_pages(full, tmp_path / "stripped")
    db = tmp_path / "case.duckdb"
    forensics.investigate([stripped], db)
    over_long = sum(1 for line in (full / "prefill-0.jsonl").read_text().splitlines()
                    + (full / "prefill-1.jsonl").read_text().splitlines()
                    if '"input_too_long"' in line)
    result = replay(db, "sglang-hardened", tmp_path / "replay")
    assert result.mode == "what-if" and result.disagreements == ()
    assert result.exposure["exposed_responses"] == 0
    assert result.outcomes_changed == over_long > 0  # the over-long prompts, delivered then, rejected now


@pytest.mark.parametrize(("version", "engine"), [("0.5.21", "sglang-placeholder"), ("0.5.11", "sglang-placeholder"),
                                                 ("0.5.22", "sglang-hardened"), ("0.6.0", "sglang-hardened"),
                                                 ("dev", None)])
def test_the_logged_engine_comes_from_the_prefill_configs(version: str, engine: str | None) -> None:
    config = NodeConfig("prefill-0", "prefill", 100, 16, 64, "sglang", version)
    assert logged_engine({"prefill-0": [(0, 0, "", config)]}) == engine


def test_no_bare_zero_request_level_evidence_is_summarised_by_tier(tmp_path: Path) -> None:
    """Without page records, investigate (no --out) runs the confirming replay and shows the figures
    by evidence tier, with their total and the nodes that lack page records: never a bare 0."""
    full = generate(tmp_path / "full", seed=13, requests=150)
    truth = forensics.investigate([full], tmp_path / "full.duckdb").exposure
    stripped = strip_pages(full, tmp_path / "stripped")
    db = tmp_path / "case.duckdb"
    cli = CliRunner().invoke(app, ["investigate", str(stripped), "--db", str(db)])
    assert cli.exit_code == 0, cli.output
    header = next(line for line in cli.stdout.splitlines() if line.startswith("figure"))
    assert "page records" in header and "transfer records + replay" in header and "total" in header
    row = next(line for line in cli.stdout.splitlines() if line.startswith("exposed_responses"))
    assert row.split()[1] == "0" and row.split()[-1] == f"{truth['exposed_responses']:,}"
    assert "page records missing on decode-0, decode-1, prefill-0, prefill-1" in cli.stdout
    as_json = json.loads(CliRunner().invoke(app, ["investigate", str(stripped), "--db", str(db), "--json"]).stdout)
    total = as_json["tiers"]["total"]
    assert {k: v for k, v in total.items() if k != "uninitialized_reads"} == {
        k: v for k, v in truth.items() if k != "uninitialized_reads"}
    assert total["uninitialized_reads"] is None  # not measured by replay: not a zero
    assert as_json["nodes_without_page_records"] == ["decode-0", "decode-1", "prefill-0", "prefill-1"]
    with forensics.Case(db, read_only=True) as case:
        summary = case.summary()
        assert summary["exposed_responses"] == 0 and summary.tiers["total"]["exposed_responses"] == truth[
            "exposed_responses"]
        assert "transfer records + replay" in summary._repr_html_()


def test_full_page_records_say_so_beside_their_figures(tmp_path: Path) -> None:
    full = generate(tmp_path / "full", seed=13, requests=60)
    cli = CliRunner().invoke(app, ["investigate", str(full), "--db", str(tmp_path / "case.duckdb")])
    assert cli.exit_code == 0
    assert "(evidence: page records, on every engine node that logged requests)" in cli.stdout
    assert "replay under" not in cli.stdout  # nothing to fill: no replay


@pytest.mark.parametrize(("field", "kind"), [("prefix_cache", "decode_prefix_cache"),
                                             ("speculative_decoding", "speculative_decoding"),
                                             ("kv_offload", "decode_kv_offload"),
                                             ("hybrid_pool", "decode_hybrid_pool")])
def test_what_decode_runs_that_the_replay_does_not_model_makes_its_victims_possible(
        field: str, kind: str, tmp_path: Path) -> None:
    """A decode node whose config says it keeps prompts in a prefix cache (SGLang's
    --disaggregation-decode-enable-radix-cache: its finished requests' pages stay cached), or runs
    speculative decoding (several slots a request a step, the rejected drafts freed), or offloads
    each request's KV to host storage (SGLang's --disaggregation-decode-enable-offload-kvcache: a
    finished request's pages freed once the copies are done), or has a KV pool of another layout
    (SGLang's hybrid sliding-window or unified memory pool): none is modelled. The replay says so,
    a disagreement a decode node, and the job names every victim there possible, none certain."""
    from forensics.case import Case
    from kvforensics.job import run

    full = generate(tmp_path / "full", seed=11, requests=150)
    stripped = strip_pages(full, tmp_path / "stripped")
    for f in stripped.glob("decode-*.jsonl"):
        records = [json.loads(line) for line in f.read_text().splitlines()]
        for r in records:
            if r["kind"] == "config":
                r[field] = True
        f.write_text("".join(json.dumps(r) + "\n" for r in records))
    db = tmp_path / "case.duckdb"
    forensics.investigate([stripped], db)
    result = replay(db, "sglang-placeholder", tmp_path / "replay")
    assert sorted((d.kind, d.node) for d in result.disagreements) == [(kind, "decode-0"), (kind, "decode-1")]
    run([stripped], tmp_path / "job.duckdb", None)
    with Case(tmp_path / "job.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
    assert rows and {r["certainty"] for r in rows} == {"possible"}


def test_what_changes_no_decode_page_is_assumed_not_a_disagreement(tmp_path: Path) -> None:
    """A prefill node whose config says its KV pool is of another layout (``hybrid_pool``: prefill's
    pages only, no victim depends on them), and decode nodes whose requests hold recurrent state
    (``recurrent_state``: SGLang's Mamba cache; the pages are the plain allocator's, the state slots
    not followed): no disagreement, the same victims, and each said in the replay's ``assumed``
    with the nodes it is on."""
    full = generate(tmp_path / "full", seed=11, requests=150)
    stripped = strip_pages(full, tmp_path / "stripped")
    before = replay(_investigated([stripped], tmp_path / "before.duckdb"), "sglang-placeholder", tmp_path / "r0")
    for f, field in ((stripped / "prefill-0.jsonl", "hybrid_pool"), (stripped / "decode-0.jsonl", "recurrent_state"),
                     (stripped / "decode-1.jsonl", "recurrent_state")):
        records = [json.loads(line) for line in f.read_text().splitlines()]
        for r in records:
            if r["kind"] == "config":
                r[field] = True
        f.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = replay(_investigated([stripped], tmp_path / "case.duckdb"), "sglang-placeholder", tmp_path / "r1")
    assert result.disagreements == () and result.exposure == before.exposure
    assert [a.split(":")[0] for a in result.assumed if a not in before.assumed] == [
        "a plain paged KV pool on 1 prefill node(s) whose config says another layout (SGLang's hybrid sliding-window "
        "or unified memory pool)",
        "the KV pages alone on 2 node(s) whose requests also hold recurrent state (SGLang's Mamba cache, a hybrid "
        "linear-attention model)"]
    assert [a.rsplit(": ", 1)[1] for a in result.assumed if a not in before.assumed] == ["prefill-0",
                                                                                        "decode-0, decode-1"]


def _investigated(folders: list[Path], db: Path) -> Path:
    forensics.investigate(folders, db)
    return db


def test_a_request_decode_retracted_makes_the_victims_on_its_node_possible_from_its_start(tmp_path: Path) -> None:
    """A decode finish that says the node retracted the request under memory pressure (schema v1.1
    ``retractions``: SGLang's ``num_retractions``; its pages freed, its KV restored into pages taken
    afresh later), which the replay does not model. The replay lists it (``decode_retracted``) and
    carries the field into its replayed logs. It cannot have been retracted before it joined the
    batch, and until then the node did what the replay did: the job names possible exactly the
    victims on that node of the readers that took their pages from its ``decode_started`` on (by
    the replayed set's order), with every request not ruled out beside them; the victims of the
    readers that took theirs before it certain, and the other decode node's certain, as before."""
    from forensics.case import Case
    from kvforensics.job import run

    full = generate(tmp_path / "full", seed=11, requests=150)
    stripped = strip_pages(full, tmp_path / "stripped")
    decode = stripped / "decode-1.jsonl"
    records = [json.loads(line) for line in decode.read_text().splitlines()]
    finishes = [r for r in records if r.get("event") == "finished" and r.get("status") == 200]
    finish = finishes[len(finishes) // 2]  # (a request halfway: victims read on both sides of its start)
    finish["retractions"] = 1
    decode.write_text("".join(json.dumps(r) + "\n" for r in records))
    db = tmp_path / "case.duckdb"
    forensics.investigate([stripped], db)
    result = replay(db, "sglang-placeholder", tmp_path / "replay")
    assert [(d.kind, d.node, d.request_id) for d in result.disagreements] == [
        ("decode_retracted", "decode-1", finish["request_id"])]
    replayed = [json.loads(line) for f in (result.out / "logs").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert [(r["node"], r["request_id"]) for r in replayed if r.get("retractions") == 1] == [
        ("decode-1", finish["request_id"])]
    run([stripped], tmp_path / "job.duckdb", tmp_path / "report.html")
    with Case(tmp_path / "job.duckdb") as case:
        rows = case.exposures(delivered_only=True).to_dicts()
    start = next((r.get("boot", 0), r["seq"]) for r in replayed if r["node"] == "decode-1"
                 and r.get("request_id") == finish["request_id"] and r.get("event") == "decode_started")
    taken: dict[str, tuple[int, int]] = {}  # where each request took its pages on decode-1
    for r in replayed:
        if r["node"] == "decode-1" and r.get("op") == "alloc":
            taken.setdefault(r["request_id"], (r.get("boot", 0), r["seq"]))
    assert {r["certainty"] for r in rows if r["node"] == "decode-0"} == {"certain"}
    on = [r for r in rows if r["node"] == "decode-1"]
    before = {(r["reader_request"], r["victim_request"]) for r in on if taken[r["reader_request"]] < start}
    assert before and len(before) < len(on)
    assert {(r["reader_request"], r["victim_request"]) for r in on if r["certainty"] == "certain"} == before
    after = [r for r in on if taken[r["reader_request"]] >= start]
    named = [r for r in after if r["pages"] is not None]
    assert named and {r["certainty_note"] for r in named} == {
        "the reader took its pages after a request the node's decode retracted under memory pressure joined its "
        "batch, which the replay does not model (replay_disagreements)"}
    # beside them, every request whose data its pages may have held (a retracted request's own among them)
    beside = [r for r in after if r["pages"] is None]
    assert beside and all(r["certainty"] == "possible" and r["n_pages"] == 0
                          and r["certainty_note"].startswith("not ruled out: ") for r in beside)
    assert finish["request_id"] in {r["victim_request"] for r in beside}
    # the report says what the disagreement means, beside the replay's figures
    report = " ".join((tmp_path / "report.html").read_text().split())
    assert ("<li><code>decode_retracted</code> (1): SGLang&#39;s decode retracted running requests under memory "
            "pressure") in report
