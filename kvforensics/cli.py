"""The ``kvforensics`` command: a thin skin over the library, one call per command."""

# ruff: noqa: E402  (the stops are armed before the slow imports: a stop while they load is said too)
from __future__ import annotations

import os
import signal
import sys
import threading


class Stopped(KeyboardInterrupt):
    """A stop signal (SIGINT, SIGTERM) ending the command: raised where it arrived, said at the top."""


class _Stop:
    """The stop signal the process got, if any, and what it interrupted."""

    signum: int | None = None
    step = "the start-up"
    leaves = "nothing was written"
    started = False  # a command runs (before, while the modules load, there is nothing to clean up)
    said = False


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

#: What a stop interrupted, by the module it arrived in (the outermost that names a step: a replay
#: ingests its own logs), and what that leaves; a module takes the first prefix it has.
STOP_STEPS = (
    ("forensics.ingestion", "the ingest", "the case is consistent: each file ingested before it is in, whole"),
    ("forensics.exposure", "the analysis", "the case is consistent: its records are in, its analysis the last "
                                            "one finished"),
    ("forensics.spark", "the Spark job", "the Parquet case is the last one finished, whole"),
    ("replay.simulate", "the simulation", "no log set was written"),
    ("replay", "the replay", "the case is consistent: as it was before the replay"),
    ("reports", "the report", "the case is consistent and no report was written"),
)


def _on_stop(signum: int, frame: FrameType | None) -> None:
    """Raise :class:`Stopped` where a stop signal arrived, for the first one only (a second lets
    the first one's cleanup finish). Not inside numba's or llvmlite's code: compiled code calls
    back into it (numba's constants unpickled, llvmlite's object cache), and an exception raised
    there crashes the process (a segmentation fault); the signal is sent again a moment later,
    until it finds the process back in code of its own."""
    if _Stop.signum is not None:
        return
    modules = []  # of the frames running code (a module being imported is no step of its own)
    while frame is not None:
        if frame.f_code.co_name != "<module>":
            modules.append(str(frame.f_globals.get("__name__", "")))
        frame = frame.f_back
    if any(m.startswith(("numba.", "llvmlite.")) for m in modules):
        again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()
        return
    _Stop.signum = signum
    steps = [step for m in modules if (step := _step_of(m)) is not None]
    if steps:
        _Stop.step, _Stop.leaves = steps[-1]
    elif _Stop.started:
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "the command")
        _Stop.step, _Stop.leaves = f"'{command}'", "the case is consistent"
    if not _Stop.started:  # the modules loading: nothing is open or written, so the process ends here,
        # without unwinding through an extension's initialisation (DuckDB's aborts, SIGABRT, when an
        # exception passes through it)
        _say_stopped()
        os._exit(128 + signum)
    raise Stopped()


def _step_of(module: str) -> tuple[str, str] | None:
    """The step code of ``module`` runs in, and what a stop in it leaves (:data:`STOP_STEPS`)."""
    return next(((step, leaves) for prefix, step, leaves in STOP_STEPS
                 if module == prefix or module.startswith(prefix + ".")), None)


def _say_stopped() -> int:
    """Say, once, what the stop interrupted and that a re-run finishes it; the exit code (128 + signal)."""
    assert _Stop.signum is not None
    if not _Stop.said:
        _Stop.said = True
        name = signal.Signals(_Stop.signum).name
        print(f"kvforensics: stopped by {name} during {_Stop.step}; {_Stop.leaves}; run the same command again "
              "to finish", file=sys.stderr, flush=True)
    return 128 + _Stop.signum


def _arm(handlers: list[Any]) -> list[Any]:
    """Handle the stop signals with ``handlers``, one each; the handlers they had. (Only the main
    thread may: imported in another, the command's stops are left as they are.)"""
    if threading.current_thread() is not threading.main_thread():
        return handlers
    return [signal.signal(s, signal.SIG_DFL if h is None else h) for s, h in zip(STOP_SIGNALS, handlers, strict=True)]


_BEFORE = _arm([_on_stop] * len(STOP_SIGNALS))  # (given back once the modules are in: main() arms its own)

import importlib
import importlib.util
import io
import json
import logging
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import duckdb
import polars as pl
import typer
from typer.core import TyperGroup

import forensics
from forensics.adapters import ADAPTERS, Options, read_tenant_map
from forensics.errors import BadOption, BadValue, KvfError, OutputExists
from forensics.ingestion.readers import KEPT_OF_LONG_LINE, Limits
from forensics.investigation import Phase
from forensics.schema import PLAUSIBLE_COUNT
from forensics.store import system_refusal
from forensics.text import csv_cell, shown
from kvforensics import render
from replay.engine import BEHAVIOURS
from replay.simulate import Deployment

if TYPE_CHECKING:  # (click's, whether or not it is installed beside typer)
    from click.exceptions import NoArgsIsHelpError, UsageError
else:  # click as typer runs it: newer typers carry a copy of their own, older ones use click
    _CLICK = importlib.import_module("typer._click.exceptions" if importlib.util.find_spec("typer._click")
                                     else "click.exceptions")
    NoArgsIsHelpError, UsageError = _CLICK.NoArgsIsHelpError, _CLICK.UsageError

_arm(_BEFORE)

#: Exit codes, documented in the README: every failure is one line on stderr and one of these.
EXIT_ERROR = 1  # the toolkit refused: a bad path, option, case or query (the message says which)
EXIT_USAGE = 2  # the command line itself is wrong (unknown option, missing argument, a value out of range)
EXIT_OS = 3  # the system refused a read or a write (permissions, a full disk, a vanished file)
EXIT_DATABASE = 4  # DuckDB failed outside the toolkit's checks
EXIT_INTERNAL = 5  # a bug in kvforensics: --debug shows the traceback to report
EXIT_REFUSED_FILES = 6  # the command finished, but some input files could not be read (listed, why)
EXIT_DISAGREES = 7  # a confirming replay finished, but the model could not follow the logs everywhere (listed)
EXIT_NO_RECORDS = 8  # the input held no record at all: nothing to analyse (the files named are listed)
EXIT_PIPE = 141  # the output was closed before it was all written (| head): nothing is said
# a stop signal ends a command with 128 + its number (130 SIGINT, 143 SIGTERM), said in one line (_say_stopped)
EXIT_CODES = {EXIT_ERROR: "error", EXIT_USAGE: "usage", EXIT_OS: "system error", EXIT_DATABASE: "database error",
              EXIT_INTERNAL: "internal error"}


