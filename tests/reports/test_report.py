"""The HTML report: exact figures, escaping, no network or scripts, pseudonyms, determinism."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
from html import unescape
from pathlib import Path

import pytest
from conftest import FIXTURES, CommandRun, invoked, write_jsonl
from typer.testing import CliRunner

import forensics
from kvforensics.cli import app
from replay.simulate import Deployment, simulate_to
from reports.data import natural
from reports.render import report

SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2)
HOSTILE_TENANT = "<script>alert('t')</script></style>"
HOSTILE_REQUEST = '"><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def investigated(tmp_path_factory: pytest.TempPathFactory) -> CommandRun:
    """A simulated incident with exposures, through the whole job as the CLI runs it (``investigate
    --out --json``): its folder (logs, case.duckdb, first.html, first-lists), what the command
    printed and the job it ran."""
    root = tmp_path_factory.mktemp("incident")
    simulate_to(root / "logs", deployment=SMALL, requests=400, seed=1, over_long=0.05, rate=3.0)
    return invoked(["kvforensics", "investigate", str(root / "logs"), "--db", str(root / "case.duckdb"),
                    "--out", str(root / "first.html"), "--generated-at", "2026-11-30T12:00:00Z", "--json"], root)


@pytest.fixture(scope="module")
def incident(investigated: CommandRun) -> Path:
    """A simulated incident with exposures, investigated and replayed, as a case file."""
    return investigated.folder / "case.duckdb"


def _figures(html: str) -> dict[str, int]:
    return {name: int(value.replace(",", "")) for name, value in
            re.findall(r'<div class="fig" data-figure="(\w+)"><b>([\d,]+)</b>', html)}


def test_the_report_shows_the_case_figures_and_the_sql_behind_them(incident: Path, tmp_path: Path) -> None:
    out = report(incident, tmp_path / "r.html", generated_at="2026-11-30T12:00:00Z").out
    html = out.read_text()
    with forensics.Case(incident, read_only=True) as case:
        figures = case.summary()
    assert figures["exposed_responses"] > 0
    assert _figures(html) == figures
    for name in figures:
        assert f"<td>{name}</td>" in html
    assert "sglang-hardened" in html and "Rejected on prefill, handed off anyway" in html
    assert html.count("data:image/svg+xml;base64,") == 2  # both charts, embedded


def test_the_same_case_and_options_give_the_same_bytes(incident: Path, tmp_path: Path) -> None:
    a = report(incident, tmp_path / "a.html", generated_at="2026-11-30T12:00:00Z").out.read_bytes()
    b = report(incident, tmp_path / "b.html", generated_at="2026-11-30T12:00:00Z").out.read_bytes()
    assert a == b


def test_no_scripts_no_network_and_a_csp_that_matches_the_stylesheet(incident: Path, tmp_path: Path) -> None:
    html = report(incident, tmp_path / "r.html", generated_at="2026-11-30T12:00:00Z").out.read_text()
    assert "<script" not in html.lower()
    assert not re.search(r'(src|href)="(?!data:)', html)  # nothing fetched from anywhere
    found = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html)
    assert found is not None
    csp = unescape(found.group(1))  # attribute text, as the browser reads it
    assert "default-src 'none'" in csp
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"'sha256-{digest}'" in csp
    for uri in re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', html):
        assert b"<script" not in base64.b64decode(uri).lower()


def test_strings_from_the_logs_are_escaped(tmp_path: Path) -> None:
    text = (FIXTURES / "examples" / "placeholder" / "events.jsonl").read_text()
    records = [json.loads(line) for line in text.splitlines()]
    for r in records:
        if r.get("tenant_id") == "globex":
            r["tenant_id"] = HOSTILE_TENANT
        if r.get("request_id") == "r":
            r["request_id"] = HOSTILE_REQUEST
    forensics.investigate([write_jsonl(tmp_path / "logs.jsonl", records)], tmp_path / "case.duckdb")
    html = report(tmp_path / "case.duckdb", tmp_path / "r.html").out.read_text()
    assert HOSTILE_TENANT not in html and HOSTILE_REQUEST not in html
    assert "&lt;script&gt;alert(&#39;t&#39;)&lt;/script&gt;&lt;/style&gt;" in html
    assert html.count("</style>") == 1
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script" not in html.lower() and "<img src=x" not in html


def test_pseudonyms_are_keyed_stable_and_hide_every_id(incident: Path, tmp_path: Path) -> None:
    with forensics.Case(incident, read_only=True) as case:
        ids = case.sql("SELECT DISTINCT reader_request AS id FROM exposures UNION "
                       "SELECT DISTINCT victim_request FROM exposures UNION "
                       "SELECT DISTINCT tenant_id FROM requests WHERE tenant_id IS NOT NULL")["id"].to_list()
    one = report(incident, tmp_path / "1.html", pseudonymize_key="k1", generated_at="2026-11-30T12:00:00Z")
    two = report(incident, tmp_path / "2.html", pseudonymize_key="k1", generated_at="2026-11-30T12:00:00Z")
    other = report(incident, tmp_path / "3.html", pseudonymize_key="k2", generated_at="2026-11-30T12:00:00Z")
    h1, h2, h3 = (r.out.read_text() for r in (one, two, other))
    assert h1 == h2
    assert not any(re.search(rf"\b{re.escape(i)}\b", h1) for i in ids)
    names1 = set(re.findall(r"tenant-[0-9a-f]{12}", h1))
    assert len(names1) > 1 and names1.isdisjoint(re.findall(r"tenant-[0-9a-f]{12}", h3))
    regulator = report(incident, tmp_path / "4.html", audience="regulator").out.read_text()
    assert not any(re.search(rf"\b{re.escape(i)}\b", regulator) for i in ids)
    assert "Art. 33(3)" in regulator and "tenant 1" in regulator


def test_tenants_come_in_the_order_of_their_numbers(incident: Path, tmp_path: Path) -> None:
    """The regulator report's tenant matrix reads tenant 1, 2, ..., 10, 11, not 1, 10, 11, 2 (issue #45)."""
    html = report(incident, tmp_path / "r.html", audience="regulator", generated_at="2026-11-30T12:00:00Z") \
        .out.read_text()
    header = re.search(r"<tr><th>reader \\ victim</th>(.*?)</tr>", html)
    assert header is not None
    numbers = [int(n) for n in re.findall(r">tenant (\d+)<", header.group(1))]
    assert max(numbers) >= 10 and numbers == sorted(numbers)
    assert natural("tenant 2") < natural("tenant 10") < natural("tenant 10a") < natural("tenant b")


