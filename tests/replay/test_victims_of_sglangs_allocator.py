"""The victims the replay names from request-level logs, held to runs of SGLang's own allocator
(issue #42's check): the decode runs of tests/replay/allocator (the allocator classes of the 0.5.23
wheel run on CPU torch; 0.5.11's and 0.5.21's give the same slots, checked below), their longest
prompts over-long, written as request-level logs and worked out by tests/allocator_runs.py, which
shares no code with replay/. Each run: page size 1 and 64, the overlap scheduler on and off, three
seeds. Shown: the exposed responses exactly; the certain (reader, victim) pairs at least 99% right
and at least 90% of the true ones; certain and possible together at least 99% of the true ones;
the same for (reader, victim tenant). Before the fix this found (a placeholder's first decode step
writes its last, partly filled prompt page), page size 64 named the wrong victim for up to 30% of
the pairs; page size 1, where no page is partly filled, was exact."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from allocator_runs import logs, run_of, victims

from kvforensics.job import run

FIXTURES = Path(__file__).resolve().parent / "allocator"
RUNS = sorted((FIXTURES / "0.5.23").glob("ps*-decode-*.json"))


def test_each_release_gave_the_same_slots() -> None:
    for path in RUNS:
        want = json.loads(path.read_text())["outcome"]
        for release in ("0.5.11", "0.5.21"):
            assert json.loads((FIXTURES / release / path.name).read_text())["outcome"] == want, (release, path.name)


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.stem)
def test_the_replay_names_the_victims_sglangs_allocator_made(path: Path, tmp_path: Path) -> None:
    fixture = json.loads(path.read_text())
    incident = run_of(fixture)
    folder = logs(incident, tmp_path / "logs", overlap="no-overlap" not in path.stem)
    done = run([folder], tmp_path / "case.duckdb", None)
    (confirm,) = [r for r in done.replays if r.mode == "confirm"]
    assert confirm.disagreements == () and confirm.not_replayed == 0
    con = duckdb.connect(str(tmp_path / "case.duckdb"), read_only=True)
    rows = con.execute("SELECT reader_request, victim_request, certainty FROM replay_exposures "
                       "WHERE reader_delivered").fetchall()
    con.close()
    true = victims(incident)
    assert len(true) >= 20  # (the run is an incident: enough placeholders read others' pages)
    assert {r for r, _, _ in rows} == {r for r, _ in true}  # exposed responses, exactly
    certain = {(r, v) for r, v, c in rows if c == "certain"}
    named = {(r, v) for r, v, _ in rows}
    tenant = incident.tenant
    for pairs in (lambda s: s, lambda s: {(r, tenant(v)) for r, v in s}):  # (reader, victim), (reader, its tenant)
        t, c, n = pairs(true), pairs(certain), pairs(named)
        assert len(c & t) >= 0.99 * len(c)  # certain: at least 99% precise
        assert len(n & t) >= 0.99 * len(t)  # certain and possible: at least 99% of the true ones
        assert len(c & t) >= 0.90 * len(t)  # certain alone: at least 90% of them
