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
from conftest import FIXTURES, write_jsonl
from typer.testing import CliRunner

import forensics
from kvforensics.cli import app
from replay.simulate import Deployment, simulate_to
from reports.render import report

SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2)
HOSTILE_TENANT = "<script>alert('t')</script></style>"
HOSTILE_REQUEST = '"><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def incident(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A simulated incident with exposures, investigated and replayed, as a case file."""
    root = tmp_path_factory.mktemp("incident")
    simulate_to(root / "logs", deployment=SMALL, requests=400, seed=1, over_long=0.05, rate=3.0)
    from kvforensics.job import run

    run([root / "logs"], root / "case.duckdb", root / "first.html", generated_at="2026-11-30T12:00:00Z")
    return root / "case.duckdb"


def _figures(html: str) -> dict[str, int]:
    return {name: int(value.replace(",", "")) for value, name in
            re.findall(r'<div class="fig"><b>([\d,]+)</b><span>(\w+)</span></div>', html)}


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


def test_investigate_with_out_runs_the_whole_job_from_the_cli(tmp_path: Path) -> None:
    simulate_to(tmp_path / "logs", deployment=SMALL, requests=150, seed=2, over_long=0.1, rate=3.0)
    runner = CliRunner()
    result = runner.invoke(app, ["investigate", str(tmp_path / "logs"), "--db", str(tmp_path / "c.duckdb"),
                                 "--out", str(tmp_path / "r.html"), "--generated-at", "2026-11-30T12:00:00Z",
                                 "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert [r["engine"] for r in printed["replays"]] == ["sglang-placeholder", "sglang-hardened"]
    assert printed["replays"][0]["exposure"] == printed["exposure"]
    assert printed["report"]["figures"] == printed["exposure"]
    assert _figures((tmp_path / "r.html").read_text()) == printed["exposure"]
    again = runner.invoke(app, ["report", "--db", str(tmp_path / "c.duckdb"), "--out", str(tmp_path / "s.html"),
                                "--generated-at", "2026-11-30T12:00:00Z", "--json"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "s.html").read_bytes() == (tmp_path / "r.html").read_bytes()
    bad = runner.invoke(app, ["report", "--db", str(tmp_path / "c.duckdb"), "--out", str(tmp_path / "t.html"),
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
