"""docs/cli.md is the commands' own help, and stays so."""

from __future__ import annotations

from pathlib import Path

from kvforensics.reference import commands, help_text, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_the_cli_reference_is_up_to_date() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/cli.md is out of date: run python -m kvforensics.reference > docs/cli.md"
    )


def test_every_command_and_option_has_help_text() -> None:
    for name in commands():
        text = help_text([name])
        summary = text.split("\n\n")[1].strip()
        assert len(summary) > 20, name
        for line in text.splitlines():
            if line.lstrip("│ *").startswith("--"):
                assert len(line.split(">", 1)[-1].strip(" │")) > 5, (name, line)
