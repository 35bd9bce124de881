"""The README is a front page (issue #46 item 5): under 100 lines, and every command it shows is
run as written: the tour here, on the main job's case; the SGLang sample's investigation is
docs/adapters.md's command, word for word, which test_docs_snippets.py runs (checked here); the
two commands themselves are what .ci/run and a new user run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvforensics.cli import app

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _commands() -> list[list[str]]:
    """Each command of the README's ``sh`` blocks, as its argv."""
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    return [shlex.split(line) for block in blocks for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_readme_is_a_front_page_that_links_what_it_leaves_out() -> None:
    assert len(README.splitlines()) < 100
    for link in re.findall(r"\]\(([^)#]+)", README):
        assert (ROOT / link).exists(), link
    assert "bash scripts/investigate-sample.sh" in README and "bash scripts/test.sh" in README
    assert (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1].endswith("bash scripts/test.sh")


def test_the_readme_investigates_the_sglang_sample_as_the_adapters_page_does() -> None:
    """(So test_docs_snippets.py's run of that page's command runs the README's, as written.)"""
    (page,) = re.findall(r"```sh\n(.*?)```", (ROOT / "docs" / "adapters.md").read_text(), re.S)
    assert _commands()[-1] == shlex.split(page.replace("\\\n", " "))


def test_every_tour_command_the_readme_shows_runs_as_written(
        sample_case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the main job's case (the sample incident investigated, as scripts/investigate-sample.sh
    makes it: conftest's sample_case, where the tour looks for it), from the repo's root as the
    README's reader stands: each ends 0 and says something; the report is written."""
    (tmp_path / "sample_logs").symlink_to(ROOT / "sample_logs")
    (tmp_path / "out").mkdir()
    sample_case.rename(tmp_path / "out" / "sample-case.duckdb")
    monkeypatch.chdir(tmp_path)
    *commands, sglang = _commands()
    assert [argv[1] for argv in commands] == ["findings", "exposures", "request", "page", "report"]
    assert sglang[1] == "investigate"
    runner = CliRunner()
    for argv in commands:
        assert argv[0] == "kvforensics"
        result = runner.invoke(app, argv[1:], env={"COLUMNS": "100"})
        assert result.exit_code == 0, (argv, result.output)
        assert result.stdout.strip(), argv
        if "--out" in argv:
            assert (tmp_path / argv[argv.index("--out") + 1]).is_file(), argv
    exposures = runner.invoke(app, commands[1][1:], env={"COLUMNS": "100"}).stdout
    assert "tenant-01" in exposures and "certain" in exposures
