"""The docs' own snippets run (issue #45 item 5): docs/adapters.md's command on the SGLang sample,
as written, and docs/emit.md's Python block into a folder the ingest then reads. (docs/cli.md is
the commands' own help: tests/kvforensics/test_reference.py; docs/notebook.md's Python block:
test_notebook_page.py; the README's commands: test_readme.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from conftest import CommandRun

import forensics

ROOT = Path(__file__).resolve().parents[2]


def _blocks(doc: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (ROOT / "docs" / doc).read_text(), re.S)


def test_the_adapters_page_command_investigates_the_sglang_sample_as_written(adapters_page_run: CommandRun) -> None:
    """(Run once a session, as written, from a folder beside sample_logs: conftest.adapters_page_run.)"""
    (block,) = _blocks("adapters.md", "sh")
    argv = shlex.split(block.replace("\\\n", " "))
    assert argv[:2] == ["kvforensics", "investigate"] and any("sample_logs/" in a for a in argv)
    assert adapters_page_run.argv == argv
    folder, result = adapters_page_run.folder, adapters_page_run.result
    assert result.exit_code == 0, result.output
    assert "verdict: Exposed: 9 delivered responses" in " ".join(result.stdout.split())
    out = argv[argv.index("--out") + 1]
    assert (folder / out).is_file()
    with forensics.Case(folder / argv[argv.index("--db") + 1], read_only=True) as case:
        tenants = case.sql("SELECT count(DISTINCT tenant_id) AS n FROM request_events WHERE tenant_id IS NOT NULL")
    assert tenants["n"][0] == 12  # (the tenant map was read)


def test_the_emit_page_block_writes_what_the_ingest_reads(tmp_path: Path) -> None:
    (block,) = _blocks("emit.md", "python")
    assert '"/var/log/kvforensics"' in block
    scope: dict[str, object] = {}
    exec(compile(block.replace('"/var/log/kvforensics"', repr(str(tmp_path / "kv"))), "emit.md", "exec"),  # noqa: S102
         scope)
    scope["kv_log"].close()  # type: ignore[attr-defined]
    found = forensics.investigate([tmp_path / "kv"], tmp_path / "case.duckdb").ingest
    assert (found.records.ingested, found.records.quarantined) == (1, 0)
    with forensics.Case(tmp_path / "case.duckdb", read_only=True) as case:
        config = case.sql("SELECT node, role, pool_pages FROM configs").row(0)
    assert config == ("decode-3", "decode", 32_769)
