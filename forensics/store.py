"""Opening a case database: schema, settings, and the errors a user can act on."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from forensics.errors import CaseError, CaseLocked
from forensics.text import shown

if TYPE_CHECKING:
    import pyarrow as pa

#: The case format. 3: rec_hash is MurmurHash3 of the canonical JSON (was MD5). 4: one table of
#: records per kind, ``records`` a view of them. 5: the verbatim lines in ``source_lines``, not a
#: ``raw`` column of records and duplicates. A case of another schema cannot be extended: its
#: files are ingested into a new case.
SCHEMA_VERSION = "5"


def sql_text(name: str) -> str:
    """The text of a named SQL file shipped in ``forensics/sql``."""
    return resources.files("forensics").joinpath("sql", name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class SqlBlock:
    """One statement of a SQL file of named blocks: its ``-- name:`` and other ``-- key: value``
    head lines, and its text without comments or the final semicolon."""

    name: str
    head: dict[str, str]
    sql: str


def sql_blocks(name: str) -> list[SqlBlock]:
    """The blocks of a SQL file whose statements each start with a ``-- name: ...`` line, in order."""
    out = []
    for block in re.split(r"^(?=-- name: )", sql_text(name), flags=re.M):
        if not block.startswith("-- name: "):
            continue  # the file's preamble
        head = dict(re.findall(r"^-- ([a-z]+): (.*)$", block, re.M))
        body = "\n".join(line for line in block.splitlines() if not line.startswith("--")).strip().rstrip(";")
        out.append(SqlBlock(head["name"], head, body))
    return out


#: A DuckDB database file: its main header's magic bytes, at this offset.
_DUCKDB_MAGIC, _DUCKDB_MAGIC_AT = b"DUCK", 8


def check_case_path(path: Path, *, create: bool) -> None:
    """Refuse, untouched, what ``--db`` must not open: a path that is not a regular file (a folder,
    a device, a FIFO), and a file that is not a DuckDB database (a log, a CSV: DuckDB would open it
    as an empty database). A DuckDB file is further checked for the case schema once open."""
    if not path.exists():
        if not create:
            raise CaseError(f"{shown(path)}: no such case (run 'kvforensics ingest' first)")
        return
    if path.is_dir():
        raise CaseError(f"{shown(path)}: is a folder, not a case file")
    if not path.is_file():
        raise CaseError(f"{shown(path)}: not a regular file, so not a case")
    if path.stat().st_size == 0:
        raise CaseError(f"{shown(path)}: an empty file, not a case (name a path that does not exist yet, "
                        "and ingest makes the case there)")
    with path.open("rb") as fh:
        head = fh.read(_DUCKDB_MAGIC_AT + len(_DUCKDB_MAGIC))
    if head[_DUCKDB_MAGIC_AT:] != _DUCKDB_MAGIC:
        raise CaseError(f"{shown(path)}: not a DuckDB file, so not a case (is it a log? --db names the case "
                        "database, which ingest creates)")


#: DuckDB's memory on a case: past it, DuckDB spills to a folder beside the case (``CASE.tmp``),
#: so ingest and analysis stay bounded whatever the size of the case (DuckDB's default is 80% of
#: the machine's memory; bench/README.md). A report lowers it further (``reports.render``).
CASE_MEMORY = "2GiB"


def session(con: duckdb.DuckDBPyConnection) -> None:
    """The settings every connection of the toolkit works under: times in UTC, no progress bar."""
    con.execute("SET TimeZone = 'UTC'")
    try:
        con.execute("SET enable_progress_bar = false")
    except duckdb.InvalidInputException:
        pass  # in Jupyter without ipywidgets DuckDB refuses to touch the setting; there is no bar to hide


def connect(path: Path | str, *, read_only: bool = False, create: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection to the case at ``path`` (``:memory:`` for a scratch case), schema in place.

    ``path`` must be new (when ``create``: it is made, and its folder) or a DuckDB file holding a
    case of this schema version; anything else is refused and left untouched.
    """
    target = str(path)
    if target != ":memory:":
        p = Path(target)
        check_case_path(p, create=create and not read_only)
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(target, read_only=read_only)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            holder = text.split("Conflicting lock is held in", 1)[-1].strip() if "Conflicting" in text else ""
            extra = f" ({holder})" if holder else ""
            raise CaseLocked(f"{target}: the case is open in another process{extra}") from exc
        raise CaseError(f"{target}: cannot open the case ({text.splitlines()[0]})") from exc
    except duckdb.Error as exc:
        raise CaseError(f"{target}: not a DuckDB case file ({str(exc).splitlines()[0]})") from exc
    session(con)
    if target != ":memory:":
        con.execute(f"SET memory_limit = '{CASE_MEMORY}'")
    # the version is read before the schema is applied, so a file of another kind or version is left untouched
    version = _schema_version(con)
    fresh = version is None and not _has_any_table(con)
    if version != SCHEMA_VERSION and not (fresh and not read_only):
        con.close()
        if version is None:
            raise CaseError(f"{target}: a DuckDB database but not a kvforensics case (it has no case schema); "
                            "left untouched")
        raise CaseError(
            f"{target}: case schema {version}, this kvforensics reads schema {SCHEMA_VERSION} "
            "(ingest the case's files into a new case)"
        )
    if not read_only:
        con.execute("BEGIN")
        con.execute(sql_text("schema.sql"))
        con.execute(
            "INSERT INTO case_meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING",
            [SCHEMA_VERSION],
        )
        con.execute("COMMIT")
    return con


def _has_any_table(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the database holds any table or view of its own (a new case holds none)."""
    row = one(con, "SELECT (SELECT count(*) FROM duckdb_tables() WHERE NOT internal) "
                   "+ (SELECT count(*) FROM duckdb_views() WHERE NOT internal)")
    return row is not None and row[0] > 0


def _schema_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The case schema the file holds; None where it holds no case yet."""
    if not has_table(con, "case_meta"):
        return None
    row = one(con, "SELECT value FROM case_meta WHERE key = 'schema_version'")
    return None if row is None else str(row[0])


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the case has a table called ``name`` (tables the whole job adds, like replay_exposures)."""
    row = one(con, "SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name])
    return row is not None and row[0] > 0


def one(con: duckdb.DuckDBPyConnection, sql: str, params: list[object] | None = None) -> tuple[Any, ...] | None:
    """The first row of a query, the result consumed whole (DuckDB 2 wants results finished)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0] if rows else None


def scan(con: duckdb.DuckDBPyConnection, table: pa.Table, name: str, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` run with the Arrow ``table`` visible to it as ``name``, for that statement only.

    Not a registered view: a view is a catalog entry, and one dropped inside a transaction keeps
    its table, and every buffer the table points into, alive until the transaction ends. A file's
    ingest is one transaction, and it held every block it had inserted: 3 GiB over a 1.4 GB file
    (bench/README.md). A relation's query holds the table only while the statement runs.
    """
    result = con.from_arrow(table).query(name, sql)
    return result.fetchall() if result is not None else []


def rows(con: duckdb.DuckDBPyConnection, sql: str,
         params: list[Any] | dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A query's rows as dicts by column name."""
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
