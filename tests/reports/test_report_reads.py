"""The report reads true to each reader: its sentences agree with the tables beside them, every
figure has a plain label, nothing prints as ``None`` or as a raw ISO time, and printed it clips no
table and leaves no heading at the foot of a page.

Cases: the shipped sample (page records), a simulated incident without page records (request-level
evidence: the replay names the victims), and the logs SGLang 0.5.5, 0.5.11, 0.5.19, 0.5.20 and 0.5.23 printed
(tests/adapters/releases: one release of each era), each rendered for every audience.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

from kvforensics.job import run
from replay.simulate import Deployment, simulate_to
from reports.data import AUDIENCES, FIGURE_WORDS
from reports.render import report

RELEASES = Path(__file__).resolve().parents[1] / "adapters" / "releases"
SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs" / "glm53-incident"
SMALL = Deployment(context_length=65_536, prefill_pool_tokens=40_960, decode_pool_tokens=262_144,
                   page_size=64, prefill_nodes=2, decode_nodes=2)
STAMP = "2026-11-30T12:00:00Z"


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case investigated and replayed by the whole job (as `investigate --out` does)."""
    root = tmp_path_factory.mktemp("reads")
    simulate_to(root / "pages", deployment=SMALL, requests=200, seed=5, over_long=0.06, rate=3.0)
    (root / "requests").mkdir()
    for f in sorted((root / "pages").iterdir()):
        (root / "requests" / f.name).write_text("".join(
            x for x in f.read_text().splitlines(keepends=True) if '"kind":"kv"' not in x))
    inputs = {"the sample": SAMPLE, "request records": root / "requests"}
    # one release of each era of what a length-rejected prompt does and how the logs read: its stub
    # sent (to 0.5.19; old and new time stats, repr and dict server_args), aborted after its forward
    # (0.5.20: decode never starts), retired at intake (0.5.21 on, with the pool warning from 0.5.23)
    inputs |= {f"SGLang {v}": RELEASES / v / "text" for v in ("0.5.5", "0.5.11", "0.5.19", "0.5.20", "0.5.23")}
    out = {}
    for name, logs in inputs.items():
        db = root / f"{name.replace(' ', '-')}.duckdb"
        run([logs], db, None, generated_at=STAMP)
        out[name] = db
    return out


class _Page(HTMLParser):
    """A report's visible text, its headings and its tables (rows of cell texts)."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.headings: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._stack: list[str] = []
        self._heading: list[str] | None = None
        self._cell: list[str] | None = None
        self._open: list[list[list[str]]] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("style", "pre", "summary"):
            self._skip += 1
        if tag in ("h2", "h3"):
            self._heading = []
        if tag == "table":
            self._open.append([])
        if tag == "tr" and self._open:
            self._open[-1].append([])
        if tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "pre", "summary"):
            self._skip -= 1
        if tag in ("h2", "h3") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None
        if tag in ("td", "th") and self._cell is not None and self._open and self._open[-1]:
            self._open[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        if tag == "table" and self._open:
            self.tables.append(self._open.pop())

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        if self._heading is not None:
            self._heading.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def sentence(self, start: str) -> str:
        """The text from ``start`` to the end of its paragraph's sentence."""
        words = " ".join("".join(self.text).split())
        at = words.index(start)
        return words[at:words.index(".", at + len(start)) + 1]

    def table_after(self, header: str) -> list[list[str]]:
        """The rows (header row first) of the table whose first header cell is ``header``."""
        return next(t for t in self.tables if t and t[0] and t[0][0] == header)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("audience", AUDIENCES)
