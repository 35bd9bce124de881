"""SGLang adapter line rate on a million-line log in the current format, against DuckDB reading it raw.

Run: python bench/bench_sglang_lines.py [--lines 1000000] [--release 0.5.23] [--form text|json] [--repeat 3]

The log is built from a release fixture's prefill server log (tests/adapters/releases/: lines
printed by that release's own code): its request block (request log, time stats, length and
context rejections, transfer failures, uvicorn access lines, batch statistics) repeated with
fresh request ids, bootstrap rooms and times until it holds --lines lines. The fixture's
bootstrap failure is left out of the block: its prefill lines come 300 s after the rest. Timed per round, in
one process: DuckDB ``read_csv`` of the file as raw lines (the baseline: reading the bytes and
splitting the lines), the adapter alone (both passes over the lines, no database), and the
whole ``forensics.ingest`` of the file. Prints lines per second and the ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

import forensics
from forensics.adapters import Notes, Options
from forensics.adapters.sglang import ADAPTERS

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "adapters" / "releases"
_TIME = re.compile(r"2026-11-02[ T]08:0(\d):(\d\d)")
#: the fixture's request whose bootstrap times out (its lines, and the warning the timeout prints)
_LEFT_OUT = ("req-boot", "Some requests timed out when bootstrapping")


def build(out: Path, lines: int, release: str, form: str) -> int:
    """Write the log; return its line count."""
    source = (FIXTURES / release / form / "prefill-0.log").read_text().splitlines()
    head = [t for t in source if "Receive" not in t and "req-" not in t][:8]  # start-up lines
    block = [t for t in source if t not in head and not any(x in t for x in _LEFT_OUT)]
    rids = sorted(set(re.findall(r"req-[a-z0-9]+", "\n".join(block))), key=len, reverse=True)
    written = 0
    base = dt.datetime(2026, 11, 2, 8, 0, 0)
    with out.open("w") as fh:
        for t in head:
            fh.write(t + "\n")
            written += 1
        n = 0
        while written < lines:
            when = base + dt.timedelta(seconds=20 * n)
            text = "\n".join(block)
            for rid in rids:
                text = text.replace(rid, f"{rid}-{n}")
            text = re.sub(r"(bootstrap_room[=:]\s?'?)(\d+)",
                          lambda m, n=n: f"{m.group(1)}{int(m.group(2)) + n * 97}", text)
            text = _TIME.sub(lambda m, when=when: (when + dt.timedelta(seconds=_offset(m))).strftime(
                "%Y-%m-%d %H:%M:%S" if " " in m.group(0) else "%Y-%m-%dT%H:%M:%S"), text)
            fh.write(text + "\n")
            written += len(block)
            n += 1
    return written


def _offset(m: re.Match[str]) -> int:
    """A fixture time's seconds into the block: past the requests (the final batch line, printed
    after the bootstrap failure's 300 s) it is the block's last second."""
    return min(60 * int(m.group(1)) + int(m.group(2)), 19)


def adapter_only(path: Path) -> int:
    """Both passes of the adapter over the file's lines; the number of lines read."""
    adapter = next(a for a in ADAPTERS if a.name == "sglang-server")
    assert adapter.translate is not None

    def lines():  # type: ignore[no-untyped-def]
        with path.open() as fh:
            for n, t in enumerate(fh, 1):
                if not t.isspace():  # (as forensics.ingestion.readers.text_lines: blank lines left out)
                    yield n, t.rstrip("\n")

    count = 0
    for _ in adapter.translate(lines, path, Options(), Notes()):
        count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--form", default="text", choices=("text", "json"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        log = root / "prefill-0.log"
        n = build(log, args.lines, args.release, args.form)
        size = log.stat().st_size
        raw, alone, ingest = [], [], []
        for r in range(args.repeat):
            t = time.perf_counter()
            con = duckdb.connect()
            got = con.execute("SELECT count(*) FROM read_csv(?, columns={'line': 'VARCHAR'}, delim=chr(1), "
                              "quote='', escape='', header=false, auto_detect=false)", [str(log)]).fetchone()
            con.close()
            raw.append(time.perf_counter() - t)
            assert got is not None and got[0] == n
            t = time.perf_counter()
            assert adapter_only(log) == n
            alone.append(time.perf_counter() - t)
            t = time.perf_counter()
            result = forensics.ingest([log], root / f"case{r}.duckdb")
            ingest.append(time.perf_counter() - t)
            assert result.records.quarantined == 0
        raw_s, alone_s, ingest_s = (statistics.median(x) for x in (raw, alone, ingest))
        print(f"SGLang {args.release} {args.form} prefill log: {n:,} lines, {size / 2**20:,.0f} MiB, "
              f"{result.records.read:,} records")
        print(f"DuckDB raw lines:  {raw_s:6.2f} s  {n / raw_s:12,.0f} lines/s")
        print(f"adapter alone:     {alone_s:6.2f} s  {n / alone_s:12,.0f} lines/s  ({alone_s / raw_s:.1f}x raw)")
        print(f"forensics.ingest:  {ingest_s:6.2f} s  {n / ingest_s:12,.0f} lines/s  ({ingest_s / raw_s:.1f}x raw)")
        if args.repeat > 1:  # (the spread: this machine's other core is not always free)
            for name, times in (("adapter alone", alone), ("forensics.ingest", ingest)):
                print(f"  rounds, {name}: " + ", ".join(f"{n / t:,.0f}" for t in times) + " lines/s")


if __name__ == "__main__":
    main()
