"""The whole job holds one open case from start to end (issue #46 item 4): the case file is opened
once, for writing, and every step (ingest, analysis, the replays, the fill, the report, the tier
figures) works on it open, with the figures of the same steps run one by one on the case's path."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pytest
from independent_logs import Layout, generate, strip_pages

import forensics
from forensics.exposure.tiers import fill_from_replay
from kvforensics.job import JobResult, run
from kvforensics.story import tell
from replay.replay import WhatIf, default_out, replay
from replay.schedule import ALTERNATIVES
from reports.render import report

GENERATED_AT = "2026-11-30T12:00:00Z"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small simulated incident whose decode steps drift off the clock, one decode node without
    its page records: the job replays to confirm and to ask what-if, under the other schedules
    the evidence allows, fills in the replay-backed tiers, and measures the replay against the
    page records of the other nodes."""
    full = generate(tmp_path_factory.mktemp("incident") / "full", seed=7, requests=120,
                    layout=Layout(jitter_ns=450_000, ms_times=True))
    bare = full.parent / "logs"
    shutil.copytree(full, bare)
    decode = sorted(bare.glob("decode-*.jsonl"))[0]
    decode.write_text("".join(line + "\n" for line in decode.read_text().splitlines()
                              if json.loads(line)["kind"] != "kv"))
    return bare


def _opens(monkeypatch: pytest.MonkeyPatch, case: Path) -> list[str]:
    """Each time DuckDB is asked to open the file ``case`` from now on (every toolkit's open ends there)."""
    opened: list[str] = []
    real = duckdb.connect

    def counted(database: Any = ":memory:", *args: Any, **kwargs: Any) -> duckdb.DuckDBPyConnection:
        if str(database) not in ("", ":memory:") and Path(str(database)).resolve() == case.resolve():
            opened.append(str(database))
        return real(database, *args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counted)
    return opened


@pytest.fixture(scope="module")
def job(logs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, list[str], Path]:
    """The whole job on the incident, the case's opens counted: the result, the opens, its folder."""
    folder = tmp_path_factory.mktemp("job")
    with pytest.MonkeyPatch.context() as patch:
        opened = _opens(patch, folder / "case.duckdb")
        found = run([logs], folder / "case.duckdb", folder / "report.html", generated_at=GENERATED_AT, story=True)
    return found, opened, folder


def test_the_whole_job_opens_its_case_once(job: tuple[JobResult, list[str], Path]) -> None:
    """Ingest, analysis, both replays, the other schedules, the fill, the report, the tier
    figures and the last screen's story: one open of the case file between them."""
    found, opened, _ = job
    assert found.replays and found.replays[0].ambiguous_nodes and found.filled is not None  # (every step ran)
    assert found.story is not None and found.story.findings
    assert found.replays[0].agreement is not None
    assert len(opened) == 1, opened


def test_the_whole_job_gives_the_figures_of_its_steps_run_path_by_path(
        job: tuple[JobResult, list[str], Path], logs: Path, tmp_path: Path) -> None:
    """The same steps, each opening the case by its path, give the same figures, replays, fill and report."""
    found, _, folder = job
    db = tmp_path / "case.duckdb"
    investigation = forensics.investigate([logs], db)
    confirm, what_if = (r.engine for r in found.replays)
    replays = [replay(db, engine, default_out(db, engine, WhatIf())) for engine in (confirm, what_if)]
    # (as the job does: the ambiguous nodes the fill takes rows from, whose replay followed their logs)
    varied = frozenset(replays[0].ambiguous_nodes) & frozenset(found.filled.nodes if found.filled else ())
    varied -= {d.node for d in replays[0].disagreements}
    assert varied  # (the job replayed them under the other schedules)
    with tempfile.TemporaryDirectory() as others:
        alternatives = [(s.name, replay(db, confirm, Path(others) / s.name, schedule=s, only=varied).out
                         / "replay.duckdb") for s in ALTERNATIVES]
        filled = fill_from_replay(db, replays[0].out / "replay.duckdb", alternatives,
                                  sorted({d.node for d in replays[0].disagreements}), sorted(varied))
    written = report(db, tmp_path / "report.html", generated_at=GENERATED_AT)
    with forensics.Case(db, read_only=True) as case:
        summary = case.summary()

    assert investigation.exposure == found.investigation.exposure
    assert investigation.ingest.records == found.investigation.ingest.records
    for one_by_one, in_job in zip(replays, found.replays, strict=True):
        assert {**one_by_one.as_dict(), "out": None} == {**in_job.as_dict(), "out": None}
    assert filled == found.filled
    assert summary.tiers == found.tiers and summary.certainty == found.certainty
    assert summary.without_page_records == found.without_page_records
    assert summary.unseen_late_writes == found.unseen_late_writes
    assert found.report is not None and written.figures == found.report.figures
    assert written.lists == found.report.lists
    told = tell(found, db)  # (the story read by the case's path)
    assert found.story is not None
    assert (told.verdict, told.figures, told.notes) == (found.story.verdict, found.story.figures, found.story.notes)
    assert [(f.id, f.count) for f in told.findings] == [(f.id, f.count) for f in found.story.findings]


def test_a_case_only_ingested_replays_through_its_open_connection(tmp_path: Path) -> None:
    """Without page records nor analysis (no ``exposures``), the replay compares its own case with
    the logged one on the logged case's connection, as when it opened the file again."""
    full = generate(tmp_path / "full", seed=1, requests=40)
    db = tmp_path / "case.duckdb"
    forensics.ingest([strip_pages(full, tmp_path / "stripped")], db)
    done = replay(db, "sglang-placeholder", tmp_path / "replay")
    assert done.agreement is None and done.records > 0 and done.exposure["exposed_responses"] >= 0