def test_investigate_with_out_runs_the_whole_job_from_the_cli(investigated: CommandRun, tmp_path: Path) -> None:
    """(The run is the module's incident's: ``investigate --out --json`` on its simulated logs.)"""
    root, result = investigated.folder, investigated.result
    runner = CliRunner()
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert [r["engine"] for r in printed["replays"]] == ["sglang-placeholder", "sglang-hardened"]
    phases = [x.split(": ")[0] for x in result.stderr.splitlines()]  # (a line per phase, with its time)
    assert phases == ["ingest", "analysis", "replay under sglang-placeholder", "replay under sglang-hardened",
                      "report and its lists"]
    assert printed["replays"][0]["exposure"] == printed["exposure"]
    assert printed["report"]["figures"] == printed["exposure"]
    assert _figures((root / "first.html").read_text()) == printed["exposure"]
    again = runner.invoke(app, ["report", "--db", str(root / "case.duckdb"), "--out", str(tmp_path / "s.html"),
                                "--generated-at", "2026-11-30T12:00:00Z", "--json"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "s.html").read_bytes() == (root / "first.html").read_bytes()
    bad = runner.invoke(app, ["report", "--db", str(root / "case.duckdb"), "--out", str(tmp_path / "t.html"),
                              "--generated-at", "yesterday"])
    assert bad.exit_code == 1 and "ISO 8601" in bad.output


needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None,
                                    reason="needs Debian's chromium (scripts/test.sh installs it)")


@needs_chromium
def test_chromium_opens_it_offline_with_no_request_and_no_console_error(incident: Path, tmp_path: Path) -> None:
    from cdp import load

    bad = tmp_path / "bad.html"  # the harness must see what it is looking for
    bad.write_text('<img src="https://example.invalid/x.png"><script>console.error("boom")</script>')
    seen = load(bad)
    assert seen.requests == ["https://example.invalid/x.png"]
    assert any("boom" in m for m in seen.console)

    out = report(incident, tmp_path / "r.html", generated_at="2026-11-30T12:00:00Z").out
    loaded = load(out)
    assert loaded.requests == []
    assert loaded.console == []
    (tmp_path / "report.png").write_bytes(loaded.screenshot)
    assert loaded.screenshot.startswith(b"\x89PNG") and len(loaded.screenshot) > 50_000


