"""No traceback reaches a user: every command, driven into every class of failure, prints one
line on stderr and exits with that class's documented code; ``--debug`` shows the traceback."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

import forensics
import forensics.case
import kvforensics.job
import replay.replay
import replay.simulate
import reports.render
from forensics.errors import CaseError
from kvforensics.cli import EXIT_DATABASE, EXIT_ERROR, EXIT_INTERNAL, EXIT_OS, EXIT_PIPE, EXIT_USAGE, app

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
    assert "Traceback" not in result.output


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
    (["page", "decode-0", "99999999999999999999", "--db", "DB"], EXIT_ERROR, "PAGE must be a page id"),
    (["sql", "SELECT 1; SELECT 2", "--db", "DB"], EXIT_ERROR, "one query at a time"),
    (["exposures", "--db", "OUT"], EXIT_ERROR, "is a folder, not a case file"),
])
def test_real_failures_are_one_line(args: list[str], code: int, says: str, tmp_path: Path) -> None:
    forensics.investigate([EXAMPLE], tmp_path / "case.duckdb")
    (tmp_path / "missing").write_text("a file where a folder should be")
    result = RUNNER.invoke(app, _args(args, tmp_path))
    assert result.exit_code == code, result.output
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
