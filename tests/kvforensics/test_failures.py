"""No traceback reaches a user: every command, driven into every class of failure, prints one
line on stderr and exits with that class's documented code; ``--debug`` shows the traceback.
Nothing is passed over quietly (a file or folder that cannot be read is refused, exit 6), an empty
input is its own answer (exit 8), a full disk or a read-only folder is the system's refusal (exit
3, with the path), and a wrong command line, a value out of range included, is one line (exit 2)."""

from __future__ import annotations

import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import FIXTURES, said, unreadable
from typer.testing import CliRunner

import forensics
import forensics.case
import kvforensics.job
import replay.replay
import replay.simulate
import reports.render
from forensics.errors import CaseError
from kvforensics.cli import (
    EXIT_DATABASE,
    EXIT_ERROR,
    EXIT_INTERNAL,
    EXIT_NO_RECORDS,
    EXIT_OS,
    EXIT_PIPE,
    EXIT_REFUSED_FILES,
    EXIT_USAGE,
    app,
    failure,
)
from kvforensics.reference import commands, help_text

RUNNER = CliRunner()
EXAMPLE = FIXTURES / "examples" / "placeholder" / "events.jsonl"


def _raiser(exc: BaseException) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise exc

    return fail


#: Each command, its arguments (DB is the case) and the library call it makes, where a failure is put.
COMMANDS: dict[str, tuple[list[str], object, str]] = {
    "ingest": (["ingest", str(EXAMPLE), "--db", "DB"], forensics, "ingest"),
    "investigate": (["investigate", str(EXAMPLE), "--db", "DB"], kvforensics.job, "run"),
    "report": (["report", "--db", "DB", "--out", "OUT/r.html"], reports.render, "report"),
    "exposures": (["exposures", "--db", "DB"], forensics, "Case"),
    "request": (["request", "r", "--db", "DB"], forensics, "Case"),
    "page": (["page", "decode-0", "1", "--db", "DB"], forensics, "Case"),
    "findings": (["findings", "--db", "DB"], forensics, "Case"),
    "not-known": (["not-known", "--db", "DB"], forensics, "Case"),
    "quarantine": (["quarantine", "--db", "DB"], forensics, "quarantined"),
    "sql": (["sql", "SELECT 1", "--db", "DB"], forensics.case, "run_read_only"),
    "simulate": (["simulate", "--out", "OUT/sim", "--requests", "5"], replay.simulate, "simulate_to"),
    "replay": (["replay", "--db", "DB", "--out", "OUT/replay"], replay.replay, "replay"),
}

FAILURES: dict[str, tuple[BaseException, int, str]] = {
    "toolkit": (CaseError("the case is damaged"), EXIT_ERROR, "kvforensics: error: the case is damaged"),
    "system": (PermissionError(errno.EACCES, "Permission denied", "/evidence/x"), EXIT_OS,
               "kvforensics: system error: /evidence/x: Permission denied"),
    "database": (duckdb.IOException("IO Error: disk I/O\nmore"), EXIT_DATABASE,
                 "kvforensics: database error: IOException: IO Error: disk I/O"),
    "bug": (KeyError("nope"), EXIT_INTERNAL, "kvforensics: internal error: KeyError: 'nope' (a bug: run again"),
}


def _args(args: list[str], tmp_path: Path) -> list[str]:
    return [a.replace("DB", str(tmp_path / "case.duckdb")).replace("OUT", str(tmp_path)) for a in args]


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_failure_is_one_line_and_its_exit_code(
    command: str, failure: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, where, name = COMMANDS[command]
    exc, code, line = FAILURES[failure]
    monkeypatch.setattr(where, name, _raiser(exc))
    result = RUNNER.invoke(app, _args(args, tmp_path))
    assert result.exit_code == code, result.output
    assert result.stderr.startswith(line)
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_every_command_is_driven_into_the_failures() -> None:
    listed = {c.name or c.callback.__name__ for c in app.registered_commands if c.callback}
    assert listed == set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_wrong_command_line_is_a_usage_error(command: str) -> None:
    result = RUNNER.invoke(app, [command, "--no-such-option"])
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith("kvforensics: usage: No such option: --no-such-option")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--no-such-option"], "No such option: --no-such-option"),
    (["no-such-command"], "No such command 'no-such-command'"),
    (["ingest"], "Missing argument"),
    (["sql", "SELECT 1"], "Missing option '--db'"),
])
def test_a_usage_error_is_one_line_not_a_box(args: list[str], says: str) -> None:
    result = RUNNER.invoke(app, args)
    assert result.exit_code == EXIT_USAGE
    assert result.stderr.startswith(f"kvforensics: usage: {says}") and len(result.stderr.strip().splitlines()) == 1


