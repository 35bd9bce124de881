"""Every bound a bound (issue #44 item 2): what the ingest accepts, the replay handles, its
memory following the pages used and not the pool's size (a config may say 2^40 pages)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np

from replay.pool import PagePool

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "fixtures" / "examples" / "placeholder"
#: The largest pool the ingest accepts (schema.PLAUSIBLE_COUNT) and its last page id (13 digits).
LARGEST = 2**40


def test_a_pool_of_2_to_the_40_pages_costs_what_its_pages_in_use_cost() -> None:
    """Allocations, releases and merges on the largest pool: the pages handed out are those of a
    small pool, and the memory traced stays under a MiB."""
    small, large = PagePool(4096), PagePool(LARGEST)
    tracemalloc.start()
    try:
        for pool in (small, large):
            held = [pool.alloc(n) for n in (3, 50, 7, 200)]
            pool.release(held[1])
            pool.release(held[0])
            pool.merge_and_sort_free()
            held.append(pool.alloc_decode(2, 5))
            held.extend(pool.alloc_extend([4, 60], 64 * 64, 64) or [])
            pool.check([h for i, h in enumerate(held) if i > 1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert large.available == LARGEST - 1 - (small.pool_pages - 1 - small.available)
    assert np.array_equal(large.free_list(100), small.free_list()[:100])
    assert large.free_count == LARGEST - large.fresh + len(small.free_list()) - (small.pool_pages - small.fresh)
    assert np.array_equal(small.free_list(100), small.free_list()[:100])
    assert len(small.free_list(10**6)) == small.free_count


def _peak_mib(args: list[str], stdout: Path) -> tuple[int, float]:
    """Exit code and peak resident memory (MiB) of ``kvforensics ARGS`` run alone, its output
    into ``stdout``."""
    code = (
        "import resource, subprocess, sys\n"
        f"with open({str(stdout)!r}, 'w') as out:\n"
        f"    rc = subprocess.run([{str(Path(sys.executable).with_name('kvforensics'))!r}, *sys.argv[1:]], "
        "stdout=out, stderr=subprocess.PIPE).returncode\n"
        "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    rc, mib = out.stdout.split()
    return int(rc), float(mib)


def _example_with_pool(folder: Path, pool_pages: int) -> Path:
    folder.mkdir(parents=True)
    lines = []
    for line in (EXAMPLE / "events.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "config":
            rec["pool_pages"] = pool_pages
        lines.append(json.dumps(rec))
    (folder / "events.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_whole_job_on_the_largest_pool_runs_in_the_memory_of_a_small_one(tmp_path: Path) -> None:
    """The incident in miniature with its decode pool said to hold 2^40 pages: investigate, the
    replays and the report finish (as on 16 pages), the figures from the page logs the same, and
    the peak memory within 100 MiB of the small pool's (it was an array of every page id: 8 TiB)."""
    runs = {}
    for pool in (16, LARGEST):
        logs = _example_with_pool(tmp_path / str(pool) / "logs", pool)
        db, out = tmp_path / str(pool) / "case.duckdb", tmp_path / str(pool) / "report.html"
        printed = tmp_path / str(pool) / "out.json"
        rc, mib = _peak_mib(["investigate", str(logs), "--db", str(db), "--out", str(out), "--json"], printed)
        assert rc in (0, 7), rc  # (7: the replay disagreed with the logs, said and listed)
        assert out.is_file()
        runs[pool] = (mib, json.loads(printed.read_text()))
    want = json.loads((EXAMPLE / "expected.json").read_text())["exposure"]
    for pool, (_, summary) in runs.items():
        assert {k: summary["exposure"][k] for k in want} == want, pool
    assert runs[LARGEST][0] < runs[16][0] + 100, {p: mib for p, (mib, _) in runs.items()}


def test_a_page_id_of_13_digits_is_a_page_id(tmp_path: Path) -> None:
    """The last page of the largest pool, 2^40 - 1, is read as a page (it was quarantined as not
    a list of page ranges) and one beyond the pool's is quarantined as beyond it."""
    import forensics

    logs = _example_with_pool(tmp_path / "logs", LARGEST)
    last = LARGEST - 1
    extra = [{"kind": "kv", "ts": "2026-08-27T10:00:01.000000Z", "node": "decode-0", "seq": 100 + i,
              "request_id": "z", "op": op, "pages": pages}
             for i, (op, pages) in enumerate([("alloc", f"{last - 5}-{last}"), ("free", f"{last - 5}-{last}"),
                                              ("alloc", f"{last + 1}")])]
    with (logs / "events.jsonl").open("a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in extra)
    inv = forensics.investigate([logs], tmp_path / "case.duckdb")
    with forensics.Case(tmp_path / "case.duckdb", read_only=True) as case:
        reasons = case.sql("SELECT reason, count(*) AS n FROM quarantine GROUP BY ALL").to_dicts()
        top = case.sql("SELECT max(max_page) AS m FROM kv_records").to_dicts()
    assert reasons == [{"reason": "page_out_of_range", "n": 1}]
    assert top == [{"m": last}]
    assert inv.ingest.records.quarantined == 1

