"""The CLI reference (docs/cli.md), generated from the commands' own help.

Regenerate with ``python -m kvforensics.reference > docs/cli.md``; a test fails when the
file is out of date.
"""

from __future__ import annotations

from typer.testing import CliRunner

from kvforensics.cli import app

#: A fixed terminal, so the help text wraps the same everywhere.
HELP_ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", "_TYPER_FORCE_DISABLE_TERMINAL": "1"}


def commands() -> list[str]:
    """The commands' names, in the order the CLI lists them."""
    return [c.name or c.callback.__name__ for c in app.registered_commands if c.callback]


def help_text(args: list[str]) -> str:
    """The help of ``kvforensics ARGS`` on a fixed terminal."""
    result = CliRunner().invoke(app, [*args, "--help"], env=HELP_ENV, prog_name="kvforensics")
    if result.exit_code != 0:
        raise RuntimeError(f"kvforensics {' '.join(args)} --help failed: {result.output}")
    return "\n".join(line.rstrip() for line in result.output.strip().splitlines())


def render() -> str:
    """docs/cli.md: every command's help."""
    parts = [
        "# kvforensics command reference",
        "",
        "Generated from the commands' own `--help` by `python -m kvforensics.reference > docs/cli.md`;",
        "`tests/kvforensics/test_reference.py` fails when this file is out of date.",
        "",
        "```text",
        help_text([]),
        "```",
    ]
    for name in commands():
        parts += ["", f"## kvforensics {name}", "", "```text", help_text([name]), "```"]
    return "\n".join(parts) + "\n"


if __name__ == "__main__":
    print(render(), end="")
