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
import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "reports"))

from cdp import _Pipe  # noqa: E402


def opened(page: Path) -> float:
    """Seconds from navigating to ``page`` to its load event and the layout of the whole page."""
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()

    def fds() -> None:
        high_r = fcntl.fcntl(to_r, fcntl.F_DUPFD, 10)
        high_w = fcntl.fcntl(from_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             f"--user-data-dir={profile}", "--window-size=1100,1400", "about:blank"],
            pass_fds=(3, 4, to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        pipe = _Pipe(proc, to_w, from_r)
        try:
            target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            pipe.send("Page.enable", session=session)
            pipe.send("Network.emulateNetworkConditions", {"offline": True, "latency": 0, "downloadThroughput": 0,
                                                           "uploadThroughput": 0}, session=session)
            t = time.perf_counter()
            pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
            pipe.wait_for("Page.loadEventFired")
            pipe.send("Runtime.evaluate", {"expression": "document.body.scrollHeight"}, session=session)
            return time.perf_counter() - t
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            os.close(to_w)
            os.close(from_r)


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
