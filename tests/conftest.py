"""Shared fixtures: tiny log sets and fresh cases."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

#: The spec's examples, when ../shared is beside the checkout (it is in CI).
SHARED = Path(__file__).resolve().parents[2] / "shared"
SPEC_EXAMPLES = SHARED / "spec" / "examples"
#: The project's own copy of the spec examples, so the suite means something without ../shared.
FIXTURES = Path(__file__).parent / "fixtures"


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r) + "\n")
    return path


def example_dirs() -> list[Path]:
    """Example log sets: ../shared's when present, the project's fixtures always."""
    dirs = sorted(p for p in (FIXTURES / "examples").iterdir() if p.is_dir())
    if SPEC_EXAMPLES.is_dir():
        dirs += sorted(p for p in SPEC_EXAMPLES.iterdir() if p.is_dir())
    return dirs


@pytest.fixture
def case_path(tmp_path: Path) -> Path:
    return tmp_path / "case.duckdb"
