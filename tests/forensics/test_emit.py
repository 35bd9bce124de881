"""forensics.emit: the instrumentation kit's records ingest cleanly and give exact exposures."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from itertools import count
from pathlib import Path

import pytest

import forensics
from forensics.emit import Emitter, page_string


def _clock() -> object:
    ticks = count(1_757_836_800_000_000_000, 1_000)
    return lambda: next(ticks)


def test_records_from_many_threads_are_numbered_once_each_and_ingest_cleanly(tmp_path: Path) -> None:
    log = Emitter(tmp_path, "decode-0", max_bytes=20_000, clock=_clock())  # type: ignore[arg-type]
    log.config(role="decode", engine="sglang", engine_version="0.5.21", model="m", context_length=4096,
               page_size=16, pool_pages=4096)

    def work(t: int) -> None:
        for i in range(250):
            rid = f"r{t}-{i}"
            log.request(rid, "admitted")
            log.kv(rid, "alloc", [t * 500 + 2 * i, t * 500 + 2 * i + 1])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    log.close()
    files = log.files
    assert len(files) > 1  # rotated by size
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines()]
    assert sorted(r["seq"] for r in lines) == list(range(1 + 8 * 250 * 2))
    assert {r["boot"] for r in lines} == {0}
    result = forensics.ingest([tmp_path], tmp_path / "case.duckdb")
    assert (result.records.read, result.records.ingested, result.records.quarantined) == (4001, 4001, 0)


def test_each_new_emitter_of_a_node_is_a_new_boot(tmp_path: Path) -> None:
    with Emitter(tmp_path, "prefill-1") as a:
        a.request("r", "admitted")
    with Emitter(tmp_path, "prefill-1") as b:
        b.request("r2", "admitted")
    assert (a.boot, b.boot, b.seq) == (0, 1, 1)
    with Emitter(tmp_path, "prefill-1", boot=7) as c:
        assert c.boot == 7


def test_emitted_pages_give_the_exposure_the_spec_defines(tmp_path: Path) -> None:
    """A writes pages 1-3 and frees them; B takes them and reads without writing: B saw A's content."""
    with Emitter(tmp_path, "decode-0", clock=_clock()) as log:  # type: ignore[arg-type]
        log.config(role="decode", engine="e", engine_version="1", model="m", context_length=1024, page_size=1,
                   pool_pages=16)
        log.request("A", "received", tenant_id="t1", prompt_tokens=3)
        log.request("B", "received", tenant_id="t2", prompt_tokens=3)
        log.kv("A", "alloc", "1-3")
        log.kv("A", "write", [1, 2, 3], source="compute")
        log.kv("A", "free", "1-3")
        log.kv("B", "alloc", range(1, 4))
        log.transfer("x", "B", "completed", src_node="prefill-0", dst_node="decode-0", tokens=1)
        log.kv("B", "write", [1], source="transfer")
        log.kv("B", "read", "1-3")
        log.request("B", "finished", status=200)
    figures = forensics.investigate([tmp_path], tmp_path / "case.duckdb").exposure
    assert (figures["exposed_responses"], figures["exposure_pairs"], figures["exposed_page_reads"],
            figures["cross_tenant_pairs"]) == (1, 1, 2, 1)


def test_bad_arguments_fail_at_the_call_not_in_the_case(tmp_path: Path) -> None:
    log = Emitter(tmp_path, "n")
    with pytest.raises(ValueError, match="unknown op"):
        log.kv("r", "evict", "1")
    with pytest.raises(ValueError, match="never empty"):
        log.kv("r", "alloc", [])
    with pytest.raises(ValueError, match="unknown request event"):
        log.request("r", "done")
    assert page_string([9, 3, 1, 2, 8]) == "1-3,8-9"
    assert page_string("0-63") == "0-63"


def test_importing_the_emitter_loads_only_the_standard_library() -> None:
    code = ("import sys, forensics.emit; "
            "print(sorted(m for m in ('duckdb', 'polars', 'pyarrow', 'numpy', 'typer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_names_stay_the_api_whatever_was_imported_first() -> None:
    code = ("import importlib, pkgutil, forensics; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(forensics.__path__, 'forensics.')]; "
            "print(all(callable(getattr(forensics, n)) for n in forensics.__all__ if n != '__version__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
