"""A write the system refuses during the analysis, through the Python API (issue #44 item 5): the
error raised is the system's refusal, with its path, never DuckDB's "cannot rollback - no
transaction is active" that the analysis's own ROLLBACK after a refused COMMIT used to raise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import duckdb

import forensics

SAMPLE = Path(__file__).resolve().parents[3] / "sample_logs" / "glm53-incident"

#: A child that investigates the ingested case again under a file size limit of 64 KiB: its
#: ingest finds every record a duplicate, and the analysis's own writes (to the WAL) are refused;
#: it prints what was raised, and what that was raised from.
CHILD = """
import resource, signal, sys
from pathlib import Path
import forensics
case = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
try:
    forensics.investigate([Path(sys.argv[2])], case)
except BaseException as exc:
    causes = []
    while exc is not None:
        causes.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    print("\\n".join(causes))
else:
    print("no error")
"""


def test_an_analysis_the_disk_refuses_raises_the_refusal_not_the_rollback(tmp_path: Path) -> None:
    case = tmp_path / "case.duckdb"
    forensics.ingest([SAMPLE], case)  # (ingested whole: only the analysis writes in the child)
    with duckdb.connect(str(case), read_only=True) as con:
        before = con.execute("SELECT count(*) FROM records").fetchone()
    done = subprocess.run([sys.executable, "-c", CHILD, str(case), str(SAMPLE)],
                          capture_output=True, text=True, check=True)
    first = done.stdout.splitlines()[0]
    assert "File too large" in first and str(case) in first, done.stdout
    assert "cannot rollback" not in done.stdout
    with duckdb.connect(str(case), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM records").fetchone() == before
