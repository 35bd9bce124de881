"""docs/investigation.ipynb runs top to bottom on the sample incident, and is stored clean."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "docs" / "investigation.ipynb"


def test_the_notebook_is_stored_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert len(code) >= 8
    assert all(not c.outputs and c.execution_count is None for c in code)


def test_the_notebook_runs_every_cell_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run top to bottom from a folder outside the checkout (a copy of the notebook opened
    elsewhere): it finds the sample through the installed package."""
    monkeypatch.setenv("KVF_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert not any((p / "sample_logs").is_dir() for p in [elsewhere, *elsewhere.parents])
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(elsewhere)}})
    client.execute(env=dict(os.environ))  # a failing cell raises CellExecutionError
    html = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if "text/html" in o.get("data", {})]
    assert any("exposed_responses" in o["data"]["text/html"] for o in html)  # the summary's table
    assert any("handoff.rejected_but_transferred" in o["data"]["text/html"] for o in html)  # findings
    assert (tmp_path / "report.html").is_file()
