"""The ``kvforensics`` command: a thin skin over the library, one call per command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import polars as pl
import typer

import forensics
from forensics.errors import KvfError

app = typer.Typer(
    name="kvforensics",
    help="Find every LLM response that attended to another request's KV-cache pages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")

DbOption = Annotated[Path, typer.Option("--db", help="The case database (a DuckDB file).")]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
PathsArg = Annotated[
    list[Path], typer.Argument(help="Log files or folders (JSON Lines, CSV, Parquet; .gz, .zst).")
]


class Format(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _run(call: Callable[[], T]) -> T:
    """Run a library call; a toolkit error becomes one line on stderr and exit code 1."""
    try:
        return call()
    except KvfError as exc:
        typer.echo(f"kvforensics: error: {exc}", err=True)
        raise typer.Exit(1) from None


def _with_progress(job: Callable[[Any], T]) -> T:
    """Run ``job(progress)`` with a progress bar when stderr is a terminal."""
    if not sys.stderr.isatty():
        return job(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(), transient=True
    ) as bar:
        tasks: dict[Path, Any] = {}

        def update(path: Path, done: int, total: int) -> None:
            if path not in tasks:
                tasks[path] = bar.add_task(path.name, total=total)
            bar.update(tasks[path], completed=done)

        return job(update)


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _print_counts(result: forensics.IngestResult) -> None:
    for f in result.files:
        c = f.counts
        note = " (already in the case, unchanged)" if f.status == "already_in_case" else ""
        typer.echo(
            f"{f.path}: {c.read} read, {c.ingested} ingested, {c.duplicates} duplicates, "
            f"{c.quarantined} quarantined{note}"
        )
    for path in result.skipped:
        typer.echo(f"{path}: passed over (not a log file)")
    r = result.records
    typer.echo(
        f"total: {r.read} read = {r.ingested} ingested + {r.duplicates} duplicates "
        f"+ {r.quarantined} quarantined"
    )
    if r.quarantined:
        typer.echo(f"see them with: kvforensics quarantine --db {result.db}")


@app.command()
def ingest(paths: PathsArg, db: DbOption, as_json: JsonFlag = False) -> None:
    """Ingest log files into a case: each record ingested, a duplicate, or quarantined."""
    result = _run(lambda: _with_progress(lambda p: forensics.ingest(paths, db, progress=p)))
    if as_json:
        _print_json(result.as_dict())
    else:
        _print_counts(result)


@app.command()
def investigate(paths: PathsArg, db: DbOption, as_json: JsonFlag = False) -> None:
    """Ingest, rebuild page timelines, find exposures, and print the figures."""
    found = _run(lambda: _with_progress(lambda p: forensics.investigate(paths, db, progress=p)))
    if as_json:
        _print_json(found.as_dict())
        return
    _print_counts(found.ingest)
    typer.echo("")
    width = max(len(k) for k in found.exposure)
    for name, value in found.exposure.items():
        typer.echo(f"{name:<{width}}  {value}")
    typer.echo(f"\nnext: kvforensics exposures --db {db}")


def _emit(frame: pl.DataFrame, fmt: Format) -> None:
    if fmt is Format.csv:
        typer.echo(frame.write_csv(), nl=False)
    elif fmt is Format.json:
        _print_json(frame.to_dicts())
    else:
        with pl.Config(tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=60, tbl_width_chars=200):
            typer.echo(str(frame))


@app.command()
def exposures(
    db: DbOption,
    tenant: Annotated[str | None, typer.Option(help="Reader's or victim's tenant.")] = None,
    request: Annotated[str | None, typer.Option(help="Reader request id.")] = None,
    victim: Annotated[str | None, typer.Option(help="Victim request id.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """List exposures: who read whose pages, where, and when."""

    def query() -> pl.DataFrame:
        with forensics.Case(db) as case:
            return case.exposures(tenant=tenant, request=request, victim=victim)

    _emit(_run(query), fmt)


@app.command()
def request(
    request_id: Annotated[str, typer.Argument(help="The request id.")], db: DbOption
) -> None:
    """One request: its lifecycle, its pages, whose content it saw, who saw its content."""

    def query() -> forensics.RequestReport:
        with forensics.Case(db) as case:
            return case.request(request_id)

    report = _run(query)
    for title, frame in (
        ("lifecycle", report.lifecycle),
        ("page records", report.pages),
        ("content of other requests it read", report.saw),
        ("requests that read its content", report.seen_by),
        ("uninitialized pages it read", report.uninitialized),
    ):
        typer.echo(f"\n{title} ({frame.height})")
        if frame.height:
            _emit(frame, Format.table)


@app.command()
def page(
    node: Annotated[str, typer.Argument(help="The node, e.g. decode-0.")],
    page_id: Annotated[int, typer.Argument(metavar="PAGE", help="The page id.")],
    db: DbOption,
    boot: Annotated[int | None, typer.Option(help="Only this boot of the node.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """A page's timeline on a node: holds, writes and reads in (boot, seq) order."""

    def query() -> pl.DataFrame:
        with forensics.Case(db) as case:
            return case.page_timeline(node, page_id, boot=boot)

    _emit(_run(query), fmt)


@app.command()
def quarantine(
    db: DbOption,
    reason: Annotated[str | None, typer.Option(help="Only this reason.")] = None,
    show_content: Annotated[
        bool, typer.Option("--show-content", help="Print the records' text (may hold user data).")
    ] = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Quarantined records: file, line and reason (their text only with --show-content)."""
    frame = _run(lambda: forensics.quarantined(db, reason=reason, with_raw=show_content))
    _emit(frame, fmt)


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="A read-only SQL query over the case's tables.")],
    db: DbOption,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Run a read-only SQL query over the case (tables in docs/tables.md)."""
    from forensics.case import run_read_only

    _emit(_run(lambda: run_read_only(db, query)), fmt)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
