"""The misuse campaign of issue #22, re-runnable: every case through the installed ``kvforensics``
command, each in a fresh folder, each with a time limit; prints per case its exit code, whether
a traceback showed, its peak memory, and whether what it must do held.

    .venv/bin/python scripts/misuse_campaign.py [--big]      # --big: the multi-GB bombs too

Exit 0 when every case held. Nothing here writes outside its temporary folder.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_logs" / "glm53-incident"
SGLANG = ROOT / "sample_logs" / "glm53-incident-sglang"
KVF = str(Path(sys.executable).with_name("kvforensics"))
TIMEOUT = 300
TS = "2026-09-14T08:00:00Z"


@dataclass
class Run:
    code: int | None  # None: killed at the time limit
    out: bytes
    err: bytes
    peak_mb: float
    seconds: float

    @property
    def text(self) -> str:
        return (self.out + self.err).decode("utf-8", "replace")


def kvf(*args: str | Path, cwd: Path, via: list[str] | None = None, preexec: Callable[[], None] | None = None,
        stop: tuple[float, signal.Signals] | None = None) -> Run:
    """``kvforensics ARGS`` (``via``: run by another command, as ``python -c SCRIPT``); ``preexec``
    runs in the child before it starts, ``stop`` is a signal sent after so many seconds."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([*(via or [KVF]), *map(str, args)], cwd=cwd, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL, preexec_fn=preexec)
        deadline = start + TIMEOUT
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if stop is not None and time.monotonic() > start + stop[0]:
                proc.send_signal(stop[1])
                stop = None
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                status = -1
                break
            time.sleep(0.02)
        proc.returncode = 0  # reaped by wait4
        out.seek(0)
        err.seek(0)
        code = None if status == -1 else os.waitstatus_to_exitcode(status)
        return Run(code, out.read(), err.read(), usage.ru_maxrss / 1024, time.monotonic() - start)


def config(node: str = "decode-0", **changes: object) -> dict[str, object]:
    return {"kind": "config", "ts": TS, "node": node, "seq": 0, "role": "decode", "engine": "e",
            "engine_version": "1", "model": "m", "context_length": 1024, "page_size": 16, "pool_pages": 64,
            **changes}


