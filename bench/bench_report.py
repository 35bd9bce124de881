"""The report of a large case: how long it takes, how much memory, how big it is, how fast it opens.

Run: python bench/bench_report.py --db CASE.duckdb
     (a case of 5.12 million records: python bench/generate.py --out logs --requests 640000, then
     kvforensics investigate logs --db CASE.duckdb --no-replay)

Writes the internal report in a child process (its peak resident memory read from
``/usr/bin/time -v``), prints its size and its lists', then opens it in headless Chromium three
times (the DevTools pipe of tests/reports/cdp.py, network blocked) and prints the time from
navigation to the load event and the layout of the whole page; the baseline is the shipped
sample's report, opened the same way in the same run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def opened(page: Path) -> float:
    """Seconds from navigating to ``page`` to its load event and the layout of the whole page."""
    sys.path.insert(0, str(ROOT / "tests" / "reports"))
    from cdp import browser, offline  # (the tests' DevTools pipe)

    with browser() as (cdp, session):
        cdp.send("Page.enable", session=session)
        offline(cdp, session)
        t = time.perf_counter()
        cdp.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        cdp.wait_for("Page.loadEventFired")
        cdp.send("Runtime.evaluate", {"expression": "document.body.scrollHeight"}, session=session)
        return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--sample", type=Path, default=ROOT / "out" / "sample-report.html",
                        help="the baseline report (scripts/investigate-sample.sh writes it)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        t = time.perf_counter()
        command = [str(Path(sys.executable).parent / "kvforensics"), "report", "--db", str(args.db), "--out",
                   str(out), "--generated-at", "2026-12-01T00:00:00Z"]
        done = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True, check=True)
        wall = time.perf_counter() - t
        peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))  # type: ignore[union-attr]
        lists = sorted((out.parent / "report-lists").iterdir())
        print(f"report: {wall:.1f} s, peak {peak / 2**20:.2f} GiB, {out.stat().st_size:,} bytes of HTML; lists "
              + ", ".join(f"{p.name} {p.stat().st_size:,}" for p in lists))
        for label, page in (("sample report", args.sample), ("this report", out)):
            if page.exists():
                times = [opened(page) for _ in range(3)]
                print(f"{label}: opens in {', '.join(f'{x:.2f}' for x in times)} s (navigation to load and layout)")


if __name__ == "__main__":
    main()