def failure(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one line a failure is reported with."""
    if not isinstance(exc, KvfError | OSError) and (refused := system_refusal(exc)) is not None:
        exc = refused  # DuckDB quoting the system's refusal (a full disk): the system's error it is
    if isinstance(exc, KvfError):
        code, text = EXIT_USAGE if isinstance(exc, BadValue) else EXIT_ERROR, str(exc)
    elif isinstance(exc, RecursionError | MemoryError):
        code, text = EXIT_ERROR, (f"the input is nested or sized beyond what can be held ({type(exc).__name__}); "
                                  "--debug shows where")
    elif isinstance(exc, OSError):
        where = f"{shown(exc.filename)}: " if exc.filename is not None else ""
        code, text = EXIT_OS, f"{where}{exc.strerror or exc}"
    elif isinstance(exc, duckdb.Error):
        code, text = EXIT_DATABASE, f"{type(exc).__name__}: {str(exc).strip()}"
    else:
        code, text = EXIT_INTERNAL, f"{type(exc).__name__}: {exc} (a bug: run again with --debug for the traceback)"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return code, f"kvforensics: {EXIT_CODES[code]}: {shown(first)}"


def usage_line(exc: UsageError) -> str:
    """The one line a wrong command line is reported with (click's own takes four, in a box)."""
    where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return f"kvforensics: {EXIT_CODES[EXIT_USAGE]}: {shown(' '.join(exc.format_message().split()))}{where}"


class _Commands(TyperGroup):
    """The command group: a failure inside any command becomes one line and an exit code; a stop
    signal, one line saying what it interrupted."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().make_context(*args, **kwargs)
        except UsageError as exc:  # (kvforensics --no-such-option)
            _usage_exit(exc)

    def invoke(self, ctx: typer.Context) -> Any:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            _usage_exit(exc)
        except (typer.Exit, typer.Abort, typer.TyperException):  # the command line's own: exits as typer says
            raise
        except BrokenPipeError:  # the reader went away (| head): stop quietly, as the shell's tools do
            _quiet_stdout()
            raise typer.Exit(EXIT_PIPE) from None
        except BaseException as exc:
            if _Stop.signum is not None:  # whatever it surfaced as (DuckDB: "Query interrupted")
                raise typer.Exit(_say_stopped()) from None
            if not isinstance(exc, Exception) or ctx.obj is _DEBUG:
                raise
            code, line = failure(exc)
            typer.echo(line, err=True)
            raise typer.Exit(code) from None


def _usage_exit(exc: UsageError) -> NoReturn:
    """Report a wrong command line in one line and exit; no arguments at all still show the help."""
    if isinstance(exc, NoArgsIsHelpError):
        raise exc
    typer.echo(usage_line(exc), err=True)
    raise typer.Exit(EXIT_USAGE) from None


_DEBUG = object()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that what is still buffered for a closed pipe fails no more."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # not a real file (a test's capture): nothing to quiet

app = typer.Typer(
    name="kvforensics",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Commands,
    # (a help text's paragraphs wrapped to the terminal: rich's own mode kept the docstrings' line breaks
    # and wrapped them again, three words a line at 80 columns; the texts use no Markdown)
    rich_markup_mode="markdown",
)


@app.callback()
def _options(
    ctx: typer.Context,
    debug: Annotated[bool, typer.Option(
        "--debug", help="Show the traceback of a failure instead of one line (or set KVFORENSICS_DEBUG=1).")] = False,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", min=1, max=1024, help="Processes a replay spreads a case's nodes over (or set KVFORENSICS_JOBS; "
        "default: one a core). The replayed set is the same, byte for byte, whatever it is.")] = None,
) -> None:
    """Find every LLM response that attended to another request's KV-cache pages.

    Exit codes: 0 done; 1 the toolkit refused (bad path, option, case or query); 2 usage (the
    command line is wrong: an unknown option, a value out of range); 3 the system refused a read or
    write (a full disk, a permission); 4 DuckDB failed; 5 a bug (--debug shows its traceback); 6
    some input files could not be read (listed, the rest in the case); 7 a confirming replay
    disagrees with the logs (listed); 8 no records found in the input; 130, 143 stopped by SIGINT,
    SIGTERM (said, the case consistent: a re-run finishes it); 141 the output was closed early (| head).
    """
    if debug or os.environ.get("KVFORENSICS_DEBUG"):
        ctx.obj = _DEBUG
    if jobs is not None:
        os.environ[JOBS_VARIABLE] = str(jobs)  # (every replay of the command, the job's several among them)


T = TypeVar("T")

#: replay.nodes.JOBS_VARIABLE (not imported: the command line starts without the engine).
JOBS_VARIABLE = "KVFORENSICS_JOBS"

#: The largest count or size an option takes: the schema's bound on any count in a log (past it
#: nothing can be real). Out of range, an option is a usage error.
MOST = PLAUSIBLE_COUNT
#: The largest row number or id DuckDB holds (BIGINT).
MOST_ID = 2**63 - 1


def _case_path(value: Path | None) -> Path | None:
    """A case path DuckDB can open: its name all UTF-8 (DuckDB fails on other bytes)."""
    try:
        str(value).encode("utf-8")
    except UnicodeEncodeError:
        raise typer.BadParameter(f"{shown(value)}: a name with bytes that are not UTF-8, which DuckDB cannot "
                                 "open; name the case another way") from None
    return value


def _positive(value: float) -> float:
    """A float option that must be more than 0 (an option's min admits its bound)."""
    if value <= 0:
        raise typer.BadParameter(f"must be more than 0, not {value}")
    return value


DbOption = Annotated[Path, typer.Option("--db", help="The case database (a DuckDB file).", callback=_case_path)]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]
PathsArg = Annotated[
    list[Path], typer.Argument(help="Log files or folders (JSON Lines, CSV, Parquet; .gz, .zst).")
]


class Format(StrEnum):
    """How a command prints a table."""

    table = "table"
    csv = "csv"
    json = "json"


class Sections(StrEnum):
    """How a command prints several tables (no CSV holds more than one)."""

    table = "table"
    json = "json"


def _with_progress(job: Callable[[Any, Phase], T]) -> T:
    """Run ``job(progress, phase)`` telling on stderr what it does. In a terminal: rich's progress,
    the files read of how many and the file being read, its bytes read of how many, and a spinner
    for each phase of the job while it runs, then its time. Elsewhere (piped, logged): a line per
    phase with its time."""
    import time
    from contextlib import contextmanager

    if not sys.stderr.isatty():
        @contextmanager
        def lines(name: str) -> Iterator[None]:
            start = time.monotonic()
            yield
            typer.echo(f"{name}: {time.monotonic() - start:,.1f} s", err=True)

        return job(None, lines)
    from rich.filesize import decimal
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[amount]}"),
        transient=True,
    ) as bar:

        class Shown:  # (a forensics.ingestion.FilesProgress)
            def __init__(self) -> None:
                self.files_task: Any = None
                self.file_task: Any = None
                self.path: Path | None = None

            def __call__(self, path: Path, done: int, total: int) -> None:
                if self.file_task is None:
                    self.file_task = bar.add_task("", total=None, amount="")
                if path != self.path:
                    self.path = path
                    bar.update(self.file_task, description=path.name, total=max(total, 1))
                bar.update(self.file_task, completed=done, amount=f"{decimal(done)}/{decimal(total)}")

            def files(self, done: int, total: int) -> None:
                if self.files_task is None:
                    self.files_task = bar.add_task("files", total=None, amount="")
                bar.update(self.files_task, total=max(total, 1), completed=done, amount=f"{done:,}/{total:,}")

        shown = Shown()

        @contextmanager
        def spinner(name: str) -> Iterator[None]:
            task = bar.add_task(name, total=None, amount="")
            start = time.monotonic()
            try:
                yield
            finally:
                bar.remove_task(task)
            for t in (shown.files_task, shown.file_task):  # (the ingest's bars are done with it)
                if t is not None:
                    bar.remove_task(t)
            shown.files_task = shown.file_task = None
            bar.console.print(f"[dim]{name}: {time.monotonic() - start:,.1f} s[/dim]")

        return job(shown, spinner)


