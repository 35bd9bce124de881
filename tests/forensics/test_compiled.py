"""A first run says what it will compile: a part is uncached until an index newer than its source
is beside it."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from forensics import compiled


def test_a_part_is_uncached_until_its_index_is_newer_than_its_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "kvf_probe.py").write_text("def walk():\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kvf_probe", raising=False)
    monkeypatch.setitem(compiled.PARTS, "probe", ("the probe", "kvf_probe", "walk", 3))
    assert compiled.waits("probe") == ["compiling the probe for this machine, once per install (about 3 s)"]
    index = tmp_path / "__pycache__" / "kvf_probe.walk-1.py311.nbi"
    index.parent.mkdir()
    index.write_bytes(b"")
    os.utime(index, (1, 1))  # older than the source: stale
    assert compiled.uncached("probe")
    with caplog.at_level(logging.INFO, logger="forensics.compiled"):
        compiled.announce("probe")
    assert caplog.messages == ["compiling the probe for this machine, once per install (about 3 s)"]
    os.utime(index)
    assert not compiled.uncached("probe") and compiled.waits("probe") == []