def test_no_arguments_at_all_still_show_the_help() -> None:
    result = RUNNER.invoke(app, [])
    assert result.exit_code == EXIT_USAGE and "Commands" in result.output


#: Every numeric option of every command (and PAGE), with values outside what it admits: below its
#: least, past any count a log can hold, and (floats) not a number or not finite.
OUT_OF_RANGE: dict[tuple[str, str], list[str]] = {
    **{(c, "--year"): ["0", "-5", "10000"] for c in ("ingest", "investigate")},
    **{(c, "--max-line-bytes"): ["-5", "100", "99999999999999999999"] for c in ("ingest", "investigate")},
    **{(c, "--max-expansion"): ["0", "-5", "99999999999999999999"] for c in ("ingest", "investigate")},
    ("investigate", "--partitions"): ["0", "-5", "99999999999999999999"],
    ("page", "PAGE"): ["-1", "99999999999999999999"],
    ("page", "--boot"): ["-1", "99999999999999999999"],
    ("sql", "--limit"): ["0", "-5", "99999999999999999999"],
    ("simulate", "--seed"): ["-1", "99999999999999999999"],
    **{("simulate", o): ["0", "-5", "99999999999999999999"] for o in (
        "--requests", "--context-length", "--prefill-pool-tokens", "--decode-pool-tokens", "--page-size",
        "--prefill-nodes", "--decode-nodes")},
    **{("simulate", o): ["0", "-1", "nan", "inf", "1e308"] for o in ("--length-scale", "--rate")},
    **{("simulate", o): ["-0.5", "2", "nan", "inf"] for o in ("--over-long", "--late-writes")},
    **{("replay", o): ["0", "-5", "99999999999999999999"] for o in ("--prefill-pool-tokens", "--context-length")},
}
#: Each command's arguments, where a numeric option is put.
_BASE = {"ingest": ["ingest", str(EXAMPLE), "--db", "DB"], "investigate": ["investigate", str(EXAMPLE), "--db", "DB"],
         "page": ["page", "decode-0", "1", "--db", "DB"], "sql": ["sql", "SELECT 1", "--db", "DB"],
         "simulate": ["simulate", "--out", "OUT/sim", "--requests", "3"], "replay": ["replay", "--db", "DB"]}


@pytest.mark.parametrize(("command", "option", "value"),
                         [(c, o, v) for (c, o), values in OUT_OF_RANGE.items() for v in values])
