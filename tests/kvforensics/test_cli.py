"""The command line: every command has help and is in the guide (docs/investigate.md); JSON output is
the library's."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest
from conftest import FIXTURES
from typer.testing import CliRunner

import forensics
from kvforensics.cli import EXIT_DISAGREES, app

RUNNER = CliRunner()
GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "investigate.md").read_text()
COMMANDS = [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_is_in_the_guide(command: str) -> None:
    result = RUNNER.invoke(app, [command, "--help"])
    assert result.exit_code == 0
    assert len(result.output.strip()) > 40
    assert f"kvforensics {command}" in GUIDE


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_paragraphs_flow_to_the_terminal_s_width(command: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A help text's paragraphs are wrapped to the terminal, not at the docstring's own line breaks
    wrapped again (at 80 columns the exit codes had lines of three words): every line of a
    paragraph but its last fills most of the width."""
    monkeypatch.setenv("COLUMNS", "80")
    result = RUNNER.invoke(app, [command, "--help"] if command else ["--help"])
    assert result.exit_code == 0
    text = result.output.split("╭")[0]  # (the description, before the panels)
    paragraphs = [[line.strip() for line in block.splitlines() if line.strip()] for block in re.split(r"\n\s*\n", text)]
    for lines in paragraphs:
        for line in lines[:-1]:
            assert len(line) >= 60, (command, line)


