"""``kvforensics report``: one self-contained HTML file from an analysed case.

Jinja2 renders it with autoescaping on, so every string that came from the logs is escaped;
charts are SVG images in ``data:`` URIs (an image cannot run scripts); the page carries a
Content-Security-Policy that allows nothing but those images and its own stylesheet (by
hash). No prompt or response text is ever read. Same case and options, same bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import jinja2
import markupsafe

import forensics
from forensics.errors import BadOption
from forensics.outputs import check_target, write_atomically
from forensics.store import HeldCase, restored
from forensics.text import printable
from reports import charts, lists
from reports.data import AUDIENCES, FIGURE_WORDS, Names, ReportData, gather
from reports.lists import SHOWN

#: DuckDB's memory limit while the report reads the case (past it, its queries spill to disk):
#: without it they held 3.9 GiB on a case of 5.12 million records, with it 1.3 GiB in the same time.
REPORT_MEMORY = "1GiB"


@dataclass(frozen=True)
class ReportResult:
    """A report written: where, for whom, its size and the figures it shows."""

    out: Path
    audience: str
    bytes: int
    figures: dict[str, int]
    #: the complete lists written beside it: name -> (rows, [(file, SHA-256)]) (reports.lists)
    lists: dict[str, tuple[int, list[tuple[str, str]]]] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return {"out": str(self.out), "audience": self.audience, "bytes": self.bytes, "figures": self.figures,
                "lists": {name: {"rows": n, "files": [{"file": f, "sha256": h} for f, h in files]}
                          for name, (n, files) in self.lists.items()}}


def _generated_at(text: str | None) -> str:
    if text is None:
        return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BadOption(f"--generated-at: not an ISO 8601 time: {text!r}") from exc
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _neutralised(value: Any) -> Any:
    """Every value the template prints, before it is escaped: text (from the logs) with its
    controls and direction marks shown as escapes, so that a U+202E in a node name cannot turn the
    text around it; markup the toolkit made itself (its charts) is left as it is."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return printable(value)
    return value


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(
            lambda name: resources.files("reports").joinpath("templates", name).read_text(encoding="utf-8")
        ),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        finalize=_neutralised,
    )
    env.filters["n"] = lambda v: "" if v is None else f"{v:,}" if isinstance(v, int) else v
    return env


def render(data: ReportData) -> str:
    """The report's HTML for ``data``."""
    env = _environment()
    css = resources.files("reports").joinpath("templates", "report.css.j2").read_text(encoding="utf-8")
    css_hash = base64.b64encode(hashlib.sha256(css.encode()).digest()).decode()
    context_lengths = sorted({c["context_length"] for c in data.configs if c["role"] == "prefill"})
    return env.get_template("report.html.j2").render(
        d=data,
        css=css,
        csp=f"default-src 'none'; img-src data:; style-src 'sha256-{css_hash}'; base-uri 'none'; form-action 'none'",
        chart_time=charts.exposures_over_time(data.over_time),
        chart_prompts=charts.prompts_against_limit(
            data.prompts, data.prompt_limit, context_lengths[0] if context_lengths else None, data.prompt_every),
        shown=SHOWN,
        words=FIGURE_WORDS,
    )


def report(
    db: Path | str | HeldCase,
    out: Path | str,
    *,
    audience: str = "internal",
    pseudonymize_key: str | None = None,
    generated_at: str | None = None,
) -> ReportResult:
    """Write the incident report of the case ``db`` to ``out``.

    ``internal`` shows request and tenant ids as logged (keyed pseudonyms with a key);
    ``regulator`` and ``customer`` never show them: keyed pseudonyms with a key, else ordinals.
    ``db``: the case's path, or the case a long job holds open (:func:`report_on`).
    """
    if isinstance(db, HeldCase):
        return report_on(db.connection, out, audience=audience, pseudonymize_key=pseudonymize_key,
                         generated_at=generated_at)
    asked = _asked(Path(out), audience, pseudonymize_key, generated_at)  # (before the case is opened)
    with forensics.Case(db, read_only=True) as case:
        return _written(case, asked)


def report_on(
    con: duckdb.DuckDBPyConnection,
    out: Path | str,
    *,
    audience: str = "internal",
    pseudonymize_key: str | None = None,
    generated_at: str | None = None,
) -> ReportResult:
    """Write the incident report of the case open on ``con`` to ``out`` (the options as for :func:`report`)."""
    asked = _asked(Path(out), audience, pseudonymize_key, generated_at)
    return _written(forensics.Case.on(con, read_only=True), asked)


@dataclass(frozen=True)
class _Asked:
    """A report asked for, its options checked: where it goes, for whom, its names and its time."""

    out: Path
    audience: str
    names: Names
    stamp: str


def _asked(out: Path, audience: str, pseudonymize_key: str | None, generated_at: str | None) -> _Asked:
    """The report's options, refused before any work where they are wrong or ``out`` cannot be
    written (a report is not made to be refused)."""
    if audience not in AUDIENCES:
        raise BadOption(f"--audience must be one of {', '.join(AUDIENCES)}, not {audience!r}")
    if pseudonymize_key is not None and not pseudonymize_key:
        raise BadOption("--pseudonymize-key must not be empty")
    if pseudonymize_key:
        names = Names("keyed", pseudonymize_key)
    else:
        names = Names("ids" if audience == "internal" else "ordinal")
    stamp = _generated_at(generated_at)
    check_outputs(out, audience)
    return _Asked(out, audience, names, stamp)


def _written(case: forensics.Case, asked: _Asked) -> ReportResult:
    """The report ``asked`` of ``case``, written with its lists."""
    con = case.connection
    with restored(con, "memory_limit"):
        con.execute(f"SET memory_limit = '{REPORT_MEMORY}'")
        data = gather(con, audience=asked.audience, names=asked.names, generated_at=asked.stamp,
                      toolkit_version=forensics.__version__)
    if asked.audience != "customer":  # (the customer report lists no requests)
        data.lists = lists.write(asked.out, {"responses": data.responses, "victims": data.victims,
                                             "handoffs": data.handoffs, "not_known": data.not_known})
    html = render(data).encode("utf-8")
    write_atomically(asked.out, html)
    return ReportResult(asked.out, asked.audience, len(html), data.figures, data.lists)


def check_outputs(out: Path, audience: str) -> None:
    """Refuse the report's file, or its lists' folder, before any work where either cannot be written."""
    check_target(out)
    if audience != "customer":
        lists.check_folder(out)