def _told(name: str, work: Callable[[], T]) -> T:
    """``work()``, a phase of a command told on stderr as investigate tells its own (:func:`_with_progress`)."""

    def run(_: Any, told: Phase) -> T:
        with told(name):
            return work()

    return _with_progress(run)


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _print_figures(figures: dict[str, int]) -> None:
    """The eight figures as a table, grouped by thousands."""
    frame = pl.DataFrame({"figure": list(figures), "value": pl.Series(list(figures.values()), dtype=pl.Int64)})
    typer.echo("\n".join(render.table(frame, render.width())))


def _print_counts(result: forensics.IngestResult) -> None:
    for f in result.files:
        c = f.counts
        if f.status == "refused":
            typer.echo(f"{shown(f.path)}: refused, nothing of it ingested: {shown(f.why)}")
            continue
        note = " (already in the case, unchanged)" if f.status == "already_in_case" else ""
        typer.echo(
            f"{shown(f.path)}: {c.read:,} read, {c.ingested:,} ingested, {c.duplicates:,} duplicates, "
            f"{c.quarantined:,} quarantined{note}"
        )
        if f.adapter != "canonical":
            typer.echo(f"  read as {f.adapter}; {f.ignored:,} other lines ignored")
        for text in f.notes:
            typer.echo(f"  note: {shown(text)}")
    for passed in result.skipped:
        typer.echo(f"{shown(passed.path)}: passed over ({shown(passed.why)})")
    r = result.records
    n = len(result.refused)
    refused = f"; {n} file{'s' if n != 1 else ''} refused" if n else ""
    typer.echo(
        f"total: {r.read:,} read = {r.ingested:,} ingested + {r.duplicates:,} duplicates "
        f"+ {r.quarantined:,} quarantined{refused}"
    )
    if r.quarantined:
        typer.echo(f"see them with: kvforensics quarantine --db {shown(result.db)}")


def _input_exit(result: forensics.IngestResult, paths: list[Path]) -> None:
    """Exit with :data:`EXIT_REFUSED_FILES`, saying so on stderr, where files could not be read; else
    with :data:`EXIT_NO_RECORDS` where the input held no record at all (an answer, not eight zeros)."""
    if result.refused:
        rest = "no other held a record" if result.empty else "the rest are in the case"
        typer.echo(f"kvforensics: {len(result.refused)} of the files could not be read (listed above with why); "
                   f"{rest}", err=True)
        raise typer.Exit(EXIT_REFUSED_FILES)
    if result.empty:
        n = len(result.files)
        held = f"{n} log file{'s' if n != 1 else ''}, none with a record" if n else "no log file"
        typer.echo(f"kvforensics: no records found in {', '.join(shown(p) for p in paths)} ({held}); "
                   "nothing to analyse", err=True)
        raise typer.Exit(EXIT_NO_RECORDS)


FormatOption = Annotated[str | None, typer.Option(
    "--format", help="Read every file with this adapter instead of recognising each: "
    f"{', '.join(ADAPTERS)}.", rich_help_panel="Engine logs")]
NodeOption = Annotated[str | None, typer.Option(
    "--node", help="Engine logs: the node the files are from (default: each file's name).",
    rich_help_panel="Engine logs")]
RoleOption = Annotated[str | None, typer.Option(
    "--role", help="Engine logs: prefill, decode or unified (default: what the file says).",
    rich_help_panel="Engine logs")]
TenantMapOption = Annotated[Path | None, typer.Option(
    "--tenant-map", help="Engine logs: CSV request_id,tenant_id (or a JSON object) naming each request's tenant.",
    rich_help_panel="Engine logs")]
TenantFromOption = Annotated[str | None, typer.Option(
    "--tenant-from", help="Engine logs: the logged request's field holding the tenant, dotted "
    "(custom_labels.tenant).", rich_help_panel="Engine logs")]
