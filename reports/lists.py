"""The report's complete lists, beside it: every row of its long tables as CSV and Parquet.

The HTML shows the first :data:`SHOWN` rows of each long table, so that it stays a few megabytes
and opens at once at any case size; the complete lists (what a regulator or a customer's team
loads into their own tools) go into a folder beside it, ``REPORT-lists/``, each named in the
report with its SHA-256. They hold what the report shows, named as it names them (ids as logged,
keyed pseudonyms or ordinals, by audience): the customer report shows no request lists, and
none is written for it. The Parquet files keep every value as the report has it; in the CSV files
a text cell that a spreadsheet would run as a formula (it starts with ``=``, ``+``, ``-``, ``@``,
a tab or a carriage return) is prefixed with an apostrophe, and controls are shown as escapes.
Same case and options, same bytes.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from forensics.errors import OutputRefused
from forensics.outputs import check_target, write_atomically
from forensics.text import printable

#: Rows of each long table the HTML shows: what a reader reads (printed, about a page); every row
#: is in the lists beside the report.
SHOWN = 50
#: The long tables, with the columns each list has (in this order; any other column the rows
#: have follows).
COLUMNS = {
    "responses": ("reader_request", "reader_tenant", "delivered", "victims", "certain_victims", "victim_tenants",
                  "pages", "first_ts", "inferred", "evidence"),
    "victims": ("victim_request", "victim_tenant", "certainty", "why_possible", "readers", "pages", "first_seen",
                "evidence"),
    "handoffs": ("request_id", "prefill_node", "rejected_at", "reason", "limit_tokens", "prompt_tokens",
                 "tokens_sent", "decode_starts", "status"),
    # (the requests lost records leave unknown, and the readers whose delivery is not known)
    "not_known": ("request_id", "tenant_id", "node", "delivered", "what"),
}
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def folder_for(report: Path) -> Path:
    """The folder a report's lists go in: ``incident.html`` -> ``incident-lists``."""
    return report.with_name(f"{report.stem}-lists")


def check_folder(report: Path) -> None:
    """Refuse the lists' folder before any work where it is something else than a folder of lists."""
    folder = folder_for(report)
    check_target(folder / "responses.csv")
    if folder.exists() and (folder.is_symlink() or not folder.is_dir()):
        raise OutputRefused(f"{folder}: not a folder; the report's complete lists go there")


def write(report: Path, tables: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[int, list[tuple[str, str]]]]:
    """Write each of ``tables`` as ``NAME.csv`` and ``NAME.parquet`` into the report's lists folder;
    ``name -> (rows, [(file name in the folder, SHA-256)])`` (the report names no folder: same
    case and options, same bytes, whatever the report's name)."""
    folder = folder_for(report)
    out: dict[str, tuple[int, list[tuple[str, str]]]] = {}
    for name, rows in tables.items():
        table = _table(rows, COLUMNS[name])
        written = []
        for suffix, data in (("csv", _csv(table)), ("parquet", _parquet(table))):
            path = folder / f"{name}.{suffix}"
            write_atomically(path, data)
            written.append((path.name, hashlib.sha256(data).hexdigest()))
        out[name] = (len(rows), written)
    return out


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> pa.Table:
    names = list(columns) + sorted({k for r in rows for k in r} - set(columns))
    arrays = {}
    for name in names:
        values = [r.get(name) for r in rows]
        arrays[name] = pa.array(values) if any(v is not None for v in values) else pa.nulls(len(rows), pa.string())
    return pa.table(arrays)


def _csv(table: pa.Table) -> bytes:
    safe = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            safe[name] = pa.array([None if v is None else _cell(v) for v in column.to_pylist()], pa.string())
        else:
            safe[name] = column
    buf = io.BytesIO()
    pacsv.write_csv(pa.table(safe), buf)
    return buf.getvalue()


def _cell(text: str) -> str:
    text = printable(text)
    return "'" + text if text.startswith(_FORMULA) else text


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()