def jsonl(path: Path, records: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def zeros(path: Path, size: int, how: str) -> Path:
    chunk = b"\0" * (16 << 20)
    if how == "zstd":
        with path.open("wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as w:
            for _ in range(size // len(chunk)):
                w.write(chunk)
    elif how == "gzip":
        with gzip.open(path, "wb", compresslevel=1) as fh:
            for _ in range(size // len(chunk)):
                fh.write(chunk)
    else:
        with path.open("wb") as fh:
            for _ in range(size // len(chunk)):
                fh.write(chunk)
    return path


Case = Callable[[Path], tuple[Run, bool]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


@case
def db_is_a_log(d: Path) -> tuple[Run, bool]:
    logs = Path(shutil.copytree(SAMPLE, d / "logs"))
    before = (logs / "router.jsonl").read_bytes()
    r = kvf("investigate", logs, "--db", logs / "router.jsonl", cwd=d)
    return r, r.code == 1 and (logs / "router.jsonl").read_bytes() == before and "exposed" not in r.text


@case
def db_is_another_database(d: Path) -> tuple[Run, bool]:
    import duckdb

    con = duckdb.connect(str(d / "other.duckdb"))
    con.execute("CREATE TABLE mine (a INTEGER)")
    con.close()
    r = kvf("ingest", SAMPLE / "router.jsonl", "--db", d / "other.duckdb", cwd=d)
    con = duckdb.connect(str(d / "other.duckdb"), read_only=True)
    tables = con.execute("SELECT count(*) FROM duckdb_tables()").fetchone()
    con.close()
    return r, r.code == 1 and tables == (1,)


@case
def db_in_a_missing_folder(d: Path) -> tuple[Run, bool]:
    r = kvf("ingest", SAMPLE / "router.jsonl", "--db", d / "out" / "x.duckdb", cwd=d)
    return r, r.code == 0 and (d / "out" / "x.duckdb").is_file()


@case
def deep_json_first_line(d: Path) -> tuple[Run, bool]:
    (d / "a.jsonl").write_text("[" * 1000 + "NaN" + "]" * 1000 + "\n" + json.dumps(config()) + "\n"
                               + '{"a": ' + "[" * 1000 + "1," + "]" * 1000 + "}\n")
    r = kvf("ingest", d / "a.jsonl", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "3 read, 1 ingested, 0 duplicates, 2 quarantined" in r.text


@case
def deep_sglang_request(d: Path) -> tuple[Run, bool]:
    lines = gzip.decompress((SGLANG / "prefill-0.log.gz").read_bytes()).decode().splitlines()
    hits = [i for i, line in enumerate(lines) if "Receive:" in line][:2]
    deep, chained = "[" * 5000 + "]" * 5000, "+".join(["1"] * 50_000)
    lines[hits[0]] = lines[hits[0]].replace("sampling_params={", f"sampling_params={{'x': {deep}, ")
    lines[hits[1]] = lines[hits[1]].replace("sampling_params={", f"sampling_params={{'x': {chained}, ")
    (d / "prefill-0.log").write_text("\n".join(lines) + "\n")
    r = kvf("ingest", d / "prefill-0.log", "--db", d / "c.duckdb", "--role", "prefill", cwd=d)
    # The adapter reads a request line by its fields' patterns, never sampling_params' value: the
    # two lines are read as their requests (they were quarantined when it parsed the whole repr).
    rids = [re.search(r"rid='([^']+)'", lines[i]).group(1) for i in hits]  # type: ignore[union-attr]
    found = kvf("sql", "--db", d / "c.duckdb", "--format", "csv", "SELECT DISTINCT request_id FROM request_records "
                f"WHERE request_id IN ('{rids[0]}', '{rids[1]}') ORDER BY 1", cwd=d)
    counts = re.search(r"total: ([\d,]+) read = ([\d,]+) ingested \+ ([\d,]+) duplicates \+ ([\d,]+) quarantined",
                       r.text)
    added = counts is not None and int(counts[1].replace(",", "")) == sum(int(counts[k].replace(",", ""))
                                                                         for k in (2, 3, 4))
    return r, r.code == 0 and added and found.out.decode().split() == ["request_id", *sorted(rids)]


@case
def zstd_bomb(d: Path) -> tuple[Run, bool]:
    zeros(d / "z.jsonl.zst", 5 << 30 if BIG else 1 << 30, "zstd")
    r = kvf("ingest", d / "z.jsonl.zst", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 6 and "decompression bomb" in r.text


@case
def gzip_of_zeros(d: Path) -> tuple[Run, bool]:
    zeros(d / "z.jsonl.gz", 5 << 30 if BIG else 1 << 30, "gzip")
    r = kvf("ingest", d / "z.jsonl.gz", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "1 quarantined" in r.text


@case
def one_line_without_newline(d: Path) -> tuple[Run, bool]:
    zeros(d / "z.jsonl", 1 << 30, "none")
    r = kvf("ingest", d / "z.jsonl", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "1 quarantined" in r.text


@case
def parquet_of_odd_types(d: Path) -> tuple[Run, bool]:
    import datetime as dt
    import decimal

    pq.write_table(pa.table({
        "kind": ["config"], "ts": [TS], "node": ["a"], "blob": pa.array([b"\xff"], pa.binary()),
        "dec": pa.array([decimal.Decimal("1.5")], pa.decimal128(4, 1)), "day": pa.array([dt.date(2026, 9, 14)]),
        "took": pa.array([dt.timedelta(seconds=3)], pa.duration("s")),
    }), d / "a.parquet")
    r = kvf("ingest", d / "a.parquet", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "1 read" in r.text


@case
def non_utf8_name_in_a_folder(d: Path) -> tuple[Run, bool]:
    logs = d / "logs"
    jsonl(logs / os.fsdecode(b"bad\xff.jsonl"), [config()])
    jsonl(logs / "good.jsonl", [config("b")])
    r = kvf("ingest", logs, "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "2 ingested" in r.text and "bad\\xff.jsonl" in r.text


@case
def values_that_break_analyses(d: Path) -> tuple[Run, bool]:
    log = jsonl(d / "a.jsonl", [config("a", ts="0000-01-01T00:00:00Z"), config("b", ts="0001-01-01T00:00:00+14:00"),
                                config("c", pool_pages=2**63 - 1), config("d", role="prefill")])
    runs = [kvf("investigate", log, "--db", d / "c.duckdb", cwd=d), kvf("findings", "--db", d / "c.duckdb", cwd=d),
            kvf("report", "--db", d / "c.duckdb", "--out", d / "r.html", cwd=d),
            kvf("replay", "--db", d / "c.duckdb", cwd=d)]
    worst = max(runs, key=lambda r: r.code or 0)
    return worst, all(r.code in (0, 1) and "Traceback" not in r.text for r in runs) and "3 quarantined" in runs[0].text


@case
def bad_arguments(d: Path) -> tuple[Run, bool]:
    kvf("ingest", SAMPLE, "--db", d / "c.duckdb", cwd=d)
    runs = [kvf("sql", "", "--db", d / "c.duckdb", cwd=d), kvf("page", "decode-0", "99999999999999999999",
            "--db", d / "c.duckdb", cwd=d), kvf("report", "--db", d / "c.duckdb", "--out", d, cwd=d),
            kvf("report", "--db", d / "c.duckdb", "--out", "/proc/nope/r.html", cwd=d)]
    codes = [r.code for r in runs]  # (PAGE out of range: a usage error)
    return runs[-1], codes[:3] == [1, 2, 1] and codes[3] in (1, 3) and all(len(r.err.strip().splitlines()) == 1
                                                                          for r in runs)


@case
def one_bad_file_among_good(d: Path) -> tuple[Run, bool]:
    logs = d / "logs"
    jsonl(logs / "a.jsonl", [config("a")])
    packed = gzip.compress((SAMPLE / "prefill-0.jsonl").read_bytes())
    (logs / "b.jsonl.gz").write_bytes(packed[: len(packed) // 2])
    jsonl(logs / "c.jsonl", [config("c")])
    r = kvf("ingest", logs, "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 6 and "c.jsonl: 1 read, 1 ingested" in r.text and "b.jsonl.gz: refused" in r.text


@case
def csv_with_a_bad_byte(d: Path) -> tuple[Run, bool]:
    (d / "a.csv").write_bytes(b"kind,ts,node\nconfig,x,\xff\nconfig,y,z\n")
    r = kvf("ingest", d / "a.csv", "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "2 read, 0 ingested, 0 duplicates, 2 quarantined" in r.text


@case
def special_files(d: Path) -> tuple[Run, bool]:
    logs = d / "logs"
    jsonl(logs / "a.jsonl", [config()])
    os.mkfifo(logs / "fifo.jsonl")
    (logs / "zero.jsonl").symlink_to("/dev/zero")
    (d / "random.jsonl").symlink_to("/dev/urandom")
    runs = [kvf("ingest", "/dev/zero", "--db", d / "c.duckdb", cwd=d),
            kvf("ingest", d / "random.jsonl", "--db", d / "c.duckdb", cwd=d),
            kvf("ingest", logs / "fifo.jsonl", "--db", d / "c.duckdb", cwd=d),
            kvf("ingest", logs, "--db", d / "c.duckdb", cwd=d)]
    return runs[-1], [r.code for r in runs] == [1, 1, 1, 0] and runs[-1].text.count("passed over") == 2


@case
def sql_outside_the_case(d: Path) -> tuple[Run, bool]:
    kvf("ingest", SAMPLE, "--db", d / "c.duckdb", cwd=d)
    queries = [f"COPY (SELECT 1) TO '{d}/x.csv'", f"EXPORT DATABASE '{d}/export'",
               "SELECT * FROM read_text('/etc/shadow')", "SELECT * FROM glob('/root/*')", "INSTALL httpfs",
               "SELECT 1; SELECT 2", "SET enable_external_access = true"]
    runs = [kvf("sql", q, "--db", d / "c.duckdb", cwd=d) for q in queries]
    big = kvf("sql", "SELECT * FROM range(10000000)", "--db", d / "c.duckdb", "--format", "json", cwd=d)
    wrote = sorted(p.name for p in d.iterdir())
    ok = all(r.code == 1 for r in runs) and wrote == ["c.duckdb"] and big.code == 0 and big.peak_mb < 1000
    return big, ok


@case
def outputs_that_attack_their_reader(d: Path) -> tuple[Run, bool]:
    kvf("ingest", SAMPLE, "--db", d / "c.duckdb", cwd=d)
    q = "SELECT '=cmd|'' /C calc''!A0' AS a, '@SUM(1)' AS b, chr(27) || ']0;owned' || chr(7) AS c"
    csv_run = kvf("sql", q, "--db", d / "c.duckdb", "--format", "csv", cwd=d)
    table = kvf("sql", q, "--db", d / "c.duckdb", cwd=d)
    logs = d / "logs"
    logs.mkdir()
    shutil.copy(SAMPLE / "router.jsonl", logs / "x\ntotal: 1 read = 1 ingested.jsonl")
    forged = kvf("ingest", logs, "--db", d / "c2.duckdb", cwd=d)
    totals = [line for line in forged.out.decode().splitlines() if line.startswith("total:")]
    ok = (b"\x1b" not in csv_run.out + table.out and b"'=cmd" in csv_run.out and b"'@SUM" in csv_run.out
          and len(totals) == 1)
    return forged, ok


@case
def report_over_what_is_not_a_file(d: Path) -> tuple[Run, bool]:
    kvf("investigate", SAMPLE, "--db", d / "c.duckdb", cwd=d)
    os.mkfifo(d / "fifo.html")
    (d / "target.html").write_text("keep")
    (d / "link.html").symlink_to(d / "target.html")
    runs = [kvf("report", "--db", d / "c.duckdb", "--out", t, cwd=d)
            for t in ("/dev/full", "/dev/null", d / "fifo.html", d / "link.html")]
    ok = (all(r.code == 1 for r in runs) and Path("/dev/full").is_char_device() and Path("/dev/null").is_char_device()
          and (d / "target.html").read_text() == "keep" and (d / "link.html").is_symlink())
    return runs[0], ok


@case
def bidi_in_a_node_name(d: Path) -> tuple[Run, bool]:
    text = (SAMPLE / "decode-0.jsonl").read_text().replace('"decode-0"', '"\\u202edecode-0"')
    logs = Path(shutil.copytree(SAMPLE, d / "logs"))
    (logs / "decode-0.jsonl").write_text(text)
    r = kvf("investigate", logs, "--db", d / "c.duckdb", "--out", d / "r.html", "--no-replay", cwd=d)
    html = (d / "r.html").read_text(encoding="utf-8") if (d / "r.html").exists() else ""
    return r, r.code == 0 and "\u202e" not in html and "\\u202edecode-0" in html


@case
def times_as_rfc_3339_says(d: Path) -> tuple[Run, bool]:
    times = ["2026-09-14T24:00:00Z", "2026-09-14T08:00:00+25:00", "2026-09-14T08:00:00+05:60",
             "2026-09-14t08:00:00z", "2016-12-31T23:59:60Z"]
    log = jsonl(d / "a.jsonl", [config(f"n{i}", ts=t) for i, t in enumerate(times)])
    r = kvf("ingest", log, "--db", d / "c.duckdb", cwd=d)
    return r, r.code == 0 and "5 read, 2 ingested, 0 duplicates, 3 quarantined" in r.text and "leap second" in r.text


@case
def quarantine_details_hold_no_values(d: Path) -> tuple[Run, bool]:
    jsonl(d / "a.jsonl", [{"kind": "SECRET", "ts": TS, "node": "n"}, config(role="SECRET"), config(ts="SECRET")])
    kvf("ingest", d / "a.jsonl", "--db", d / "c.duckdb", cwd=d)
    r = kvf("quarantine", "--db", d / "c.duckdb", "--format", "csv", cwd=d)
    return r, r.code == 0 and b"SECRET" not in r.out and r.out.count(b"\n") == 4


@case
def request_id_reused_by_another_tenant(d: Path) -> tuple[Run, bool]:
    """Two tenants' received records for one request id, in files given in both orders: never
    merged into one silently. Each order keeps the same record (the smaller canonical JSON),
    quarantines the other as a conflict, and the finding names the id."""
    acme = {"kind": "request", "ts": TS, "node": "router", "request_id": "v", "event": "received",
            "tenant_id": "acme", "prompt_tokens": 10}
    initech = dict(acme, tenant_id="initech", seq=1)
    jsonl(d / "1" / "a.jsonl", [acme])
    jsonl(d / "1" / "b.jsonl", [initech])
    jsonl(d / "2" / "a.jsonl", [initech])
    jsonl(d / "2" / "b.jsonl", [acme])
    kept, runs = [], []
    for order in ("1", "2"):
        db = d / f"{order}.duckdb"
        runs.append(kvf("investigate", d / order, "--db", db, cwd=d))
        runs.append(kvf("sql", "--db", db, "--format", "csv",
                        "SELECT (SELECT string_agg(tenant_id, ',') FROM requests) AS kept, "
                        "(SELECT count(*) FROM quarantine WHERE reason = 'conflict') AS lost", cwd=d))
        runs.append(kvf("findings", "--db", db, cwd=d))
        kept.append(runs[-2].out)
    ok = (all(r.code == 0 for r in runs) and kept[0] == kept[1] and kept[0].strip().endswith(b",1")
          and all(b"evidence.request_id_conflict" in r.out for r in runs[2::3]))
    return runs[1], ok


# --- issue #44: nothing passed over quietly, empty inputs, the system's refusals, stops, usage ----

#: ``kvforensics`` with the files and folders named before ``--`` refused by the system as it opens or
#: lists them: for root, whom permissions do not stop.
DENIED = """
import errno, os, sys
cut = sys.argv.index("--")
denied = {os.path.abspath(p) for p in sys.argv[1:cut]}
real_open, real_scandir = os.open, os.scandir
def check(path):
    if os.path.abspath(os.fsdecode(path)) in denied:
        raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
def opened(path, *args, **kwargs):
    check(path)
    return real_open(path, *args, **kwargs)
def listed(path="."):
    check(path)
    return real_scandir(path)
os.open, os.scandir = opened, listed
from kvforensics.cli import main
sys.argv = ["kvforensics", *sys.argv[cut + 1:]]
main()
"""


def kvf_denied(denied: list[Path], *args: str | Path, cwd: Path) -> Run:
    """``kvforensics ARGS`` with ``denied`` unreadable: by permission, or as root by :data:`DENIED`."""
    if os.geteuid() != 0:
        for path in denied:
            path.chmod(0)
        try:
            return kvf(*args, cwd=cwd)
        finally:
            for path in denied:
                path.chmod(0o755)
    return kvf(*denied, "--", *args, cwd=cwd, via=[sys.executable, "-c", DENIED])


#: A phase's line of progress on stderr (``ingest: 2.0 s``): said as each phase ends, not a failure.
PHASE = re.compile(r"^[a-z][\w ,()-]*: [\d,]+\.\d s$")  # (as tests/conftest.py's PHASE_LINE)


def one_line(r: Run) -> bool:
    """Whether the run said one line on stderr besides its phases' progress, and no traceback."""
    said = [x for x in r.err.decode("utf-8", "replace").strip().splitlines()
            if not PHASE.match(x) or x.startswith("kvforensics:")]
    return len(said) == 1 and "Traceback" not in r.text


@case
def unreadable_file_and_folder(d: Path) -> tuple[Run, bool]:
    logs = Path(shutil.copytree(SAMPLE, d / "logs"))
    (logs / "sub").mkdir()
    shutil.move(logs / "decode-3.jsonl", logs / "sub" / "decode-3.jsonl")
    runs = [kvf_denied([logs / "router.jsonl", logs / "sub"], "investigate", logs, "--db", d / "c.duckdb", cwd=d),
            kvf_denied([logs / "router.jsonl"], "ingest", logs / "router.jsonl", "--db", d / "n.duckdb", cwd=d)]
    import duckdb

    con = duckdb.connect(str(d / "c.duckdb"), read_only=True)
    refused = con.execute("SELECT count(*) FROM refused_files WHERE why LIKE '%Permission denied%'").fetchall()
    con.close()
    ok = (all(r.code == 6 and one_line(r) for r in runs) and refused == [(2,)]
          and "sub: refused, nothing of it ingested: a folder that cannot be listed" in runs[0].text)
    return runs[0], ok


@case
def inputs_without_records(d: Path) -> tuple[Run, bool]:
    (d / "empty").mkdir()
    (d / "blank.jsonl").write_text("\n \n")
    (d / "bad.jsonl").write_text("not json\n")
    runs = [kvf("investigate", d / "empty", "--db", d / "a.duckdb", "--out", d / "a.html", cwd=d),
            kvf("ingest", d / "blank.jsonl", "--db", d / "b.duckdb", cwd=d),
            kvf("investigate", d / "bad.jsonl", "--db", d / "c.duckdb", cwd=d)]
    ok = (all(r.code == 8 and one_line(r) and "no records found in" in r.text for r in runs[:2])
          and "exposed_responses" not in runs[0].text and not (d / "a.html").exists()
          and runs[2].code == 0 and "1 quarantined" in runs[2].text)
    return runs[0], ok


@case
def full_disk(d: Path) -> tuple[Run, bool]:
    disk = d / "disk"
    disk.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode == 0

    def file_size_limit() -> None:  # (else: files past 1 MB refused by the system, EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    try:
        runs = [kvf(command, SAMPLE, "--db", disk / "c.duckdb", cwd=d, preexec=None if mounted else file_size_limit)
                for command in ("ingest", "investigate")]
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)
    cause = "No space left on device" if mounted else "File too large"
    return runs[0], all(r.code == 3 and one_line(r) and f"{disk}/c.duckdb" in r.text and cause in r.text
                        for r in runs)


@case
def db_folder_read_only(d: Path) -> tuple[Run, bool]:
    folder = d / "ro"
    folder.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)], capture_output=True).returncode == 0
    if not mounted:
        folder.chmod(0o555)
    try:
        r = kvf("ingest", SAMPLE / "router.jsonl", "--db", folder / "c.duckdb", cwd=d)
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)
        folder.chmod(0o755)
    return r, r.code == 3 and one_line(r) and f"{folder}/c.duckdb: " in r.text


@case
def db_path_not_utf8(d: Path) -> tuple[Run, bool]:
    r = kvf("ingest", SAMPLE / "router.jsonl", "--db", d / os.fsdecode(b"c\xff.duckdb"), cwd=d)
    return r, r.code == 2 and one_line(r) and "--db" in r.text and list(d.iterdir()) == []


#: Every numeric option, the arguments its command needs, and what it admits (least, most; floats
#: may not be nan).
NUMERIC = {
    "--year": (["ingest", "LOG", "--db", "DB"], 1, 9999),
    "--max-line-bytes": (["ingest", "LOG", "--db", "DB"], 4096, 2**40),
    "--max-expansion": (["investigate", "LOG", "--db", "DB"], 1, 2**40),
    "--partitions": (["investigate", "LOG", "--engine", "spark", "--out-dir", "OUT"], 1, 2**31 - 1),
    "--boot": (["page", "decode-0", "1", "--db", "DB"], 0, 2**63 - 1),
    "--limit": (["sql", "SELECT 1", "--db", "DB"], 1, 2**63 - 1),
    **{o: (["simulate", "--out", "OUT", "--requests", "3"], 1, 2**40) for o in (
        "--context-length", "--prefill-pool-tokens", "--decode-pool-tokens", "--page-size", "--prefill-nodes",
        "--decode-nodes")},
    "--requests": (["simulate", "--out", "OUT"], 1, 2**40), "--seed": (["simulate", "--out", "OUT"], 0, 2**63 - 1),
    **{o: (["simulate", "--out", "OUT", "--requests", "3"], 0.0, 2.0**40) for o in ("--length-scale", "--rate")},
    **{o: (["simulate", "--out", "OUT", "--requests", "3"], 0.0, 1.0) for o in ("--over-long", "--late-writes")},
    **{f"replay {o}": (["replay", "--db", "DB"], 1, 2**40) for o in ("--prefill-pool-tokens", "--context-length")},
}


@case
def numbers_out_of_range(d: Path) -> tuple[Run, bool]:
    """Property-based: for every numeric option, values drawn below its least and past its most
    (and nan, inf for floats); each is a usage error in one line naming the option."""
    rng = random.Random(44)
    runs = []
    for name, (args, least, most) in NUMERIC.items():
        option = name.split()[-1]
        if isinstance(least, float):
            values = [rng.choice(["nan", "inf", "-inf"]), str(least - rng.uniform(1e-6, 1e9)),
                      str(most + rng.uniform(1e-3, 1e300))]
        else:
            values = [str(least - rng.randint(1, 2**70)), str(most + rng.randint(1, 2**70))]
        for value in values:
            filled = [str(d / "w" / "c.duckdb") if a == "DB" else str(d / "w" / "o") if a == "OUT"
                      else str(SAMPLE / "router.jsonl") if a == "LOG" else a for a in args]
            r = kvf(*filled, option, value, cwd=d)
            runs.append((r, r.code == 2 and one_line(r) and f"'{option}'" in r.text))
    return next((r for r, held in runs if not held), runs[0][0]), all(held for _, held in runs)


@case
def usage_errors_in_one_line(d: Path) -> tuple[Run, bool]:
    runs = [kvf(*args, cwd=d) for args in (["--nope"], ["nope"], ["ingest"], ["ingest", "--nope"],
                                           ["sql", "SELECT 1"], ["replay", "--db", d / "c.duckdb", "--engine", "x"])]
    help_text = " ".join(kvf("--help", cwd=d).out.decode().split())
    listed = all(f" {code} " in help_text for code in ("6", "7", "8")) and "130, 143" in help_text
    return runs[0], listed and all(r.code == 2 and one_line(r) and r.text.startswith("kvforensics: usage: ")
                                   for r in runs)


def case_tables(db: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every table of a case, rows sorted, without what differs from run to run (times, versions, paths)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    out = {}
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT internal").fetchall():
        columns = [f'"{c}"' for (c,) in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [table]
        ).fetchall() if c not in ("ingested_at", "refused_at", "toolkit_version", "out")]
        out[table] = sorted(con.execute(f'SELECT {", ".join(columns)} FROM "{table}"').fetchall(), key=repr)
    con.close()
    return out


@case
def stops_at_random_times(d: Path) -> tuple[Run, bool]:
    """Property-based: SIGINT or SIGTERM at random times through ``investigate --out`` (start-up,
    ingest, analysis, replays, report): each run ends done (0) or with one line saying what the stop
    interrupted (130, 143), and the same command run again makes the tables an uninterrupted run does."""
    kvf("simulate", "--out", d / "logs", "--requests", "1000", "--seed", "1", cwd=d)
    whole = kvf("investigate", d / "logs", "--db", d / "ref" / "c.duckdb", "--out", d / "ref" / "r.html", cwd=d)
    reference = case_tables(d / "ref" / "c.duckdb")
    rng = random.Random(44)
    worst, held, stopped = whole, whole.code == 0, 0
    for i in range(6):
        folder = d / f"run{i}"
        args = ("investigate", d / "logs", "--db", folder / "c.duckdb", "--out", folder / "r.html")
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        r = kvf(*args, cwd=d, stop=(rng.uniform(0.05, whole.seconds), sig))
        told = [x for x in r.err.decode("utf-8", "replace").splitlines() if not PHASE.match(x)]  # (progress aside)
        said = len(told) == 1 and re.fullmatch(rf"kvforensics: stopped by {sig.name} during [^;]+; [^\n]+; run the "
                                               r"same command again to finish", told[0])
        if r.code == 128 + sig and said:
            stopped += 1
            again = kvf(*args, cwd=d)
            ok = again.code == 0 and case_tables(folder / "c.duckdb") == reference
        else:
            ok = r.code == 0 and not told
        if not ok:
            worst, held = r, False
    return worst, held and stopped > 0


# --- issue #44, round two: counts at the schema's limits, many files, stops while loading -----------


@case
def counts_at_the_schema_limits(d: Path) -> tuple[Run, bool]:
    """A pool and a window of 2^40, a prompt of 2^39 tokens, an output of 2^40: each accepted by
    the ingest, so the whole job with its replays and report ends within the replay's bounds
    (exit 7, the requests past them listed as beyond_replay_bound), in seconds, in the memory of
    a small case (it was a MemoryError and a replay that never ended)."""
    big = 2**40
    records: list[dict[str, object]] = [config(pool_pages=big, context_length=big, page_size=4)]
    for i, (rid, prompt, output) in enumerate([("huge-prompt", 2**39, 3), ("huge-output", 12, 2**40)]):
        base = {"kind": "request", "ts": TS, "request_id": rid}
        records += [dict(base, node="router", event="received", tenant_id=f"t{i}", prompt_tokens=prompt),
                    dict(base, node="decode-0", seq=4 * i + 1, event="admitted"),
                    dict(base, node="decode-0", seq=4 * i + 2, event="decode_started"),
                    dict(base, node="decode-0", seq=4 * i + 3, event="finished", status=200, output_tokens=output)]
    logs = jsonl(d / "logs" / "events.jsonl", records).parent
    r = kvf("investigate", logs, "--db", d / "c.duckdb", "--out", d / "r.html", "--json", cwd=d)
    replays = json.loads(r.out)["replays"] if r.out.startswith(b"{") else []
    listed = [x["disagreements"]["by_kind"] for x in replays if x["mode"] == "confirm"] == [{"beyond_replay_bound": 2}]
    return r, r.code == 7 and listed and r.peak_mb < 1024 and r.seconds < 60 and "Traceback" not in r.text


@case
def many_small_files(d: Path) -> tuple[Run, bool]:
    """The simulated incident cut into files of 20 lines, as hourly rotation cuts a fleet's logs:
    the same records, duplicates and figures as the whole files, every file counted."""
    kvf("simulate", "--out", d / "logs", "--requests", "300", "--seed", "2", cwd=d)
    cut = d / "cut"
    cut.mkdir()
    for log in sorted((d / "logs").glob("*.jsonl")):
        lines = log.read_bytes().splitlines(keepends=True)
        for at in range(0, len(lines), 20):
            (cut / f"{log.stem}-{at // 20:05d}.jsonl").write_bytes(b"".join(lines[at:at + 20]))
    whole = kvf("investigate", d / "logs", "--db", d / "whole.duckdb", "--json", cwd=d)
    many = kvf("investigate", cut, "--db", d / "many.duckdb", "--json", cwd=d)
    files = len(list(cut.iterdir()))
    ok = (whole.code == many.code == 0 and json.loads(whole.out)["exposure"] == json.loads(many.out)["exposure"]
          and len(json.loads(many.out)["files"]) == files
          and all(case_tables(d / "whole.duckdb")[t] == case_tables(d / "many.duckdb")[t]
                  for t in ("requests", "exposures", "page_reads", "uninitialized_reads", "exposure_summary")))
    return many, ok


@case
def stops_while_the_modules_load(d: Path) -> tuple[Run, bool]:
    """SIGINT and SIGTERM at random times in the first 150 ms: never an abort (DuckDB's module
    initialisation aborted with -6 when the stop's exception passed through it); each run ends
    with the line and 130 or 143, or, landing in Python's own start-up before the first line of
    kvforensics, killed by the signal (docs/hostile-input.md, Stops)."""
    rng = random.Random(4)
    worst, held = None, True
    for _ in range(40):
        sig = rng.choice([signal.SIGINT, signal.SIGTERM])
        r = kvf("investigate", SAMPLE, "--db", d / "c.duckdb", cwd=d, stop=(rng.uniform(0, 0.15), sig))
        said = b"stopped by" in r.err
        fine = (r.code == 128 + sig and said) or r.code == -sig or (r.code == 1 and b"KeyboardInterrupt" in r.err)
        written = (d / "c.duckdb").exists()
        if not fine or (written and (not said or b"during the start-up" in r.err)):  # (a later step may write)
            worst, held = r, False
        if written:
            (d / "c.duckdb").unlink()
        worst = worst or r
    assert worst is not None
    return worst, held


def main() -> int:
    global BIG
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big", action="store_true", help="the 5 GB bombs of the issue (else 1 GB)")
    parser.add_argument("cases", nargs="*", help="only these cases")
    args = parser.parse_args()
    BIG = args.big
    failed = 0
    print(f"{'case':36} {'exit':>4} {'held':>5} {'traceback':>9} {'peak MB':>8} {'s':>6}")
    for name, fn in CASES.items():
        if args.cases and name not in args.cases:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            run, held = fn(Path(tmp))
        trace = "Traceback" in run.text
        failed += (not held) or trace or run.code is None
        code = "hang" if run.code is None else str(run.code)
        print(f"{name:36} {code:>4} {str(held):>5} {str(trace):>9} {run.peak_mb:8.0f} {run.seconds:6.1f}")
    print(f"\n{len(CASES) if not args.cases else len(args.cases)} cases, {failed} that did not hold")
    return 1 if failed else 0


BIG = False

if __name__ == "__main__":
    sys.exit(main())