RequestIdsOption = Annotated[str, typer.Option(
    "--request-ids", help="Engine logs: how a request's two servers are tied: auto (room for a file whose every "
    "request id its server assigned, else rid), rid (the id both log, the client's or router's) or room (SGLang's "
    "bootstrap room, where each server assigned its own rid).",
    rich_help_panel="Engine logs")]
YearOption = Annotated[int | None, typer.Option(
    "--year", min=1, max=9999, help="Engine logs: the year of log times written without one (SGLang's %m-%d).",
    rich_help_panel="Engine logs")]


MaxLineOption = Annotated[int, typer.Option(
    "--max-line-bytes", min=KEPT_OF_LONG_LINE, max=MOST, help="The longest line read; a longer one is quarantined "
    "(unreadable) with its start kept, never held whole.", rich_help_panel="Bounds")]
MaxExpansionOption = Annotated[int, typer.Option(
    "--max-expansion", min=1, max=MOST, help="How many times its size a compressed file may decompress to; past "
    "it the file is refused as a decompression bomb.", rich_help_panel="Bounds")]


def _adapter_options(node: str | None, role: str | None, tenant_map: Path | None, tenant_from: str | None,
                     year: int | None, request_ids: str = "auto") -> Options:
    tenants = read_tenant_map(tenant_map) if tenant_map is not None else None
    return Options(node=node, role=role, tenants=tenants, tenant_from=tenant_from, year=year,
                   request_ids=request_ids)


@app.command()
def ingest(
    paths: PathsArg,
    db: DbOption,
    as_json: JsonFlag = False,
    format: FormatOption = None,
    node: NodeOption = None,
    role: RoleOption = None,
    tenant_map: TenantMapOption = None,
    tenant_from: TenantFromOption = None,
    year: YearOption = None,
    request_ids: RequestIdsOption = "auto",
    max_line_bytes: MaxLineOption = Limits.max_line_bytes,
    max_expansion: MaxExpansionOption = Limits.max_expansion,
) -> None:
    """Ingest log files into a case: each record ingested, a duplicate, or quarantined.

    Canonical logs, and engine logs the adapters translate (see docs/adapters.md).
    """
    limits = Limits(max_line_bytes=max_line_bytes, max_expansion=max_expansion)
    result = (_with_progress(lambda p, _: forensics.ingest(
        paths, db, progress=p, format=format, limits=limits,
        options=_adapter_options(node, role, tenant_map, tenant_from, year, request_ids))))
    if as_json:
        _print_json(result.as_dict())
    else:
        _print_counts(result)
    _input_exit(result, paths)


class Audience(StrEnum):
    """Who the report is for."""

    internal = "internal"
    regulator = "regulator"
    customer = "customer"


AudienceOption = Annotated[
    Audience, typer.Option(help="Who reads it: internal shows ids; regulator and customer never do.")
]
KeyOption = Annotated[
    str | None, typer.Option(help="Replace request and tenant ids by HMAC-SHA256 pseudonyms under this key.")
]
GeneratedAtOption = Annotated[
    str | None, typer.Option(help="The report's generation time (ISO 8601), for byte-identical re-runs.")
]


class CaseEngine(StrEnum):
    """Where ``investigate`` runs."""

    duckdb = "duckdb"
    spark = "spark"


@app.command()
def investigate(
    paths: PathsArg,
    db: Annotated[Path | None, typer.Option("--db", help="The case database (a DuckDB file); not with --engine "
                                            "spark, which writes --out-dir.", callback=_case_path)] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Also replay where the logs allow it and write the HTML report here.")
    ] = None,
    audience: AudienceOption = Audience.internal,
    pseudonymize_key: KeyOption = None,
    generated_at: GeneratedAtOption = None,
    no_replay: Annotated[bool, typer.Option("--no-replay", help="With --out: skip the replays.")] = False,
    as_json: JsonFlag = False,
    format: FormatOption = None,
    node: NodeOption = None,
    role: RoleOption = None,
    tenant_map: TenantMapOption = None,
    tenant_from: TenantFromOption = None,
    year: YearOption = None,
    request_ids: RequestIdsOption = "auto",
    max_line_bytes: MaxLineOption = Limits.max_line_bytes,
    max_expansion: MaxExpansionOption = Limits.max_expansion,
    engine: Annotated[CaseEngine, typer.Option(
        "--engine", help="duckdb: one case file on this machine; spark: on Apache Spark (the spark extra and "
        "Java 17+), the case written as Parquet to --out-dir.", rich_help_panel="Spark")] = CaseEngine.duckdb,
    master: Annotated[str, typer.Option(
        "--master", help="With --engine spark: Spark's master URL (local[N]: N cores of this machine).",
        rich_help_panel="Spark")] = "local[*]",
    partitions: Annotated[int, typer.Option(
        "--partitions", min=1, max=2**31 - 1, help="With --engine spark: the partitions of Spark's shuffles.",
        rich_help_panel="Spark")] = 8,
    out_dir: Annotated[Path | None, typer.Option(
        "--out-dir", help="With --engine spark: the folder the Parquet case is written to (new, or a Parquet "
        "case, replaced); query it and report on it with --db DIR.", rich_help_panel="Spark")] = None,
) -> None:
    """Ingest, rebuild page timelines, find exposures, print the figures; with --out, the whole job.

    The whole job adds replay confirmation and what-if where the evidence allows, then the HTML report.
    With --engine spark, ingest and analysis run on Spark into the Parquet case --out-dir (no replay).
    """
    from kvforensics.job import run

    options = _adapter_options(node, role, tenant_map, tenant_from, year, request_ids)
    limits = Limits(max_line_bytes=max_line_bytes, max_expansion=max_expansion)
    if engine is CaseEngine.spark:
        if db is not None:
            raise BadOption("--engine spark writes its case to --out-dir, not --db")
        if out_dir is None:
            raise BadOption("--engine spark needs --out-dir DIR, the folder its Parquet case is written to")
        _investigate_on_spark(paths, out_dir, out, master=master, partitions=partitions, format=format,
                              options=options, limits=limits, audience=str(audience),
                              pseudonymize_key=pseudonymize_key, generated_at=generated_at, as_json=as_json)
        return
    if db is None:
        raise BadOption("--db CASE is needed: the case database to ingest into (or --engine spark --out-dir DIR)")
    if out_dir is not None:
        raise BadOption("--out-dir is for --engine spark; the DuckDB engine writes --db")

    found = (_with_progress(lambda p, told: run(
        paths, db, out, audience=str(audience), pseudonymize_key=pseudonymize_key,
        generated_at=generated_at, with_replay=not no_replay, progress=p, format=format,
        limits=limits, options=options, phase=told, story=not as_json)))
    if as_json:
        _print_json(found.as_dict())
        _input_exit(found.investigation.ingest, paths)
        for r in found.replays:
            _disagreement_exit(r)
        return
    _print_counts(found.investigation.ingest)
    if found.investigation.ingest.empty:
        _input_exit(found.investigation.ingest, paths)
    from kvforensics import story

    written: list[str] = []
    if found.report is not None:
        written.append(f"report: {shown(found.report.out)}")
        if found.report.lists:
            from reports.lists import folder_for

            written.append(f"its complete lists (CSV, Parquet): {shown(folder_for(found.report.out))}")
    typer.echo("")
    told = found.story if found.story is not None else story.tell(found, db)  # (none: nothing ingested)
    typer.echo("\n".join(story.lines(told, render.width(), written)))
    _input_exit(found.investigation.ingest, paths)
    for r in found.replays:
        _disagreement_exit(r)