@needs_chromium
def test_it_prints_to_pdf_offline(incident: Path, tmp_path: Path) -> None:
    out = report(incident, tmp_path / "r.html", generated_at="2026-11-30T12:00:00Z").out
    pdf = tmp_path / "r.pdf"
    subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                    f"--print-to-pdf={pdf}", out.as_uri()], check=True, capture_output=True, timeout=120)
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF") and data.count(b"/Type /Page") + data.count(b"/Type/Page") >= 3


def test_long_tables_show_their_first_rows_and_every_row_goes_beside_the_report(
        incident: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The HTML stays small at any case size: the first rows of each long table, and the complete
    lists as CSV and Parquet in REPORT-lists/, each named with its SHA-256, named as the report
    names requests (pseudonyms for a regulator), none for a customer."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    import reports.render

    monkeypatch.setattr(reports.render, "SHOWN", 3)
    with forensics.Case(incident, read_only=True) as case:
        responses = case.connection.execute("SELECT count(DISTINCT reader_request) FROM exposures").fetchone()[0]
        ids = {r for (r,) in case.connection.execute("SELECT DISTINCT reader_request FROM exposures").fetchall()}
    assert responses > 3
    for audience in ("internal", "regulator"):
        got = report(incident, tmp_path / f"{audience}.html", audience=audience, generated_at="2026-11-30T12:00:00Z")
        html = got.out.read_text()
        section = html[html.index("Responses that attended"):html.index("Requests whose content was read")]
        assert section.count("<tr><td>") == 3
        assert f"The first 3 of {responses:,} rows are shown here" in " ".join(section.split())
        folder = tmp_path / f"{audience}-lists"
        csv = pacsv.read_csv(folder / "responses.csv")
        parquet = pq.read_table(folder / "responses.parquet")
        assert csv.num_rows == parquet.num_rows == responses == got.lists["responses"][0]
        for name, digest in got.lists["responses"][1]:
            assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest
            assert f"<td>{name}</td><td><code>{digest}</code></td>" in html
        shown_ids = set(parquet.column("reader_request").to_pylist())
        assert (shown_ids == ids) is (audience == "internal")
        assert not (shown_ids & ids) or audience == "internal"  # a regulator's lists carry no request id
        assert {"victims.csv", "handoffs.parquet"} <= {p.name for p in folder.iterdir()}
    customer = report(incident, tmp_path / "customer.html", audience="customer")
    assert not customer.lists and not (tmp_path / "customer-lists").exists()


def test_a_csv_list_never_hands_a_spreadsheet_a_formula() -> None:
    from reports.lists import _cell

    assert [_cell(v) for v in ("=HYPERLINK(\"x\")", "+1", "-2", "@SUM(A1)", "req-1", "\x1b[31m")] == [
        "'=HYPERLINK(\"x\")", "'+1", "'-2", "'@SUM(A1)", "req-1", "\\x1b[31m"]


def test_charts_of_many_points_stay_small() -> None:
    """A chart of tens of thousands of points draws them as one raster layer inside the SVG: its
    size does not grow with the case; a few points stay vector marks."""
    import datetime as dt

    from reports import charts

    t0 = dt.datetime(2026, 9, 14, tzinfo=dt.UTC)

    def chart(n: int) -> bytes:
        points = [(t0 + dt.timedelta(seconds=i), 1000 + (i * 7919) % 60000, i % 97 == 0) for i in range(n)]
        uri = charts.prompts_against_limit(points, 50_000, 65_536)
        assert uri is not None
        return base64.b64decode(uri.split(",", 1)[1])

    few, many = chart(500), chart(60_000)
    assert b"<image" not in few and b"<image" in many
    assert len(many) < 400_000  # 60,000 points; as vector marks each costs tens of bytes:
    assert len(chart(1_900)) - len(few) > 1_400 * 40


def test_the_prompts_chart_keeps_every_prompt_that_matters_and_samples_the_rest(
        incident: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import reports.data
    from reports.data import Names, gather

    monkeypatch.setattr(reports.data, "PROMPT_POINTS", 50)
    with forensics.Case(incident, read_only=True) as case:
        con = case.connection
        data = gather(con, audience="internal", names=Names("ids"), generated_at="x", toolkit_version="x")
        every = con.execute("SELECT e.ts, e.prompt_tokens, e.request_id IN (SELECT reader_request FROM exposures "
                            "WHERE reader_delivered) FROM request_events e WHERE e.event = 'received' "
                            "AND e.prompt_tokens IS NOT NULL ORDER BY e.ts, e.request_id").fetchall()
    limit = data.prompt_limit
    assert limit is not None
    matters = [p for p in every if p[2] or p[1] > limit]
    rest = [p for p in every if not (p[2] or p[1] > limit)]
    assert matters and len(rest) > 50
    shown = [p for p in data.prompts if not (p[2] or p[1] > limit)]
    assert set(matters) <= set(data.prompts)
    assert data.prompt_every == -(-len(rest) // 50) and shown == rest[::data.prompt_every]


def test_on_request_level_evidence_every_section_and_list_names_the_replays_victims_as_possible(
        investigated: CommandRun, tmp_path: Path) -> None:
    """Without page records the replay names the exposures: the summary's cards, the tenant matrix,
    the response and victim tables and the lists beside the report hold them, each victim marked
    certain or possible with its evidence tier (every certain one a true victim, by the page
    records), never 0 where the replay has the answer; with page records every victim is certain."""
    import pyarrow.parquet as pq

    from kvforensics.job import run

    full = investigated.folder / "logs"  # (its whole job is the module's incident's: "full" below)
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in sorted(full.iterdir()):
        bare.joinpath(f.name).write_text("".join(
            x for x in f.read_text().splitlines(keepends=True) if '"kind":"kv"' not in x))
    truth = investigated.job
    job = run([bare], tmp_path / "bare.duckdb", tmp_path / "bare.html", generated_at="2026-11-30T12:00:00Z")
    assert truth.tiers is not None and job.tiers is not None
    total = job.tiers["total"]
    assert job.investigation.exposure["exposed_responses"] == 0  # the page records name nobody
    assert total["exposed_responses"] == truth.investigation.exposure["exposed_responses"] > 0
    certainty = job.as_dict()["certainty"]["victim_requests"]
    assert certainty["certain"] + certainty["possible"] == total["victim_requests"]
    assert truth.as_dict()["certainty"]["victim_requests"] == {
        "certain": truth.investigation.exposure["victim_requests"], "possible": 0}

    html = (tmp_path / "bare.html").read_text()
    assert _figures(html) == {k: v for k, v in total.items() if v is not None}
    affected = html[html.index('id="affected"'):html.index('id="confirmation"')]
    assert "No exposures of delivered responses" not in affected and 'class="num hot"' in affected
    assert f"Responses that attended to another request's pages ({total['exposed_responses']:,})" in affected
    notification = " ".join(html[html.index('id="notification"'):].split())
    assert f"{total['victim_requests']:,} requests whose content was exposed" in notification
    if certainty["possible"]:
        assert f"{certainty['certain']:,} are certain and {certainty['possible']:,} possible" in notification
    else:
        assert "possible (named by the replay" not in notification

    lists = tmp_path / "bare-lists"
    responses, victims = pq.read_table(lists / "responses.parquet"), pq.read_table(lists / "victims.parquet")
    delivered = [d for d in responses.column("delivered").to_pylist() if d]
    assert len(delivered) == total["exposed_responses"]
    assert victims.num_rows == total["victim_requests"]
    marks = victims.column("certainty").to_pylist()
    assert (marks.count("certain"), marks.count("possible")) == (certainty["certain"], certainty["possible"])
    assert set(victims.column("evidence").to_pylist()) <= {"transfer records + replay", "request records + replay"}
    assert all((why is None) == (mark == "certain")
               for why, mark in zip(victims.column("why_possible").to_pylist(), marks, strict=True))
    with forensics.Case(investigated.folder / "case.duckdb", read_only=True) as case:
        true_victims = set(case.exposures(delivered_only=True)["victim_request"].to_list())
    certain = {v for v, mark in zip(victims.column("victim_request").to_pylist(), marks, strict=True)
               if mark == "certain"}
    assert certain <= true_victims  # (ids: the internal audience names requests as logged)

    full_victims = pq.read_table(investigated.folder / "first-lists" / "victims.parquet")
    assert set(full_victims.column("certainty").to_pylist()) == {"certain"}
    with forensics.Case(tmp_path / "bare.duckdb", read_only=True) as case:
        rows = case.exposures(delivered_only=True)
        assert set(rows["certainty"].to_list()) <= {"certain", "possible"}
        assert case.summary().certainty["victim_requests"] == certainty
