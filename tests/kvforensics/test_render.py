"""Tables and verdicts for people: fitted to the width, numbers grouped, one time format, and a
possible victim never printed as a certain one (issue #45)."""

from __future__ import annotations

import datetime as dt
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import polars as pl
import pytest
from conftest import FIXTURES
from rich.cells import cell_len

from forensics.exposure.tiers import PAGE_EVIDENCE, REQUEST_REPLAY, TOTAL, TRANSFER_REPLAY, Filled
from forensics.ids import NodeId
from kvforensics import render
from kvforensics.story import verdict

TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} UTC")


def _wide() -> pl.DataFrame:
    return pl.DataFrame({
        "reader_request": ["req-2026-000182", "req-\x1b[2J-7"],
        "victim_tenant": ["tenant-02", "租户-七"],
        "first_ts": [dt.datetime(2026, 9, 14, 8, 0, 44, 925000, tzinfo=dt.UTC), None],
        "n_pages": [94609, 1234567],
        "seq": [12345, 7],
        "pages": ["2-134,228,381,385,833,1333,1670," * 4, "1"],
        "detail": ["a reason that goes on and on " * 5, None],
        "certainty": ["certain", "possible"],
    })


@pytest.mark.parametrize("cells", [80, 160])
def test_a_table_fits_the_width_groups_numbers_and_prints_one_time_format(cells: int) -> None:
    lines = render.table(_wide(), cells)
    assert max(cell_len(line) for line in lines) <= cells
    text = "\n".join(lines)
    assert "94,609" in text and "1,234,567" in text  # counts grouped
    assert "12345" in text and "12,345" not in text  # a seq is a position: as logged
    assert TIME.search(text) and "+00:00" not in text
    assert "\x1b" not in text and "\\x1b[2J" in text  # a terminal escape from the logs, shown as text
    assert "租户-七" in text  # (two cells a character: measured as such)


def test_a_narrow_table_cuts_text_with_an_ellipsis_and_names_the_columns_left_out() -> None:
    lines = render.table(_wide(), 80)
    assert "reader_request" in lines[0] and "req-2026-000182" in lines[2]  # an id whole
    left_out = " ".join(lines[-2:])
    assert "(3 columns not shown at 80 columns: pages, detail, certainty; --format csv or json" in left_out
    cut = "\n".join(render.table(_wide(), 160))
    assert re.search(r"  2-134,228,[\d,-]+…  ", cut) and "a reason that goes on a…" in cut and "not shown" not in cut
    wide = "\n".join(render.table(_wide(), 400))  # (text cut at 60 cells however wide: one row a line)
    assert "not shown" not in wide and "a reason that goes on and on a reason that goes on and on a…" in wide


def test_a_path_too_wide_for_its_column_keeps_its_file_name() -> None:
    """A file's path is cut at its start, not its end: what is left names the file."""
    path = "/tmp/pytest-of-root/pytest-384/popen-gw0/a-long-folder-name/told0/pages.jsonl"
    frame = pl.DataFrame({"file": [path], "line": [14], "reason": ["not_json"], "detail": ["not valid JSON " * 4]})
    lines = render.table(frame, 60, first=("file", "line", "reason"))
    assert all(cell_len(line) <= 60 for line in lines)
    assert re.search(r"^…\S*told0/pages\.jsonl  ", lines[2]), lines[2]
    assert render.cut_start(path, 12) == "…pages.jsonl" and render.cut_start("short", 12) == "short"
    assert render.cut(path, 12) == "/tmp/pytest…"  # (any other text keeps its start)


def test_columns_named_first_are_kept_when_the_rest_do_not_fit() -> None:
    lines = render.table(_wide(), 50, first=("certainty", "reader_request"))
    assert "certainty" in lines[0] and "reader_request" in lines[0]
    assert all(cell_len(line) <= 50 for line in lines)


def test_a_command_is_quoted_and_continued_with_a_backslash_where_it_is_too_wide() -> None:
    argv = ["kvforensics", "request", "req $(rm -rf ~)", "--db", "/tmp/" + "a" * 30 + "/case.duckdb"]
    lines = render.command(argv, 60)
    assert all(len(line) <= 60 for line in lines) and lines[0].endswith(" \\")
    assert shlex.split(" ".join(line.rstrip("\\") for line in lines)) == argv


def _found(exposed: int, victims: tuple[int, int], tenants: tuple[int, int], *, missing: tuple[str, ...] = (),
           filled: bool = True, readers: int = 0, pairs: int = 0) -> Any:
    """A whole job's result as the verdict reads it: figures by tier and the victims' certainty
    (``readers``: possible readers the replay names no victim of, ``pairs`` not ruled out, not listed)."""
    tier = REQUEST_REPLAY if missing else PAGE_EVIDENCE
    figures = {"exposed_responses": exposed, "victim_requests": sum(victims), "affected_tenants": sum(tenants)}
    zero = dict.fromkeys(figures, 0)
    tiers = {t: (figures if t in (tier, TOTAL) else zero) for t in (PAGE_EVIDENCE, TRANSFER_REPLAY, REQUEST_REPLAY,
                                                                     TOTAL)}
    return SimpleNamespace(
        tiers=tiers, investigation=SimpleNamespace(exposure=tiers[PAGE_EVIDENCE]), without_page_records=missing,
        filled=Filled(tuple(NodeId(m) for m in missing), 0, exposed, exposed, pairs, not pairs, readers)
        if filled and missing else None, replay_skipped=None if filled else "no prefill config",
        certainty={"victim_requests": {"certain": victims[0], "possible": victims[1]},
                   "affected_tenants": {"certain": tenants[0], "possible": tenants[1]}})