def _investigate_on_spark(paths: list[Path], out_dir: Path, out: Path | None, *, master: str, partitions: int,
                          format: str | None, options: Any, limits: Limits, audience: str,
                          pseudonymize_key: str | None, generated_at: str | None, as_json: bool) -> None:
    """``investigate --engine spark``: the Parquet case, its counts and figures, and the report if asked."""
    from forensics.exposure.tiers import lost_records, missing_page_records
    from forensics.spark import investigate as on_spark
    from forensics.store import connect

    if out is not None:
        from reports.render import check_outputs

        check_outputs(out, audience)
    found = on_spark(paths, out_dir, master=master, partitions=partitions, format=format, options=options,
                     limits=limits, progress=sys.stderr.isatty() and not as_json)
    con = connect(out_dir, read_only=True, create=False)
    try:
        missing = missing_page_records(con)
        lost = lost_records(con)
    finally:
        con.close()
    done = None
    if out is not None and not found.ingest.empty:
        from reports.render import report as write_report

        done = write_report(out_dir, out, audience=audience, pseudonymize_key=pseudonymize_key,
                            generated_at=generated_at)
    if as_json:
        _print_json({**found.as_dict(), "nodes_without_page_records": list(missing), "lost_records": lost.as_dict(),
                     **({"report": done.as_dict()} if done is not None else {})})
        _input_exit(found.ingest, paths)
        return
    _print_counts(found.ingest)
    if found.ingest.empty:
        _input_exit(found.ingest, paths)
    from forensics.investigation import Investigation
    from kvforensics import story
    from kvforensics.job import JobResult

    # the story of the DuckDB path's last screen, told of the Parquet case (no replay on Spark)
    job = JobResult(Investigation(found.ingest, found.exposure), report=done, without_page_records=tuple(missing),
                    replay_skipped="not on Spark; investigate --out on a DuckDB case replays" if missing else None,
                    lost_records=lost)
    written = [f"case (Parquet): {shown(out_dir)}"] + ([f"report: {shown(done.out)}"] if done is not None else [])
    typer.echo("")
    typer.echo("\n".join(story.lines(story.tell(job, out_dir), render.width(), written)))
    _input_exit(found.ingest, paths)


