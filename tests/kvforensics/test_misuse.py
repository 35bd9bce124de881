"""Misuse and fuzzing of the command line: no traceback, ever; ``sql`` reaches nothing outside the
case; outputs never attack their reader or replace what is not theirs; the counts add up for any
tree of files, special files and random bytes included."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import forensics
from kvforensics.cli import EXIT_ERROR, EXIT_INTERNAL, EXIT_NO_RECORDS, EXIT_REFUSED_FILES, app

RUNNER = CliRunner()
EXAMPLE = FIXTURES / "examples" / "placeholder" / "events.jsonl"
SANE_EXITS = {0, 1, 2, 3, 4, EXIT_REFUSED_FILES, EXIT_NO_RECORDS, 141}


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("case") / "case.duckdb"
    forensics.investigate([EXAMPLE], db)
    return db


def run(args: list[str]) -> tuple[int, str, str]:
    result = RUNNER.invoke(app, args)
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, result.output + result.stderr
    return result.exit_code, result.stdout, result.stderr


# --- sql reaches the case's tables and nothing else ---------------------------------------------


@pytest.mark.parametrize(("query", "says"), [
    ("COPY (SELECT * FROM records) TO 'OUT/copy.csv'", "not a copy statement"),
    ("EXPORT DATABASE 'OUT/export'", "not a export statement"),
    ("SELECT * FROM read_text('/etc/passwd')", "disabled by configuration"),
    ("SELECT * FROM glob('/root/*')", "disabled by configuration"),
    ("SELECT * FROM read_csv('OUT/../x.csv')", "disabled by configuration"),
    ("INSTALL httpfs", "not a "),
    ("ATTACH 'OUT/other.duckdb' AS o", "not a attach statement"),
    ("SET enable_external_access = true", "not a "),
    ("SELECT 1; COPY (SELECT 1) TO 'OUT/x.csv'", "one query at a time"),
    ("CREATE TABLE t AS SELECT 1", "not a create statement"),
])
def test_sql_runs_one_read_only_query_in_the_sandbox(case: Path, tmp_path: Path, query: str, says: str) -> None:
    code, _, err = run(["sql", query.replace("OUT", str(tmp_path)), "--db", str(case)])
    assert code == EXIT_ERROR and says in err, err
    assert list(tmp_path.iterdir()) == []


def test_sql_prints_a_bounded_number_of_rows_unless_told(case: Path) -> None:
    code, out, err = run(["sql", "SELECT * FROM range(5000)", "--db", str(case), "--format", "csv"])
    assert code == 0 and len(out.splitlines()) == 1001 and "first 1,000 rows" in err
    code, out, err = run(["sql", "SELECT * FROM range(5000)", "--db", str(case), "--format", "csv", "--limit", "7"])
    assert len(out.splitlines()) == 8
    code, out, err = run(["sql", "SELECT * FROM range(5000)", "--db", str(case), "--format", "csv", "--no-limit"])
    assert len(out.splitlines()) == 5001 and err == ""


# --- outputs that never attack their reader ----------------------------------------------------


def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised(case: Path) -> None:
    query = ("SELECT '=cmd|'' /C calc''!A0' AS a, '@SUM(1+1)' AS b, '+1+2' AS c, '-2+3' AS d, 'plain' AS e, "
             "-5 AS n")
    code, out, _ = run(["sql", query, "--db", str(case), "--format", "csv"])
    assert code == 0
    row = out.splitlines()[1]
    assert row == "'=cmd|' /C calc'!A0,'@SUM(1+1),'+1+2,'-2+3,plain,-5"


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_terminal_escapes_from_the_logs_are_shown_not_played(case: Path, fmt: str) -> None:
    query = "SELECT chr(27) || ']0;owned' || chr(7) || chr(27) || '[2J' || chr(8238) || 'abc' AS id"
    code, out, _ = run(["sql", query, "--db", str(case), "--format", fmt])
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;owned\\x07\\x1b[2J\\u202eabc" in out


def test_a_newline_in_a_file_name_cannot_forge_a_summary_line(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(EXAMPLE, logs / "x\ntotal: 999 read = 999 ingested + 0 duplicates + 0 quarantined\n.jsonl")
    code, out, _ = run(["ingest", str(logs), "--db", str(tmp_path / "case.duckdb")])
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("total:")] == [out.splitlines()[-1]]
    assert "999" not in out.splitlines()[-1]


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "folder"])
def test_report_out_replaces_only_a_regular_file(case: Path, tmp_path: Path, kind: str) -> None:
    if kind == "device":
        target = Path("/dev/null")
    elif kind == "fifo":
        target = tmp_path / "r.html"
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "elsewhere.html").write_text("keep me")
        target = tmp_path / "r.html"
        target.symlink_to(tmp_path / "elsewhere.html")
    else:
        target = tmp_path / "r.html"
        target.mkdir()
    before = target.lstat()
    code, _, err = run(["report", "--db", str(case), "--out", str(target)])
    assert code == EXIT_ERROR and len(err.strip().splitlines()) == 1
    after = target.lstat()
    assert (stat.S_IFMT(after.st_mode), after.st_ino) == (stat.S_IFMT(before.st_mode), before.st_ino)
    if kind == "symlink":
        assert (tmp_path / "elsewhere.html").read_text() == "keep me"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]


def test_a_report_replaces_an_old_one_whole(case: Path, tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    target.write_text("old")
    code, _, _ = run(["report", "--db", str(case), "--out", str(target)])
    assert code == 0 and target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r-lists", "r.html"]  # (nothing half-written)
    assert sorted(p.name for p in (tmp_path / "r-lists").iterdir()) == [
        f"{name}.{suffix}" for name in ("handoffs", "not_known", "responses", "victims")
        for suffix in ("csv", "parquet")]


def test_direction_overrides_and_controls_in_the_logs_are_neutral_in_the_report(tmp_path: Path) -> None:
    records = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    for r in records:
        for key in ("node", "src_node", "dst_node", "prefill_node", "decode_node"):
            if isinstance(r.get(key), str) and r[key].startswith("decode"):
                r[key] = "\u202e" + r[key] + "\x1b[2J"
    log = tmp_path / "events.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    db = tmp_path / "case.duckdb"
    forensics.investigate([log], db)
    code, _, _ = run(["report", "--db", str(db), "--out", str(tmp_path / "r.html")])
    assert code == 0
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "\u202e" not in html and "\x1b" not in html and "\\u202edecode" in html


# --- random arguments and random trees --------------------------------------------------------

_WORDS = ["--db", "DB", "--out", "OUT", "--format", "csv", "json", "table", "--json", "--limit", "0", "-1",
          "99999999999999999999", "decode-0", "r", "--tenant", "--boot", "NaN", "''", "\x1b[2J", "/dev/zero",
          "/dev/null", "SELECT 1", "--requests", "--engine", "sglang-hardened", "--audience", "regulator",
          "--max-line-bytes", "--max-expansion", "--show-content", "--no-limit", "LOGS"]
_COMMANDS = ["ingest", "investigate", "report", "exposures", "request", "page", "quarantine", "sql", "findings",
             "replay", "simulate"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_COMMANDS), st.lists(st.sampled_from(_WORDS) | st.text(max_size=8), max_size=7))
def test_random_command_lines_never_give_a_traceback(case: Path, tmp_path: Path, command: str,
                                                     words: list[str]) -> None:
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    db = work / "case.duckdb"
    shutil.copy(case, db)
    args = [command] + [w.replace("DB", str(db)).replace("OUT", str(work / "out")).replace("LOGS", str(EXAMPLE))
                        for w in words if "\x00" not in w]
    result = RUNNER.invoke(app, args)
    assert result.exit_code in SANE_EXITS and result.exit_code != EXIT_INTERNAL, (args, result.output, result.stderr)
    assert "Traceback" not in result.output + result.stderr
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception


_GOOD = EXAMPLE.read_bytes()
_PIECES = st.sampled_from([_GOOD, _GOOD[: len(_GOOD) // 3], b"\xff\xfe\x00garbage\n", b"[" * 3000 + b"\n",
                           b'{"kind": "kv"}\n' * 3, b"", b"\r\n\r\n", b"kind,ts,node\nkv,x,y\n"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["a.jsonl", "b.jsonl.gz", "c.csv", "d.log", "e", "sub/f.jsonl",
                                           "g.jsonl.zst", "h.parquet"]),
                          _PIECES, st.sampled_from(["plain", "gzip", "cut", "fifo", "link"])),
                min_size=1, max_size=6))
def test_any_tree_of_files_is_accounted_for_line_by_line(tmp_path: Path, files: list[tuple[str, bytes, str]]) -> None:
    root = tmp_path / "tree"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    for i, (name, data, how) in enumerate(files):
        path = root / f"{i}-{name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if how == "fifo":
            os.mkfifo(path)
        elif how == "link":
            path.symlink_to("/dev/zero")
        elif how == "gzip":
            path.write_bytes(gzip.compress(data))
        elif how == "cut":
            path.write_bytes(gzip.compress(data)[:-6])
        else:
            path.write_bytes(data)
    db = tmp_path / "case.duckdb"
    db.unlink(missing_ok=True)
    try:
        result = forensics.ingest([root], db)
    except forensics.KvfError as exc:  # only a refusal of the whole (none is expected of a folder)
        pytest.fail(f"a folder's ingest was refused whole: {exc}")
    for f in result.files:
        c = f.counts
        assert c.read == c.ingested + c.duplicates + c.quarantined
        assert f.status != "refused" or (c.read == 0 and f.why)
    r = result.records
    assert r.read == r.ingested + r.duplicates + r.quarantined
    seen = {Path(f.path).name for f in result.files} | {Path(p.path).name for p in result.skipped}
    assert seen == {p.name for p in root.rglob("*") if not p.is_dir()}