def test_investigate_json_equals_the_library(tmp_path: Path) -> None:
    example = FIXTURES / "examples" / "placeholder" / "events.jsonl"
    result = RUNNER.invoke(app, ["investigate", str(example), "--db", str(tmp_path / "a.duckdb"), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    found = forensics.investigate([example], tmp_path / "b.duckdb")
    assert printed["exposure"] == found.exposure
    assert printed["records"] == found.ingest.records.as_dict()
    # (stderr, not a terminal here: a line per phase of the job with its time)
    assert re.findall(r"^(\w[\w ]*): [\d,]+\.\d s$", result.stderr, re.M) == ["ingest", "analysis"]


def test_errors_are_one_line_and_exit_nonzero(tmp_path: Path) -> None:
    result = RUNNER.invoke(app, ["ingest", str(tmp_path / "nope"), "--db", str(tmp_path / "c.duckdb")])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "no such file or folder" in result.output


def test_sql_prints_a_table_fitted_to_the_width_a_plan_as_drawn_and_no_rows_in_words(
    placeholder_case: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As every command's table (it printed polars' frame: a wide text cell wrapped over four
    lines, a plan's newlines as escapes): at most COLUMNS wide, the columns left out named."""
    db = placeholder_case
    monkeypatch.setenv("COLUMNS", "60")
    wide = RUNNER.invoke(app, ["sql", "--db", str(db), "SELECT *, repeat('x', 200) AS long FROM exposures"])
    assert wide.exit_code == 0, wide.output
    lines = wide.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60 and lines[0].startswith("reader_")
    assert "not shown at 60 columns" in wide.stdout and "long" in wide.stdout and "x" * 61 not in wide.stdout
    rule = next(i for i, line in enumerate(lines) if line.startswith("─"))
    note = next(i for i, line in enumerate(lines) if line.startswith("("))
    assert [line.split()[0] for line in lines[rule + 1:note]] == ["r"]  # the one exposure
    plan = RUNNER.invoke(app, ["sql", "--db", str(db), "EXPLAIN SELECT count(*) FROM exposures"])
    assert plan.exit_code == 0 and "\\x0a" not in plan.stdout and len(plan.stdout.splitlines()) > 2
    none = RUNNER.invoke(app, ["sql", "--db", str(db), "SELECT * FROM exposures WHERE false"])
    assert none.exit_code == 0 and none.stdout == "(no rows)\n"


def test_sql_refuses_writes(placeholder_case: Path) -> None:
    db = placeholder_case
    result = RUNNER.invoke(app, ["sql", "--db", str(db), "DELETE FROM records"])
    assert result.exit_code == 1
    with forensics.Case(db) as case:
        assert case.summary()["exposed_responses"] == 1


@pytest.mark.parametrize(("args", "said"), [
    (["exposures", "--tenant", "tenant-99"], "no tenant 'tenant-99' in the case"),
    (["exposures", "--request", "nope"], "no request 'nope' in the case"),
    (["exposures", "--victim", "nope"], "no request 'nope' in the case"),
    (["page", "decode-9", "1"], "no node 'decode-9' in the case"),
    (["request", "nope"], "no request 'nope' in the case"),
])
def test_an_id_the_case_does_not_have_is_a_one_line_error_not_an_empty_table(
    args: list[str], said: str, placeholder_case: Path,
) -> None:
    """An empty table would read as "not exposed" (issue #45); the ids the case has still answer."""
    db = placeholder_case
    result = RUNNER.invoke(app, [*args, "--db", str(db)])
    assert result.exit_code == 1 and result.stderr.strip() == f"kvforensics: error: {said}"
    known = {"tenant-99": "acme", "nope": "v", "decode-9": "decode-0"}
    again = RUNNER.invoke(app, [known.get(a, a) for a in args] + ["--db", str(db)])
    assert again.exit_code == 0 and again.stdout.strip()


def test_simulate_and_replay_print_what_the_library_returns(tmp_path: Path) -> None:
    from replay.replay import replay
    from replay.simulate import simulate_to

    args = ["--requests", "120", "--seed", "3", "--over-long", "0.1", "--decode-nodes", "2", "--prefill-nodes", "2"]
    result = RUNNER.invoke(app, ["simulate", "--out", str(tmp_path / "logs"), *args, "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    from replay.simulate import Deployment

    library = simulate_to(tmp_path / "logs2", deployment=Deployment(prefill_nodes=2, decode_nodes=2),
                          requests=120, seed=3, over_long=0.1)
    assert printed["records"] == library.records and printed["outcomes"] == library.outcomes
    again = RUNNER.invoke(app, ["simulate", "--out", str(tmp_path / "logs"), *args])
    assert again.exit_code == 1 and "not an empty folder" in again.output

    forensics.investigate([tmp_path / "logs"], tmp_path / "case.duckdb")
    out = tmp_path / "replayed"
    result = RUNNER.invoke(app, ["replay", "--db", str(tmp_path / "case.duckdb"), "--engine", "sglang-hardened",
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert re.fullmatch(r"replay under sglang-hardened: [\d,]+\.\d s\n", result.stderr)  # (its phase, told)
    assert printed["exposure"]["exposure_pairs"] == 0
    direct = replay(tmp_path / "case.duckdb", "sglang-hardened", tmp_path / "direct")
    assert printed["exposure"] == direct.exposure and printed["agreement"] == direct.as_dict()["agreement"]
    bad = RUNNER.invoke(app, ["replay", "--db", str(tmp_path / "case.duckdb"), "--engine", "vllm"])
    assert bad.exit_code != 0
    again = RUNNER.invoke(app, ["replay", "--db", str(tmp_path / "case.duckdb"), "--out", str(out)])
    assert again.exit_code == 0, again.output  # an earlier replay's folder is replaced
    # the simulator's decode configs do not say whether the overlap scheduler ran: the replay says it assumed so
    assert printed["assumed"] == list(direct.assumed) and len(direct.assumed) == 1
    assert "assumed, the logs do not say: overlap scheduler on (SGLang's default) on 2 decode node(s)" in again.output
    off = RUNNER.invoke(app, ["simulate", "--out", str(tmp_path / "off"), *args, "--no-overlap-schedule", "--json"])
    assert off.exit_code == 0, off.output
    said = [json.loads(x) for f in sorted((tmp_path / "off").iterdir()) for x in f.read_text().splitlines()
            if '"kind":"config"' in x]
    assert {(c["role"], c.get("overlap_schedule")) for c in said} == {("prefill", None), ("decode", False)}
    precious = tmp_path / "logs"  # anything else is not
    refused = RUNNER.invoke(app, ["replay", "--db", str(tmp_path / "case.duckdb"), "--out", str(precious)])
    assert refused.exit_code == 1 and "not an earlier replay" in refused.output
    assert any(precious.iterdir())


def test_engine_log_options_reach_the_adapters(tmp_path: Path) -> None:
    """simulate --sglang-logs writes SGLang's logs of the run; ingest reads them with --tenant-map
    and --role; a non-empty --sglang-logs folder and a bad --role are refused in one line."""
    args = ["--requests", "30", "--seed", "5", "--prefill-nodes", "1", "--decode-nodes", "1"]
    made = RUNNER.invoke(app, ["simulate", "--out", str(tmp_path / "logs"), *args, "--sglang-logs",
                               str(tmp_path / "sglang")])
    assert made.exit_code == 0, made.output
    assert "2 server logs" in made.output
    result = RUNNER.invoke(app, ["ingest", str(tmp_path / "sglang" / "decode-0.log"), "--db",
                                 str(tmp_path / "a.duckdb"), "--node", "d9", "--json"])
    files = json.loads(result.output)["files"]
    assert [(f["adapter"], f["quarantined"]) for f in files] == [("sglang-server", 0)]
    with forensics.Case(tmp_path / "a.duckdb") as case:
        assert case.sql("SELECT DISTINCT node FROM records")["node"].to_list() == ["d9"]
    again = RUNNER.invoke(app, ["simulate", "--out", str(tmp_path / "logs2"), *args, "--sglang-logs",
                                str(tmp_path / "sglang")])
    assert again.exit_code != 0 and "not an empty folder" in again.output
    bad = RUNNER.invoke(app, ["ingest", str(tmp_path / "sglang"), "--db", str(tmp_path / "b.duckdb"),
                              "--role", "router"])
    assert bad.exit_code != 0 and "--role must be one of" in bad.output and "Traceback" not in bad.output


def test_simulate_refuses_a_release_it_cannot_print_before_writing_sglang_logs(tmp_path: Path) -> None:
    """--sglang-version prints through the release's own code: an option without --sglang-logs,
    a release the adapters do not read, or a wheel of another release is refused in one line,
    and no SGLang log is written (no download is tried for any of them)."""
    args = ["simulate", "--out", str(tmp_path / "logs"), "--requests", "5", "--prefill-nodes", "1",
            "--decode-nodes", "1"]
    wrong = tmp_path / "sglang-0.5.19-py3-none-any.whl"
    wrong.write_bytes(b"PK")
    for extra, says in (
        (["--sglang-version", "0.5.20"], "go with --sglang-logs"),
        (["--sglang-logs", str(tmp_path / "a"), "--sglang-gzip"], "go with --sglang-version"),
        (["--sglang-logs", str(tmp_path / "b"), "--sglang-version", "0.4.9"], "not a release the adapters read"),
        (["--sglang-logs", str(tmp_path / "c"), "--sglang-version", "0.5.20", "--sglang-wheel", str(wrong)],
         "not a wheel of sglang 0.5.20"),
    ):
        result = RUNNER.invoke(app, [*args, *extra])
        assert result.exit_code == 1 and says in result.output and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1
        for folder in "abc":
            assert not list((tmp_path / folder).glob("*")) if (tmp_path / folder).exists() else True


def test_request_prints_its_log_lines_only_when_asked_and_defused(tmp_path: Path) -> None:
    """The lines may hold user content: shown with --show-content only; a terminal escape
    sequence in them is printed as text, not sent to the terminal."""
    head = "kind,ts,node,seq,request_id,op,pages,note\n"
    row = "kv,2026-08-27T10:00:00Z,decode-0,{seq},{rid},alloc,1,{note}\n"
    path = tmp_path / "a.csv"
    path.write_text(head + row.format(seq=1, rid="a", note="\x1b[2Jsecret")
                    + row.format(seq=2, rid="b", note="bystander"), encoding="utf-8")
    db = tmp_path / "case.duckdb"
    forensics.ingest([path], db)
    plain = RUNNER.invoke(app, ["request", "a", "--db", str(db)])
    assert plain.exit_code == 0, plain.output
    assert "secret" not in plain.output and "log lines" not in plain.output
    shown = RUNNER.invoke(app, ["request", "a", "--db", str(db), "--show-content"])
    assert shown.exit_code == 0, shown.output
    assert f"{path}:2: kv,2026-08-27T10:00:00Z,decode-0,1,a,alloc,1,\\x1b[2Jsecret" in shown.output
    assert "\x1b" not in shown.output and "bystander" not in shown.output


RELEASES = Path(__file__).resolve().parents[1] / "adapters" / "releases"
TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} UTC")
WIDTHS = (80, 160)


@pytest.fixture(scope="module")
def told(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], tuple[Path, str]]:
    """Two cases investigated at 80 and at 160 columns, each the case and what investigate
    printed: on page records (the spec's placeholder example, its prompts long enough to group,
    and a broken line), and on SGLang 0.5.19's own log lines (request-level evidence: replayed)."""
    folder = tmp_path_factory.mktemp("told")
    example = (FIXTURES / "examples" / "placeholder" / "events.jsonl").read_text()
    (folder / "pages.jsonl").write_text(example.replace('"prompt_tokens": 12', '"prompt_tokens": 12345')
                                        + '{"kind": "request", "broken\n')
    logs = {"pages": folder / "pages.jsonl", "sglang": RELEASES / "0.5.19" / "text"}
    out = {}
    for (name, path), cells in itertools.product(logs.items(), WIDTHS):
        db = folder / f"{name}-{cells}.duckdb"
        result = RUNNER.invoke(app, ["investigate", str(path), "--db", str(db)], env={"COLUMNS": str(cells)})
        # (the SGLang run's decode retracted a request, which the replay lists: it confirms with a disagreement)
        assert result.exit_code == (EXIT_DISAGREES if name == "sglang" else 0), result.output
        out[name, cells] = db, result.stdout
    return out


def _last_screen(printed: str) -> list[str]:
    lines = printed.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("verdict: ")):]


def _next_commands(screen: list[str]) -> list[list[str]]:
    """The commands under ``next:``, a backslash's continuation joined, as argument lists."""
    text = "\n".join(screen[screen.index("next:") + 1:]).replace(" \\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("cells", WIDTHS)
@pytest.mark.parametrize("name", ["pages", "sglang"])
def test_investigate_ends_with_the_verdict_the_figures_the_findings_and_next_commands(
    told: dict[tuple[str, int], tuple[Path, str]], name: str, cells: int,
) -> None:
    """Issue #45 item 1: the last screen fits the width; its counts are the case's; each next
    command names ids of the case and prints something when run."""
    db, printed = told[name, cells]
    screen = _last_screen(printed)
    assert max(len(line) for line in screen) <= cells
    verdict = " ".join(" ".join(screen[:screen.index("")]).split())
    with forensics.Case(db, read_only=True) as case:
        summary, found = case.summary(), case.findings()
    if name == "pages":
        assert summary["exposed_responses"] == 1 and summary.certainty["victim_requests"] == {"certain": 1,
                                                                                               "possible": 0}
        assert verdict == ("verdict: Exposed: 1 delivered response read other requests' KV pages: 1 victim request "
                           "of 1 tenant, all certain, on page records.")
        assert "findings: none" in screen
    else:  # request-level evidence: the replay names no victim, the critical findings are the story
        assert summary.tiers["total"]["exposed_responses"] == 0 and summary.without_page_records
        critical = sum(f.severity == "critical" for f in found)
        assert critical == 3
        assert verdict.startswith("verdict: Not exposed on the evidence: decode-0.dp0, decode-0.dp1, prefill-0 "
                                  "logged no page records, and the confirming replay")
        assert verdict.endswith(f"; but {critical} critical findings stand (below).")
        by_severity = Counter(f.severity for f in found)
        assert f"findings: {', '.join(f'{n} {s}' for s, n in by_severity.items())}" in screen
        for f in found:  # a row each: severity, id, its count
            assert any(re.match(rf"{f.severity} +{re.escape(f.id)} +{f.count:,}  ", line) for line in screen), f.id
        # one decode server with DP attention, two nodes: said what they are
        assert ("decode-0.dp0, decode-0.dp1: the KV pools of DP ranks 0, 1 of the server decode-0"
                in " ".join(" ".join(screen).split()))
    commands = _next_commands(screen)
    assert commands and all(c[0] == "kvforensics" for c in commands)
    assert (["kvforensics", "request", "req-long", "--db", str(db)] in commands) == (name == "sglang")
    assert any(c[1] == "exposures" for c in commands) == (name == "pages")  # (no exposure: not suggested)
    for argv in commands:
        ran = RUNNER.invoke(app, argv[1:], env={"COLUMNS": str(cells)})
        assert ran.exit_code == 0 and ran.stdout.strip(), (argv, ran.output)


@pytest.mark.parametrize("cells", WIDTHS)
def test_tables_fit_the_terminal_group_numbers_and_print_one_time_format(
    told: dict[tuple[str, int], tuple[Path, str]], cells: int,
) -> None:
    """Issue #45 item 3: exposures, findings, quarantine, request and page print tables no wider
    than the terminal, counts grouped, every time as YYYY-MM-DD HH:MM:SS.ffffff UTC."""
    pages, sglang = told["pages", cells][0], told["sglang", cells][0]
    printed = {}
    for args in (["exposures", "--db", pages], ["quarantine", "--db", pages], ["request", "r", "--db", pages],
                 ["page", "decode-0", "1", "--db", pages], ["findings", "--db", sglang],
                 ["request", "req-long", "--db", sglang]):
        result = RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": str(cells)})
        assert result.exit_code == 0, result.output
        lines = result.stdout.splitlines()
        assert lines and max(len(line) for line in lines) <= cells, args
        assert "shape:" not in result.stdout and "datetime[" not in result.stdout and "+00:00" not in result.stdout
        printed[args[0], str(args[-1]) == str(sglang)] = result.stdout
    for shows_times in (("findings", True), ("page", False), ("request", False), ("request", True)):
        assert TIME.search(printed[shows_times]), shows_times
    assert not any(re.search(r"\d\dT\d\d:|\d\d:\d\d:\d\d(\.\d{1,5})? ", text) for text in printed.values())
    assert "700,000" in printed["findings", True]  # req-long's prompt
    assert "pages.jsonl" in printed["quarantine", False] and "not_json" in printed["quarantine", False]
    if cells == 160:  # (at 80 its column is left out, and said so)
        assert "12,345" in printed["request", False]
    else:
        assert "not shown at 80 columns" in printed["request", False]


def test_an_empty_list_is_a_sentence_and_machines_keep_their_formats(
    told: dict[tuple[str, int], tuple[Path, str]],
) -> None:
    """No exposure is said in a line, not a table with no rows; --format csv and json are the
    frames as before, --json and --format json the same."""
    pages, sglang = told["pages", 80][0], told["sglang", 80][0]
    empty = RUNNER.invoke(app, ["exposures", "--db", str(sglang)])
    assert empty.exit_code == 0
    assert empty.stdout == f"no exposures in the case (what the logs show: kvforensics findings --db {sglang})\n"
    with forensics.Case(pages, read_only=True) as case:
        frame = case.exposures()
    as_csv = RUNNER.invoke(app, ["exposures", "--db", str(pages), "--format", "csv"])
    assert as_csv.stdout == frame.write_csv()
    as_json = RUNNER.invoke(app, ["exposures", "--db", str(pages), "--format", "json"])
    assert json.loads(as_json.stdout) == json.loads(json.dumps(frame.to_dicts(), default=str))
    assert (RUNNER.invoke(app, ["findings", "--db", str(sglang), "--json"]).stdout
            == RUNNER.invoke(app, ["findings", "--db", str(sglang), "--format", "json"]).stdout)
    rows = RUNNER.invoke(app, ["findings", "--db", str(sglang), "--format", "csv"]).stdout.splitlines()
    assert rows[0] == "severity,id,count,title" and len(rows) == 7
    request = json.loads(RUNNER.invoke(app, ["request", "r", "--db", str(pages), "--format", "json"]).stdout)
    assert request["request_id"] == "r" and len(request["saw"]) == 1 and len(request["pages"]) == 4


def test_each_kind_of_disagreement_is_said_with_what_it_means(told: dict[tuple[str, int], tuple[Path, str]]) -> None:
    """The SGLang 0.5.19 run's decode retracted a request, which the replay does not model: investigate
    says the kind, how many, and what it means for the victims there (replay.engine.DISAGREEMENTS), so
    an operator need not look it up; page records alone, with nothing disagreeing, say nothing of it."""
    _, said = told["sglang", 160]
    text = " ".join(said.split())
    # (its finish's count, and the scheduler's line: two)
    assert ("decode_retracted (2): SGLang's decode retracted running requests under memory pressure (a finish says "
            "how many times: SGLang's num_retractions; the scheduler's line says when: \"KV cache pool is full. "
            "Retract requests.\")") in text
    assert ("the victims of a reader that took its pages from the first retraction on (its line, or the retracted "
            "request's join of the batch) are possible") in text
    assert "decode_retracted" not in told["pages", 160][1]