@app.command()
def report(
    db: DbOption,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write.")],
    audience: AudienceOption = Audience.internal,
    pseudonymize_key: KeyOption = None,
    generated_at: GeneratedAtOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Write the self-contained HTML incident report of an analysed case."""
    from reports.render import report as write_report

    done = _told("report and its lists", lambda: write_report(
        db, out, audience=str(audience), pseudonymize_key=pseudonymize_key, generated_at=generated_at))
    if as_json:
        _print_json(done.as_dict())
        return
    typer.echo(f"report ({done.audience}, {done.bytes:,} bytes): {done.out}")
    if done.lists:
        from reports.lists import folder_for

        typer.echo(f"its complete lists (CSV, Parquet): {shown(folder_for(done.out))}")


def _emit(frame: pl.DataFrame, fmt: Format, *, first: tuple[str, ...] = (), empty: str | None = None) -> None:
    """Print a table; what came from the logs is made safe for where it goes: a CSV's strings
    neutralised for spreadsheets (a leading ``=``, ``+``, ``-`` or ``@``), a table's controls shown
    as escapes, JSON escaped as JSON is. A table is fitted to the width (render.table: the columns
    ``first`` kept before the others); an empty one is the line ``empty`` where given."""
    if fmt is Format.json:
        _print_json(frame.to_dicts())
        return
    if fmt is Format.table:
        if not frame.height and empty is not None:
            typer.echo(empty)
        else:
            typer.echo("\n".join(render.table(frame, render.width(), first=first)))
        return
    strings = [c for c, t in frame.schema.items() if t == pl.String]
    if strings:
        frame = frame.with_columns(pl.col(c).map_elements(csv_cell, return_dtype=pl.String) for c in strings)
    typer.echo(frame.write_csv(), nl=False)


@app.command()
def exposures(
    db: DbOption,
    tenant: Annotated[str | None, typer.Option(help="Reader's or victim's tenant.")] = None,
    request: Annotated[str | None, typer.Option(help="Reader request id.")] = None,
    victim: Annotated[str | None, typer.Option(help="Victim request id.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    page_records_only: Annotated[bool, typer.Option(
        "--page-records-only",
        help="Leave out the exposures the replay filled in where page records are missing.")] = False,
) -> None:
    """List exposures: who read whose pages, where, and when (column evidence: on what it rests)."""

    def query() -> pl.DataFrame:
        with forensics.Case(db) as case:
            return case.exposures(tenant=tenant, request=request, victim=victim, page_records_only=page_records_only)

    of = [f"{what} {shown(value)!r}" for what, value in (("of tenant", tenant), ("read by request", request),
                                                          ("of victim", victim)) if value is not None]
    empty = (f"no exposures {' and '.join(of) or 'in the case'}{' on page records' if page_records_only else ''}"
             f"{'' if of else f' (what the logs show: kvforensics findings --db {shown(db)})'}")
    _emit(query(), fmt, first=EXPOSURE_COLUMNS_FIRST, empty=empty)


@app.command("not-known")
def not_known(
    db: DbOption,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """Requests the records leave unknown, where records are missing or the logs end: a row for each, with
    its tenant, node, whether it was delivered and what is not known of it (none on complete logs)."""
    with forensics.Case(db) as case:
        frame = case.not_known()
    _emit(frame, fmt, first=("request_id", "delivered", "node", "what"),
          empty="none: no record is missing, and every request that read another's pages has its finish logged")


#: The columns of an exposure kept first in a narrow terminal: who read whose content, whether
#: the victim is certain or only possible and on what evidence, then where and when.
EXPOSURE_COLUMNS_FIRST = ("reader_request", "victim_request", "certainty", "evidence", "reader_tenant",
                          "victim_tenant", "node", "first_ts", "n_pages")


@app.command()
def request(
    request_id: Annotated[str, typer.Argument(help="The request id.")],
    db: DbOption,
    show_content: Annotated[
        bool, typer.Option("--show-content", help="Also print its records' log lines as read (may hold user data).")
    ] = False,
    fmt: Annotated[Sections, typer.Option("--format", help="Output format.")] = Sections.table,
) -> None:
    """One request: its lifecycle, its pages, whose content it saw, who saw its content."""

    def query() -> tuple[forensics.RequestReport, pl.DataFrame | None]:
        with forensics.Case(db) as case:
            report = case.request(request_id)
            return report, case.request_lines(request_id) if show_content else None

    report, lines = query()
    sections = [
        ("lifecycle", "lifecycle", report.lifecycle),
        ("page records", "pages", report.pages),
        ("content of other requests it read", "saw", report.saw),
        ("requests that read its content", "seen_by", report.seen_by),
        ("uninitialized pages it read", "uninitialized", report.uninitialized),
    ]
    if fmt is Sections.json:
        _print_json({"request_id": report.request_id, **{key: frame.to_dicts() for _, key, frame in sections},
                     **({"log_lines": lines.select("path", "line_no", "text").to_dicts()} if lines is not None
                        else {})})
        return
    for title, _, frame in sections:
        typer.echo(f"\n{title} ({frame.height:,})")
        if frame.height:
            _emit(frame, Format.table, first=EXPOSURE_COLUMNS_FIRST if frame is report.saw or frame is report.seen_by
                  else ())
    if lines is not None:
        typer.echo(f"\nlog lines ({lines.height})")
        for path, line_no, text in lines.select("path", "line_no", "text").iter_rows():
            typer.echo(f"{shown(path)}:{line_no}: {shown(text)}")


@app.command()
def page(
    node: Annotated[str, typer.Argument(help="The node, e.g. decode-0.")],
    page_id: Annotated[int, typer.Argument(metavar="PAGE", min=0, max=MOST_ID, help="The page id.")],
    db: DbOption,
    boot: Annotated[int | None, typer.Option(min=0, max=MOST_ID, help="Only this boot of the node.")] = None,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
) -> None:
    """A page's timeline on a node: holds, writes and reads in (boot, seq) order."""

    def query() -> pl.DataFrame:
        with forensics.Case(db) as case:
            return case.page_timeline(node, page_id, boot=boot)

    at = f" in boot {boot}" if boot is not None else ""
    _emit(query(), fmt, first=("seq", "ts", "request_id", "op", "pages"),
          empty=f"no page records of page {page_id} on {shown(node)}{at}")


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
    frame = (forensics.quarantined(db, reason=reason, with_raw=show_content))
    _emit(frame, fmt, first=("file", "line", "reason"),
          empty="no records quarantined" + (f" for the reason {shown(reason)!r}" if reason is not None else ""))


@app.command()
def sql(
    query: Annotated[str, typer.Argument(help="One read-only SQL query over the case's tables.")],
    db: DbOption,
    fmt: Annotated[Format, typer.Option("--format", help="Output format.")] = Format.table,
    limit: Annotated[int, typer.Option(help="Print at most this many rows.", min=1, max=MOST_ID)] = 1000,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Print every row, however many.")] = False,
) -> None:
    """Run one read-only SQL query over the case (tables in docs/tables.md).

    The query runs in DuckDB's sandbox: the case opened read-only, external access off and the
    configuration locked, so it reads the case's tables and nothing else: no files, no network,
    no extensions, no settings. One statement; a SELECT (or EXPLAIN).
    """
    from forensics.case import run_read_only

    result = run_read_only(db, query, limit=None if no_limit else limit)
    frame = result.frame
    if fmt is Format.table and frame.columns == ["explain_key", "explain_value"]:  # a plan: DuckDB's drawing
        typer.echo("\n".join(shown(line) for plan in frame["explain_value"] for line in str(plan).splitlines()))
    else:  # fitted to the width as every table is; --format csv or json has every column whole
        _emit(frame, fmt, empty="(no rows)")
    if result.truncated:
        typer.echo(f"kvforensics: the first {limit:,} rows shown; --limit N or --no-limit for more", err=True)


@app.command()
def findings(
    db: DbOption,
    as_json: JsonFlag = False,
    fmt: Annotated[Format, typer.Option("--format", help="Output format: csv, a row a finding (severity, id, "
                                                          "count, title); json, as --json.")] = Format.table,
) -> None:
    """Root-cause signatures and evidence gaps, each with its evidence rows and the SQL that found them."""
    from kvforensics.story import findings_lines, findings_table

    def load() -> forensics.Findings:
        with forensics.Case(db) as case:
            return case.findings()

    found = load()
    if as_json or fmt is Format.json:
        _print_json({"findings": [f.as_dict(rows=None) for f in found]})
        return
    if fmt is Format.csv:
        _emit(findings_table(found), fmt)
        return
    if not found:
        typer.echo("no findings")
        return
    rows_shown, cells = 5, render.width()
    lines = findings_lines(found, cells)
    for f in found:
        lines += ["", *render.wrap(shown(f"[{f.severity}] {f.id}: {f.title}"), cells, hanging=4)]
        lines += render.table(f.evidence.head(rows_shown), cells, indent=4)
        if f.count > rows_shown:
            lines.append(f"    ... {f.count - rows_shown:,} more (--json for all)")
    typer.echo("\n".join(lines))


Engine = StrEnum("Engine", {name: name for name in BEHAVIOURS})  # type: ignore[misc]
PLACEHOLDER = Engine("sglang-placeholder")


@app.command()
def simulate(
    out: Annotated[Path, typer.Option("--out", help="Folder for the log set (must be new or empty).")],
    requests: Annotated[int | None, typer.Option(
        min=1, max=MOST, help="Requests to simulate (default 1000; with --trace, the whole trace).")] = None,
    engine: Annotated[Engine, typer.Option(help="Engine behaviour.")] = PLACEHOLDER,
    seed: Annotated[int, typer.Option(min=0, max=MOST_ID, help="Seed of every random choice.")] = 0,
    trace: Annotated[
        Path | None, typer.Option(help="A Mooncake (.jsonl) or Azure (.csv) trace to take arrivals from.")
    ] = None,
    length_scale: Annotated[float, typer.Option(
        min=0, max=MOST, callback=_positive, help="Multiply every prompt length by this.")] = 1.0,
    over_long: Annotated[float | None, typer.Option(
        min=0, max=1, help="Share of prompts made longer than prefill admits (default 0.02; 0 with --trace).")] = None,
    late_writes: Annotated[float, typer.Option(
        min=0, max=1, help="Share of transfers that land after decode timed out and freed.")] = 0.0,
    rate: Annotated[float, typer.Option(
        min=0, max=MOST, callback=_positive, help="Synthetic arrivals per second.")] = 4.0,
    context_length: Annotated[int, typer.Option(
        min=1, max=MOST, help="Context window, tokens.")] = Deployment.context_length,
    prefill_pool_tokens: Annotated[int, typer.Option(
        min=1, max=MOST, help="Prefill KV pool, tokens.")] = Deployment.prefill_pool_tokens,
    decode_pool_tokens: Annotated[int, typer.Option(
        min=1, max=MOST, help="Decode KV pool, tokens.")] = Deployment.decode_pool_tokens,
    page_size: Annotated[int, typer.Option(min=1, max=MOST, help="Tokens per KV page.")] = Deployment.page_size,
    prefill_nodes: Annotated[int, typer.Option(min=1, max=MOST, help="Prefill nodes.")] = Deployment.prefill_nodes,
    decode_nodes: Annotated[int, typer.Option(min=1, max=MOST, help="Decode nodes.")] = Deployment.decode_nodes,
    no_overlap_schedule: Annotated[bool, typer.Option(
        "--no-overlap-schedule", help="Decode without the overlap scheduler (SGLang's "
        "--disable-overlap-schedule; on by default).")] = False,
    no_prefix_cache: Annotated[bool, typer.Option(
        "--no-prefix-cache", help="Prefill without the prefix (radix) cache, freeing a prompt's pages at its "
        "transfer's end (SGLang's --disable-radix-cache; on by default).")] = False,
    sglang_logs: Annotated[Path | None, typer.Option(
        "--sglang-logs", help="Also write here what SGLang servers would have logged of the run "
        "(new or empty folder), with tenants.json for --tenant-map.")] = None,
    sglang_version: Annotated[str | None, typer.Option(
        "--sglang-version", help="With --sglang-logs: print them through this SGLang release's own logging "
        "code (its wheel from --sglang-wheel, the wheel cache or PyPI). Without it, a drill in the 0.5.5 "
        "layout that we typed, not printed by SGLang.")] = None,
    sglang_wheel: Annotated[Path | None, typer.Option(
        "--sglang-wheel", help="With --sglang-version: its wheel (pip download --no-deps sglang==X).")] = None,
    sglang_json: Annotated[bool, typer.Option(
        "--sglang-json", help="With --sglang-logs: the JSON request log, not SGLang's default text form.")] = False,
    sglang_gzip: Annotated[bool, typer.Option(
        "--sglang-gzip", help="With --sglang-version: each server's log as NODE.log.gz, as rotated logs are.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Simulate a deployment with the reference engine and write a full log set (page records included)."""
    from replay.sglang_logs import write as write_sglang_logs
    from replay.simulate import simulate_to

    deployment = Deployment(
        engine=str(engine), context_length=context_length, prefill_pool_tokens=prefill_pool_tokens,
        decode_pool_tokens=decode_pool_tokens, page_size=page_size, prefill_nodes=prefill_nodes,
        decode_nodes=decode_nodes, overlap_schedule=not no_overlap_schedule,
        prefix_cache=not no_prefix_cache,
    )
    if sglang_logs is not None and sglang_logs.exists() and (not sglang_logs.is_dir() or any(sglang_logs.iterdir())):
        raise OutputExists(f"{sglang_logs}: exists and is not an empty folder; choose another --sglang-logs")
    if sglang_logs is None and (sglang_version or sglang_wheel or sglang_json or sglang_gzip):
        raise BadOption("--sglang-version, --sglang-wheel, --sglang-json and --sglang-gzip go with --sglang-logs")
    if sglang_version is None and (sglang_wheel or sglang_gzip):
        raise BadOption("--sglang-wheel and --sglang-gzip go with --sglang-version")
    from replay.sglang_print.run import Refused, find_wheel
    from replay.sglang_print.run import write as print_sglang_logs
    if sglang_version is not None:  # (the release and its wheel first: a refusal writes nothing)
        try:
            sglang_wheel = find_wheel(sglang_version, sglang_wheel)
        except Refused as e:
            raise BadOption(str(e)) from e
    result = (simulate_to(
        out, deployment=deployment, requests=requests, seed=seed, trace=trace,
        length_scale=length_scale, over_long=over_long, late_writes=late_writes, rate=rate,
    ))
    sglang_files: list[Path] = []
    if sglang_logs is not None and sglang_version is not None:
        try:
            sglang_files, _ = print_sglang_logs(out, sglang_logs, sglang_version, wheel=sglang_wheel,
                                                text=not sglang_json, gzip=sglang_gzip)
        except Refused as e:
            raise BadOption(str(e)) from e
    elif sglang_logs is not None:
        sglang_files, _ = write_sglang_logs(out, sglang_logs, text=not sglang_json)
    if as_json:
        _print_json({**result.as_dict(), "sglang_logs": [str(f) for f in sglang_files]})
        return
    typer.echo(f"{result.records:,} records of {result.requests:,} requests in {out}")
    if sglang_logs is not None:
        by = f"printed by SGLang {sglang_version}'s code" if sglang_version else "a typed drill, not printed by SGLang"
        typer.echo(f"  as SGLang would have logged it: {len(sglang_files)} server logs in {sglang_logs}, {by} "
                   f"(tenants in {sglang_logs / 'tenants.json'})")
    typer.echo(f"  over-long prompts: {result.over_long:,}; late transfers: {result.late_writes:,}")
    for name, value in result.outcomes.items():
        typer.echo(f"  {name.replace('_', ' ')}: {value:,}")
    if result.waited:
        typer.echo(f"  waited for decode pages (preallocation queue): {result.waited:,}")
    if result.starved_steps:
        typer.echo(f"  note: {result.starved_steps:,} decode steps found no free page, where SGLang would retract "
                   "a request (not modelled: those steps took none); a larger --decode-pool-tokens avoids it")
    typer.echo(f"\nnext: kvforensics investigate {out} --db CASE.duckdb")


@app.command()
def replay(
    db: DbOption,
    engine: Annotated[Engine, typer.Option(help="Engine behaviour to replay under.")] = PLACEHOLDER,
    out: Annotated[Path | None, typer.Option(
        "--out", help="Folder for the replayed log set and its case (an earlier replay's is replaced).",
        callback=_case_path)] = None,
    prefill_pool_tokens: Annotated[int | None, typer.Option(
        min=1, max=MOST, help="What if the prefill KV pool had this many tokens.")] = None,
    context_length: Annotated[int | None, typer.Option(
        min=1, max=MOST, help="What if the context window were this.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Replay the case's request and transfer records (never its page records) through the reference engine.

    Prints the replay's exposure figures and, where the case has page records, the agreement.
    """
    from kvforensics.job import check_what_if
    from kvforensics.story import flushes_said, step_records_said
    from replay.replay import WhatIf, default_out
    from replay.replay import replay as run_replay

    what_if = WhatIf(prefill_pool_tokens=prefill_pool_tokens, context_length=context_length)
    check_what_if(db, what_if)
    target = out or default_out(db, str(engine), what_if)
    result = _told(f"replay under {engine}", lambda: run_replay(db, str(engine), target, what_if=what_if))
    if as_json:
        _print_json(result.as_dict())
        _disagreement_exit(result)
        return
    typer.echo(f"replayed {result.records:,} records under {engine} into {shown(result.out)} ({result.mode})")
    if result.not_replayed:
        typer.echo(f"  {result.not_replayed:,} requests could not be placed (no prefill or decode node): not replayed")
    for assumption in result.assumed:
        typer.echo(f"  assumed, the logs do not say: {assumption}")
    if result.mode == "confirm" and (steps := step_records_said(result)):
        typer.echo(f"  {steps}")
    if flushes := flushes_said(result):
        typer.echo(f"  {flushes}")
    typer.echo("")
    _print_figures(result.exposure)
    _print_disagreements(result)
    if result.agreement:
        a = result.agreement
        typer.echo(f"\nagreement with the case's page records:\n  allocations reproduced page for page: "
                   f"{a.reproduced_allocations:,} of {a.logged_allocations:,}")
        for name, v in (("exposed responses", a.exposed_responses), ("exposure pairs", a.exposure_pairs)):
            typer.echo(f"  {name}: {v.confirmed:,} confirmed, {v.replay_only:,} replay only, {v.log_only:,} log only")
    _disagreement_exit(result)


def _print_disagreements(result: Any, shown_rows: int = 10) -> None:
    """A replay's disagreements with the logs (confirm) or the outcomes it changed (what-if)."""
    if result.mode == "what-if":
        typer.echo(f"\nwhat-if: {result.outcomes_changed:,} logged outcomes changed (delivered in the logs and not "
                   "in the replay, or the reverse)")
        return
    n = len(result.disagreements)
    if not n:
        typer.echo("\nconfirmed: the model followed every logged outcome (0 disagreements)")
        return
    kinds = result.disagreement_kinds()
    typer.echo(f"\nconfirmed, with {render.plural(n, 'disagreement')} (where the model could not do what "
               f"the logs say, the logs were followed): {', '.join(f'{k} {v:,}' for k, v in kinds.items())}")
    for d in result.disagreements[:shown_rows]:
        typer.echo(f"  {shown(d.request_id)} on {shown(d.node)}: {d.kind} ({shown(d.detail)})")
    if n > shown_rows:
        typer.echo(f"  ... {n - shown_rows:,} more (--json, or the case's table replay_disagreements)")


def _disagreement_exit(result: Any) -> None:
    """Exit with :data:`EXIT_DISAGREES` where a confirming replay could not follow the logs everywhere."""
    if result.mode == "confirm" and result.disagreements:
        typer.echo(f"kvforensics: the replay confirms with {render.plural(len(result.disagreements), 'disagreement')} "
                   "(listed); exit 7", err=True)
        raise typer.Exit(EXIT_DISAGREES)


def main() -> None:
    """Console-script entry point."""
    _arm([_on_stop] * len(STOP_SIGNALS))
    _Stop.started = True
    try:
        _say_library_notes()
        app()
    except (SystemExit, Stopped):
        _arm([signal.SIG_IGN] * len(STOP_SIGNALS))  # the outcome is decided: a stop now changes nothing
        if _Stop.signum is not None:  # one that arrived outside a command, or was swallowed on its way
            raise SystemExit(_say_stopped()) from None
        raise


def _say_library_notes() -> None:
    """Print the library's notes on stderr: that a part is being compiled (a first run's wait), that
    a replay ran a query again under more memory."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("kvforensics: %(message)s"))
    for name in ("forensics.compiled", "replay.nodes"):
        notes = logging.getLogger(name)
        notes.addHandler(handler)
        notes.setLevel(logging.INFO)


if __name__ == "__main__":
    main()