def test_the_verdict_never_counts_a_possible_victim_as_certain() -> None:
    every = verdict(_found(9, (329, 0), (12, 0)), [])
    assert every.startswith("Exposed: 9 delivered responses read other requests' KV pages: 329 victim requests "
                            "of 12 tenants, all certain, on page records")
    mixed = verdict(_found(5, (40, 3), (6, 1), missing=("decode-0",)), [])
    assert mixed.startswith("Exposed: 5 delivered responses read, or may have read,")
    assert "43 victim requests (40 certain, 3 possible) of 7 tenants (6 certain, 1 possible)" in mixed
    assert "request records + replay" in mixed
    possible = verdict(_found(2, (0, 4), (0, 2), missing=("decode-0",)), [])
    assert possible.startswith("Possibly exposed: 2 delivered responses may have read")
    assert "all possible (none certain)" in possible and "certain," not in possible


def test_the_verdict_says_on_what_evidence_nothing_was_exposed() -> None:
    critical = [SimpleNamespace(severity="critical"), SimpleNamespace(severity="high")]
    pages = verdict(_found(0, (0, 0), (0, 0)), [])
    assert pages.startswith("Not exposed: page records on every engine node")
    replayed = verdict(_found(0, (0, 0), (0, 0), missing=("decode-0", "prefill-0")), critical)  # type: ignore[arg-type]
    assert replayed.startswith("Not exposed on the evidence: decode-0, prefill-0 logged no page records")
    assert replayed.endswith("; but 1 critical finding stands (below).")
    unknown = verdict(_found(0, (0, 0), (0, 0), missing=("decode-0",), filled=False), [])
    assert unknown.startswith("Not known: decode-0 logged no page records and was not replayed (no prefill config)")


def test_the_verdict_never_says_not_exposed_of_readers_the_replay_names_no_victim_of() -> None:
    """Readers that read pages they did not write where the replay could not follow the logs, and that
    it names no victim of (it gave them no pages): with their requests not ruled out too many to list
    (no row names them), the verdict says they are possibly exposed, on which nodes and why, never
    "Not exposed"."""
    said = verdict(_found(0, (0, 0), (0, 0), missing=("decode-0",), readers=75, pairs=12_000_000), [])
    assert said.startswith("Possibly exposed: 75 delivered responses read pages their transfer did not write, "
                           "on decode-0, where the replay could not follow the logs and names no victim of them")
    assert "12,000,000 (reader, request) pairs not ruled out, too many to list" in said
    one = verdict(_found(0, (0, 0), (0, 0), missing=("decode-0",), readers=1, pairs=6_000_000), [])
    assert one.startswith("Possibly exposed: 1 delivered response read pages its transfer did not write")
    assert "Not exposed" not in said + one
    # (listed, they are exposed responses with possible victims: the verdict names them as such)
    listed = verdict(_found(75, (0, 2_911), (0, 12), missing=("decode-0",), readers=75, pairs=55_372), [])
    assert listed.startswith("Possibly exposed: 75 delivered responses may have read other requests' KV pages: "
                             "2,911 victim requests of 12 tenants, all possible (none certain)")


def test_the_story_is_told_of_a_parquet_case_as_spark_leaves_it(tmp_path: Path) -> None:
    """investigate --engine spark ends with the same last screen, told of its Parquet case (here
    the case exported as Spark writes it, so that no Spark runs): the verdict on page records, the
    findings, and next commands on the Parquet case that run."""
    from typer.testing import CliRunner

    import forensics
    from forensics.investigation import Investigation
    from forensics.store import export_parquet_case
    from kvforensics import story
    from kvforensics.cli import app
    from kvforensics.job import JobResult

    db, parquet = tmp_path / "case.duckdb", tmp_path / "spark-case"
    found = forensics.investigate([FIXTURES / "examples" / "placeholder" / "events.jsonl"], db)
    export_parquet_case(db, parquet)
    told = story.tell(JobResult(Investigation(found.ingest, found.exposure)), parquet)
    assert told.verdict.startswith("Exposed:") and "on page records" in told.verdict
    assert [f.id for f in told.findings] == [f.id for f in forensics.Case(db).findings()]
    assert told.next_commands and all("--db" in c and str(parquet) in c for c in told.next_commands)
    for command in told.next_commands:
        if command[1] == "report":
            continue
        ran = CliRunner().invoke(app, command[1:], env={"COLUMNS": "100"})
        assert ran.exit_code == 0 and ran.stdout.strip(), (command, ran.output)