def test_a_value_out_of_range_is_a_usage_error_naming_the_option(
    command: str, option: str, value: str, tmp_path: Path
) -> None:
    args = _BASE[command][:]
    if option == "PAGE":
        args = [*args[:2], *args[3:], "--", value]
    else:
        args += [option, value]
    result = RUNNER.invoke(app, _args(args, tmp_path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.startswith(f"kvforensics: usage: Invalid value for '{option}'"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # (refused before anything was written)


def test_every_numeric_option_is_bounded_and_tried_out_of_range() -> None:
    """What --help calls a number comes with its range, and OUT_OF_RANGE tries each one."""
    numeric = set()
    for command in commands():
        text = help_text([command])
        assert not re.search(r"<(int|float)>", text), f"{command}: a number without its range"
        numeric |= {(command, o) for o in re.findall(r"(--[a-z-]+|\b[A-Z]{2,}\b)\s+<(?:int|float) range>", text)}
    assert numeric == set(OUT_OF_RANGE)


def test_the_help_lists_every_exit_code() -> None:
    text = " ".join(help_text([]).split())
    for says in ("2 usage", "3 the system refused", "6 some input files could not be read", "7 a confirming replay",
                 "8 no records found", "130, 143 stopped by SIGINT, SIGTERM"):
        assert says in text


def test_output_closed_early_stops_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that goes away (``| head``) ends the command with 141 and no message."""
    monkeypatch.setattr(forensics, "quarantined", _raiser(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    result = RUNNER.invoke(app, ["quarantine", "--db", str(tmp_path / "case.duckdb")])
    assert result.exit_code == EXIT_PIPE and result.stderr == ""


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forensics, "ingest", _raiser(KeyError("nope")))
    result = RUNNER.invoke(app, ["--debug", "ingest", str(EXAMPLE), "--db", str(tmp_path / "c.duckdb")])
    assert isinstance(result.exception, KeyError)


@pytest.mark.parametrize(("args", "code", "says"), [
    (["sql", "", "--db", "DB"], EXIT_ERROR, "no SQL query given"),
    (["sql", "SELEC", "--db", "DB"], EXIT_ERROR, "syntax error"),
    (["exposures", "--db", "OUT/none.duckdb"], EXIT_ERROR, "no such case"),
    (["report", "--db", "DB", "--out", "OUT/missing/dir/"], EXIT_ERROR, "is not a folder"),
    (["report", "--db", "DB", "--out", "OUT"], EXIT_ERROR, "a folder; name a file to write"),
    (["report", "--db", "DB", "--out", "/dev/null"], EXIT_ERROR, "not a regular file"),
    (["page", "decode-0", "99999999999999999999", "--db", "DB"], EXIT_USAGE, "Invalid value for 'PAGE'"),
    (["sql", "SELECT 1; SELECT 2", "--db", "DB"], EXIT_ERROR, "one query at a time"),
    (["exposures", "--db", "OUT"], EXIT_ERROR, "is a folder, not a case file"),
])
def test_real_failures_are_one_line(args: list[str], code: int, says: str, tmp_path: Path) -> None:
    forensics.investigate([EXAMPLE], tmp_path / "case.duckdb")
    (tmp_path / "missing").write_text("a file where a folder should be")
    result = RUNNER.invoke(app, _args(args, tmp_path))
    assert result.exit_code == code, result.output
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- nothing passed over quietly; an empty input is its own answer -----------------------------


def _refused(db: Path) -> list[tuple[str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return sorted(con.execute("SELECT path, why FROM refused_files").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize("command", ["ingest", "investigate"])
def test_a_file_and_a_folder_that_cannot_be_read_are_refused_listed_and_exit_6(command: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "sub").mkdir(parents=True)
    shutil.copy(EXAMPLE, logs / "a.jsonl")
    (logs / "b.jsonl").write_text(EXAMPLE.read_text().replace("decode-0", "decode-9"))
    shutil.copy(EXAMPLE, logs / "sub" / "c.jsonl")
    db = tmp_path / "case.duckdb"
    with unreadable(logs / "b.jsonl", logs / "sub"):
        result = RUNNER.invoke(app, [command, str(logs), "--db", str(db)])
    assert result.exit_code == EXIT_REFUSED_FILES, result.output
    assert f"{logs / 'b.jsonl'}: refused, nothing of it ingested: cannot be read (Permission denied)" in result.stdout
    assert f"{logs / 'sub'}: refused, nothing of it ingested: a folder that cannot be listed (Permission denied)" \
        in result.stdout
    assert f"{logs / 'a.jsonl'}: 13 read, 13 ingested" in result.stdout  # (the rest are in the case)
    assert said(result.stderr)[0].startswith("kvforensics: 2 of the files could not be read")
    assert len(said(result.stderr)) == 1
    assert _refused(db) == [(str(logs / "b.jsonl"), "cannot be read (Permission denied)"),
                            (str(logs / "sub"), "a folder that cannot be listed (Permission denied)")]
    again = RUNNER.invoke(app, [command, str(logs), "--db", str(db)])  # readable again: taken off the list
    assert again.exit_code == 0 and _refused(db) == []


def test_a_file_named_that_cannot_be_read_is_refused_like_a_damaged_one(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    shutil.copy(EXAMPLE, log)
    db = tmp_path / "case.duckdb"
    with unreadable(log):
        result = RUNNER.invoke(app, ["ingest", str(log), "--db", str(db)])
    assert result.exit_code == EXIT_REFUSED_FILES, result.output
    assert f"{log}: refused, nothing of it ingested: cannot be read (Permission denied)" in result.stdout
    assert _refused(db) == [(str(log), "cannot be read (Permission denied)")]


@pytest.mark.parametrize("what", ["empty folder", "blank lines", "folder of other files"])
@pytest.mark.parametrize("command", ["ingest", "investigate"])
def test_an_input_without_records_is_its_own_answer(command: str, what: str, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    if what == "blank lines":
        (logs / "a.jsonl").write_text("\n\n  \n")
    elif what == "folder of other files":
        (logs / "README.md").write_text("# not a log\n")
    out = tmp_path / "r.html"
    extra = ["--out", str(out)] if command == "investigate" else []
    result = RUNNER.invoke(app, [command, str(logs), "--db", str(tmp_path / "case.duckdb"), *extra])
    assert result.exit_code == EXIT_NO_RECORDS, result.output
    assert said(result.stderr)[0].startswith(f"kvforensics: no records found in {logs}")
    assert len(said(result.stderr)) == 1
    assert "exposed_responses" not in result.stdout and not out.exists()


def test_a_file_of_malformed_lines_is_not_empty(tmp_path: Path) -> None:
    """Its lines are records, quarantined: the answer is the quarantine."""
    (tmp_path / "a.jsonl").write_text("not json\n{\"kind\": \"kv\"}\n")
    result = RUNNER.invoke(app, ["investigate", str(tmp_path / "a.jsonl"), "--db", str(tmp_path / "case.duckdb")])
    assert result.exit_code == 0 and "2 quarantined" in result.stdout


# --- the system's refusals: a full disk, a read-only folder; paths DuckDB cannot open ----------


def test_a_refusal_duckdb_quotes_is_the_system_s_even_behind_the_rollback_it_led_to() -> None:
    try:
        try:
            raise duckdb.TransactionException(
                'TransactionContext Error: Failed to commit: Could not write file "/x/c.duckdb.wal": '
                "No space left on device")
        except duckdb.Error:  # (a ROLLBACK in an except clause, as the analysis has one)
            raise duckdb.TransactionException(  # noqa: B904
                "TransactionContext Error: cannot rollback - no transaction is active")
    except duckdb.Error as exc:
        assert failure(exc) == (EXIT_OS, "kvforensics: system error: /x/c.duckdb.wal: No space left on device")


@contextmanager
def small_disk(folder: Path) -> Iterator[bool]:
    """``folder`` as a 2 MB file system where this can mount one (as root); else as it is (False)."""
    folder.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)], capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)


def _file_size_limit(size: int) -> Callable[[], None]:
    """For a child: files past ``size`` bytes refused by the system (EFBIG), as a full disk refuses them."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


SAMPLE = Path(__file__).resolve().parents[2] / "sample_logs" / "glm53-incident"


@pytest.mark.parametrize("refusal", ["full disk", "file size limit"])
def test_a_write_the_system_refuses_is_exit_3_with_the_path_and_the_cause(refusal: str, tmp_path: Path) -> None:
    """Not exit 4 with DuckDB's "cannot rollback - no transaction is active"; and the case stays as
    it was before the file that did not fit."""
    with small_disk(tmp_path / "disk") as mounted:
        limit = None if refusal == "full disk" and mounted else _file_size_limit(1_000_000)
        db = tmp_path / "disk" / "case.duckdb"
        done = subprocess.run([str(Path(sys.executable).with_name("kvforensics")), "investigate", str(SAMPLE),
                               "--db", str(db)], capture_output=True, text=True, preexec_fn=limit)
        cause = "File too large" if limit else "No space left on device"
        assert done.returncode == EXIT_OS, done.stderr
        assert re.fullmatch(rf"kvforensics: system error: {re.escape(str(db))}(\.wal)?: {cause}\n", done.stderr)
        con = duckdb.connect(str(db), read_only=True)
        per_file = con.execute("SELECT read, ingested + duplicates + quarantined FROM file_counts").fetchall()
        con.close()
        assert all(a == b for a, b in per_file)


def test_a_db_folder_the_system_will_not_write_is_exit_3_with_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        cause = "Permission denied"
    elif subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                        capture_output=True).returncode == 0:
        cause = "Read-only file system"
    else:  # root without a mount: DuckDB's own words for the refusal
        cause = "Permission denied"
        monkeypatch.setattr(duckdb, "connect", _raiser(duckdb.IOException(
            f'IO Error: Cannot open file "{folder}/x": Permission denied')))
    try:
        result = RUNNER.invoke(app, ["ingest", str(EXAMPLE), "--db", str(folder / "case.duckdb")])
    finally:
        if os.geteuid() != 0:
            folder.chmod(0o755)
        elif cause == "Read-only file system":
            subprocess.run(["umount", str(folder)], check=True)
    assert result.exit_code == EXIT_OS, result.output
    assert result.stderr == f"kvforensics: system error: {folder / 'case.duckdb'}: {cause}\n"


@pytest.mark.parametrize("args", [["ingest", str(EXAMPLE), "--db", "OUT/c\udcff.duckdb"],
                                  ["replay", "--db", "DB", "--out", "OUT/r\udcff"]])
def test_a_db_path_duckdb_cannot_open_is_a_usage_error(args: list[str], tmp_path: Path) -> None:
    """A byte that is not UTF-8 in the name (as the shell passes it): DuckDB fails on it (std::bad_cast)."""
    result = RUNNER.invoke(app, _args(args, tmp_path))
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.startswith("kvforensics: usage: Invalid value for ") and "\\xff" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and list(tmp_path.iterdir()) == []


def test_a_what_if_pool_smaller_than_a_page_is_a_usage_error(tmp_path: Path) -> None:
    """A prefill pool needs a page besides page 0: a smaller one is refused before any replay."""
    db = tmp_path / "case.duckdb"
    forensics.ingest([SAMPLE / "prefill-0.jsonl"], db)
    result = RUNNER.invoke(app, ["replay", "--db", str(db), "--prefill-pool-tokens", "1", "--out", str(tmp_path / "r")])
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stderr.startswith("kvforensics: usage: --prefill-pool-tokens 1 holds no page")
    assert not (tmp_path / "r").exists()