def test_every_sentence_agrees_with_the_table_beside_it(cases: dict[str, Path], audience: str,
                                                         tmp_path: Path) -> None:
    for name, db in cases.items():
        html = report(db, tmp_path / f"{name.replace(' ', '-')}-{audience}.html", audience=audience,
                      generated_at=STAMP).out.read_text()
        page = _Page()
        page.feed(html)
        visible = " ".join("".join(page.text).split())
        assert not re.search(r"\bNone\b", visible), name
        assert not re.search(r"\d\d:\d\d:\d\d(\.\d+)?\+00:00|\d{4}-\d\d-\d\dT\d\d:", visible), name
        # every figure card: the value shown, under its plain label (never a column name)
        cards = {k: (v, unescape(label)) for k, v, label in
                 re.findall(r'<div class="fig" data-figure="(\w+)"><b>([^<]*)</b><span>([^<]*)</span>', html)}
        assert set(cards) == set(FIGURE_WORDS), name
        for figure, (_, label) in cards.items():
            assert label == FIGURE_WORDS[figure][0] and figure not in label, (name, figure)
        card = {k: (None if v == "not measured" else _number(v)) for k, (v, _) in cards.items()}
        exposed = card["exposed_responses"] or 0
        # replayed or not: the summary says what the replays table shows
        confirmed = any(row[-1].startswith("confirmed") for t in page.tables
                        if t and t[0] and t[0][0] == "engine" for row in t[1:])
        assert ("were not replayed" in visible) is (not confirmed and "no page records:" in visible), name
        status = page.sentence("Status:")
        assert ("replay" in status and "not replayed" not in status) is confirmed, (name, status)
        # page records are said to show something only where some node logged them
        with duckdb.connect(str(db), read_only=True) as con:
            logged_pages = con.execute("SELECT count(*) FROM kv_records").fetchall()[0][0] > 0
        assert "The page records show" not in visible or logged_pages, name
        # the headings' counts are the cards' figures
        if audience != "customer":
            readers = next(h for h in page.headings if h.startswith("Responses that attended"))
            victims = next(h for h in page.headings if h.startswith("Requests whose content was read"))
            assert _number(readers.rsplit("(", 1)[1][:-1]) == exposed + (card["contained_requests"] or 0), name
            assert _number(victims.rsplit("(", 1)[1][:-1]) == (card["victim_requests"] or 0), name
            # what happened: as many prompts, and decode starts, as the handoff table lists
            handoffs = next(h for h in page.headings if h.startswith("Rejected on prefill, handed off anyway"))
            n = _number(handoffs.rsplit("(", 1)[1][:-1])
            happened = page.sentence("What happened:")
            if n:
                table = page.table_after("request")
                started = sum(row[table[0].index("decode started")] == "yes" for row in table[1:])
                assert len(table) - 1 == n and happened.startswith(f"What happened: {n:,} prompt"), (name, happened)
                if started == n:
                    assert "decode started and read" in happened, (name, happened)
                elif started:
                    assert f"on {started:,} of them decode started" in happened, (name, happened)
                else:
                    assert "none of them did decode start" in happened and "read" not in happened, (name, happened)
            # DP pools named as what they are
            pools = {row[0] for row in page.table_after("node")[1:] if re.search(r"\.dp\d+$", row[0])}
            for pool in pools:
                server, rank = pool.rsplit(".dp", 1)
                assert f"of the server {server}" in visible and pool in visible, name
        # the tenants matrix counts the pairs the cards count
        matrix = next((t for t in page.tables if t and t[0] and t[0][0] == "reader \\ victim"), None)
        pairs = sum(_number(c) for row in (matrix or [])[1:] for c in row[1:])
        assert pairs == (card["exposure_pairs"] or 0), name
        # the notification's numbers are the cards'
        nature = page.sentence("Confidentiality breach")
        assert f"; {exposed:,} responses were generated" in nature, name
        detection = page.sentence("Detection:")
        assert (f"{exposed:,} delivered responses" in detection) is bool(exposed), (name, detection)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (scripts/test.sh installs it)")
def test_printed_no_table_is_clipped_and_no_heading_ends_a_page(cases: dict[str, Path], tmp_path: Path) -> None:
    """Chromium's print to PDF, each page turned into an image (pypdfium2): nothing is drawn in the
    page's right margin (a table wider than the page runs into it and is cut at the edge), and no
    page ends with a heading: where a page's last line of text is a heading, something (a chart, a
    table) is drawn below it on that page."""
    pdfium = pytest.importorskip("pypdfium2")
    for name in ("SGLang 0.5.19", "request records"):
        out = report(cases[name], tmp_path / f"{name.replace(' ', '-')}.html", generated_at=STAMP).out
        page = _Page()
        page.feed(out.read_text())
        pdf = tmp_path / f"{name.replace(' ', '-')}.pdf"
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-pdf-header-footer",
                        f"--print-to-pdf={pdf}", out.as_uri()], check=True, capture_output=True, timeout=120)
        doc = pdfium.PdfDocument(str(pdf))
        assert len(doc) >= 2
        for i in range(len(doc)):
            image = doc[i].render(scale=1).to_pil().convert("L")
            width, height = image.size
            margin = image.crop((width - 18, 0, width, height))  # (Chromium's margin is about 28 points)
            assert margin.getextrema()[0] >= 250, f"{name}: page {i + 1} has content in its right margin"
            text = doc[i].get_textpage()
            lines = [x.strip() for x in text.get_text_range().splitlines() if x.strip()]
            if i < len(doc) - 1 and lines and lines[-1] in page.headings:
                bottom = text.get_charbox(text.count_chars() - 1)[1]  # (PDF points from the page's foot)
                below = image.crop((0, int(height - bottom) + 4, width, height - 36))
                assert below.getextrema()[0] < 200, f"{name}: page {i + 1} ends with the heading {lines[-1]!r}"
