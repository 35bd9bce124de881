"""docs/notebook.md's Python block (the README's, before it became a front page) runs against the
sample incident, and its ids are the sample's (issue #45: it named ids the sample does not have,
so it returned nothing or raised)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl
import pytest

import forensics

ROOT = Path(__file__).resolve().parents[2]


def test_the_notebook_page_python_block_runs_on_the_sample_and_finds_what_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "notebook.md").read_text(), re.S)
                if "sample_logs/" in b]
    (tmp_path / "sample_logs").symlink_to(ROOT / "sample_logs")
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(tmp_path)
    lines = block.strip().splitlines()
    scope: dict[str, object] = {}
    exec(compile("\n".join(lines[:3]), "notebook.md", "exec"), scope)  # noqa: S102 (the page's own code)
    shown = [eval(compile(line.split("#")[0].strip(), "notebook.md", "eval"), scope)  # noqa: S307
             for line in lines[3:]]
    summary, exposures, seen_by, timeline, findings, not_known = shown
    assert summary["exposed_responses"] > 0
    # (the sample's logs are whole: no request is left unknown, and the frame has its columns)
    assert isinstance(not_known, pl.DataFrame) and not_known.height == 0
    assert not_known.columns == ["request_id", "tenant_id", "node", "delivered", "what"]
    assert isinstance(exposures, pl.DataFrame) and exposures.height > 0
    assert seen_by.height > 0 and timeline.height > 0 and len(findings) > 0
    assert isinstance(scope["case"], forensics.Case) and os.path.exists("out/notebook-case.duckdb")
