"""Opening a case database: schema, settings, and the errors a user can act on."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import duckdb

from forensics.errors import BadValue, CaseError, CaseLocked
from forensics.text import shown

if TYPE_CHECKING:
    import pyarrow as pa

#: The case format. 3: rec_hash is MurmurHash3 of the canonical JSON (was MD5). 4: one table of
#: records per kind, ``records`` a view of them. 5: the verbatim lines in ``source_lines``, not a
#: ``raw`` column of records and duplicates. 7: ``step_records.cache`` (schema v1.1's cache flush).
#: 8: ``request_records.retractions`` (schema v1.1: decode retracted the request). A case of
#: another schema cannot be extended: its files are ingested into a new case.
SCHEMA_VERSION = "8"


def sql_text(name: str, package: str = "forensics") -> str:
    """The text of a named SQL file shipped in ``forensics/sql`` (or the ``sql`` folder of another
    ``package`` of the toolkit: the replay's)."""
    return resources.files(package).joinpath("sql", name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class SqlBlock:
    """One statement of a SQL file of named blocks: its ``-- name:`` and other ``-- key: value``
    head lines, and its text without comments or the final semicolon."""

    name: str
    head: dict[str, str]
    sql: str


def sql_blocks(name: str, package: str = "forensics") -> list[SqlBlock]:
    """The blocks of a SQL file whose statements each start with a ``-- name: ...`` line, in order."""
    out = []
    for block in re.split(r"^(?=-- name: )", sql_text(name, package), flags=re.M):
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


def connect(path: Path | str | HeldCase, *, read_only: bool = False, create: bool = True
            ) -> duckdb.DuckDBPyConnection:
    """A connection to the case at ``path`` (``:memory:`` for a scratch case), schema in place.

    ``path`` must be new (when ``create``: it is made, and its folder), a DuckDB file holding a
    case of this schema version, or a Parquet case (a folder the Spark engine wrote: opened read
    only, :func:`open_parquet_case`); anything else is refused and left untouched. A
    :class:`HeldCase` is not opened again: the connection is a cursor on it (``read_only`` and
    ``create`` are its holder's).
    """
    if isinstance(path, HeldCase):
        return path.cursor()
    target = str(path)
    if target != ":memory:" and is_parquet_case(Path(target)):
        if not read_only:
            raise CaseError(f"{shown(Path(target))}: a Parquet case (written by --engine spark) is read only; "
                            "ingest or replay into a DuckDB case")
        return open_parquet_case(Path(target))
    if target != ":memory:":
        p = Path(target)
        check_case_path(p, create=create and not read_only)
        if not p.exists():
            _create_case(p)
    con = _open(target, read_only=read_only)
    session(con)
    if target != ":memory:":
        con.execute(f"SET memory_limit = '{CASE_MEMORY}'")
    # the version is read before the schema is applied, so a file of another kind or version is left untouched
    version = _schema_version(con)
    fresh = version is None and not _has_any_table(con)
    if version != SCHEMA_VERSION and not (fresh and not read_only):
        con.close()
        if version is None and fresh:  # (a case is made whole now; an older kvforensics stopped early left these)
            raise CaseError(f"{target}: an empty DuckDB database, not a kvforensics case (yet: an ingest stopped "
                            "before it wrote the case schema leaves one); run the ingest again to make it one")
        if version is None:
            raise CaseError(f"{target}: a DuckDB database but not a kvforensics case (it has no case schema); "
                            "left untouched")
        raise CaseError(
            f"{target}: case schema {version}, this kvforensics reads schema {SCHEMA_VERSION} "
            "(ingest the case's files into a new case)"
        )
    if not read_only:
        _write_schema(con)
    else:
        _late_tables(con)
    return con


class HeldCase:
    """A case a long job holds open for writing from its first use to its end, so that the file is
    opened once whatever its steps (the whole job: ingest, analysis, replays, report). It is opened
    when first asked for (a step that fails before it needs the case leaves no case behind), and
    closed by its holder. A step given one in place of a path (:func:`connect`) takes a cursor on
    it: a connection of its own to the same database, with its own transactions and temporary
    tables."""

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        self.path = path
        self._create = create
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The connection the case is held open on, opened for writing on first use."""
        if self._con is None:
            self._con = connect(self.path, create=self._create)
        return self._con

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """Another connection to the held case, under the toolkit's session settings."""
        cur = self.connection.cursor()
        session(cur)
        return cur

    def close(self) -> None:
        """Close the case, where it was opened."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> HeldCase:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __str__(self) -> str:
        return str(self.path)  # (what a step that took a path says of the case)


@contextmanager
def held(db: Path | str | HeldCase, *, create: bool = True) -> Iterator[HeldCase]:
    """The case ``db`` held open for the block: a :class:`HeldCase` as it is (its holder closes it),
    a path opened when first used (made where new, with ``create``) and closed after."""
    if isinstance(db, HeldCase):
        yield db
        return
    with HeldCase(db, create=create) as case:
        yield case


@contextmanager
def restored(con: duckdb.DuckDBPyConnection, *names: str) -> Iterator[None]:
    """The settings ``names`` set back after the block as they were before it (a step that lowers
    the memory limit of a case it shares: the limit holds for every connection to the database)."""
    before = [(name, one(con, "SELECT current_setting(?)", [name])) for name in names]
    try:
        yield
    finally:
        for name, row in before:
            assert row is not None
            con.execute(f"SET {name} = $value", {"value": row[0]})


def case_path(con: duckdb.DuckDBPyConnection) -> Path:
    """The file of the case open on ``con`` (as DuckDB holds it: absolute), ``:memory:`` for a scratch case."""
    row = one(con, "SELECT path FROM duckdb_databases() WHERE database_name = current_database()")
    return Path(row[0] if row is not None and row[0] else ":memory:")


#: Tables the schema gained after a case of its version could have been written: a case opened
#: read-only without them sees them empty (a temporary table; the file is not written).
LATE_TABLES = ("received_conflicts",)


def _late_tables(con: duckdb.DuckDBPyConnection) -> None:
    for table in LATE_TABLES:
        if not has_table(con, table):
            columns = ", ".join(f"{c} {t}" for c, t in schema_columns()[table])
            con.execute(f"CREATE TEMP TABLE {table} ({columns})")


def _open(target: str, *, read_only: bool, name: str | None = None) -> duckdb.DuckDBPyConnection:
    """DuckDB's connection to ``target``, its failures as errors a user can act on (said of ``name``,
    the case's path, where ``target`` is a file the case is made in)."""
    name = name or target
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:  # (DuckDB fails on it with std::bad_cast)
        raise BadValue(f"{shown(name)}: not a path DuckDB can open (its name has bytes that are not UTF-8); "
                       "name the case another way") from None
    try:
        return duckdb.connect(target, read_only=read_only)
    except duckdb.IOException as exc:
        text = str(exc)
        if "lock" in text.lower():
            holder = text.split("Conflicting lock is held in", 1)[-1].strip() if "Conflicting" in text else ""
            extra = f" ({holder})" if holder else ""
            raise CaseLocked(f"{name}: the case is open in another process{extra}") from exc
        refused = system_refusal(exc)
        if refused is not None:
            raise OSError(refused.errno, refused.strerror, name) from exc
        raise CaseError(f"{name}: cannot open the case ({text.splitlines()[0]})") from exc
    except duckdb.Error as exc:
        raise CaseError(f"{name}: not a DuckDB case file ({str(exc).splitlines()[0]})") from exc


def _write_schema(con: duckdb.DuckDBPyConnection) -> None:
    """The case schema, in one transaction (its statements create only what is missing)."""
    con.execute("BEGIN")
    con.execute(sql_text("schema.sql"))
    con.execute("INSERT INTO case_meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING", [SCHEMA_VERSION])
    con.execute("COMMIT")


def _create_case(path: Path) -> None:
    """A new case at ``path``, whole before it has the name: made beside it and linked to it, so
    that a stop while it is made (Ctrl-C, a kill, a full disk) leaves no file there without the
    case schema (which every command refuses), and a case another process made meanwhile is kept."""
    path.parent.mkdir(parents=True, exist_ok=True)
    made = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        con = _open(str(made), read_only=False, name=str(path))
        try:
            _write_schema(con)
        except duckdb.Error as exc:
            refused = system_refusal(exc)
            if refused is None:
                raise
            raise OSError(refused.errno, refused.strerror, str(path)) from exc  # (said of the case, not of `made`)
        finally:
            con.close()
        _name(made, path)
    finally:
        for left in (made, made.with_name(f"{made.name}.wal")):
            if os.path.lexists(left):  # (unlink(missing_ok) fails on a read-only folder, hiding why)
                left.unlink()


#: What ``link`` fails with on a file system without hard links (FAT, some network shares).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


def _name(made: Path, path: Path) -> None:
    """Give the file ``made`` the name ``path``, unless a file has it already."""
    try:
        os.link(made, path)
    except FileExistsError:
        pass  # another process made the case first: it is the one opened
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if not path.exists():  # (no hard links here: a case made in the same instant may be replaced)
            os.replace(made, path)


#: The system's own words for each error number (``No space left on device``), as DuckDB quotes them.
_STRERRORS = {os.strerror(n): n for n in errno.errorcode}
#: Where DuckDB says the system refused it a file: ``Could not write file "PATH": No space left on device``.
_REFUSED_FILE = re.compile(r'(?:file|directory) "(?P<path>[^"]+)"(?: - [^:"]*)?: (?P<why>[^"\n]+?)\s*$', re.M)


def system_refusal(exc: BaseException) -> OSError | None:
    """The system's refusal behind a failure (a full disk, a file size limit, a read-only folder)
    where DuckDB quotes one, looking through the failures it led to (a COMMIT that failed, then a
    ROLLBACK that found no transaction); None where DuckDB failed of its own accord."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, duckdb.Error):
            for found in _REFUSED_FILE.finditer(str(seen)):
                number = _STRERRORS.get(found["why"])
                if number is not None:
                    return OSError(number, found["why"], found["path"])
        seen = seen.__cause__ or seen.__context__
    return None


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


def roll_back(con: duckdb.DuckDBPyConnection) -> None:
    """Roll back the transaction open on ``con``. Where it has ended already (a COMMIT the disk
    refused ends it), there is nothing to roll back, and the error that ended it is the one to
    report, not the ROLLBACK's "no transaction is active"."""
    try:
        con.execute("ROLLBACK")
    except duckdb.TransactionException:
        pass


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


#: The view of a finding's rows where a case holds them (a Parquet case from Spark; forensics.findings).
STORED_FINDING = "finding:{id}"
#: A Parquet case's manifest, in its folder: what it is, the tables it holds and their files.
PARQUET_MANIFEST = "manifest.json"
#: What a Parquet case's manifest says it is.
PARQUET_KIND = "kvforensics Parquet case"
#: The tables of a case, each a folder of Parquet files in a Parquet case: the schema's (but for
#: ``case_meta``, made from the manifest) and the analysis's (``forensics/sql/analysis.sql``).
CASE_TABLES = (
    "files", "refused_files", "file_notes", "config_records", "request_records", "kv_records",
    "transfer_records", "step_records", "quarantine", "duplicates", "received_conflicts", "source_lines", "replays",
    "replay_disagreements", "replay_exposures", "requests", "page_reads", "uninitialized_reads", "exposures",
    "exposure_summary",
)


def is_parquet_case(path: Path) -> bool:
    """Whether ``path`` is a folder holding a Parquet case (its manifest says so)."""
    manifest = path / PARQUET_MANIFEST
    if not (path.is_dir() and manifest.is_file()):
        return False
    try:
        return bool(json.loads(manifest.read_text(encoding="utf-8")).get("kind") == PARQUET_KIND)
    except (OSError, ValueError, AttributeError):
        return False


def parquet_manifest(path: Path) -> dict[str, Any]:
    """A Parquet case's manifest (:data:`PARQUET_MANIFEST`)."""
    return dict(json.loads((path / PARQUET_MANIFEST).read_text(encoding="utf-8")))


@cache
def schema_columns() -> dict[str, list[tuple[str, str]]]:
    """Per table of the case schema (``schema.sql``), its columns and their DuckDB types (made once
    a process; not to be changed)."""
    con = duckdb.connect()
    try:
        con.execute(sql_text("schema.sql"))
        rows = con.execute("SELECT table_name, column_name, data_type FROM duckdb_columns() "
                           "WHERE NOT internal ORDER BY table_name, column_index").fetchall()
        tables = {name for (name,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()
    out: dict[str, list[tuple[str, str]]] = {}
    for table, column, kind in rows:
        if table in tables:
            out.setdefault(table, []).append((column, kind))
    return out


def open_parquet_case(path: Path) -> duckdb.DuckDBPyConnection:
    """A Parquet case opened in DuckDB: each table a view of its files (each column as the case
    schema types it: a record hash is kept as its hex text, Parquet having no 128-bit integer),
    ``case_meta`` from the manifest, and the schema's views over them, so every query, command, the
    report and the notebook read it as they read a DuckDB case. Nothing of the folder is written."""
    path = path.resolve()
    manifest = parquet_manifest(path)
    if str(manifest.get("schema_version")) != SCHEMA_VERSION:
        raise CaseError(f"{shown(path)}: case schema {manifest.get('schema_version')}, this kvforensics reads "
                        f"schema {SCHEMA_VERSION}")
    con = duckdb.connect()
    session(con)
    con.execute(f"SET memory_limit = '{CASE_MEMORY}'")
    typed = schema_columns()
    tables = manifest.get("tables", {})
    for table in CASE_TABLES:
        files = [str(path / table / name) for name in tables.get(table, {}).get("files", [])]
        columns = typed.get(table)
        if not files:
            if columns is None:
                continue  # an analysis table the case does not hold
            con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in columns)})")
            continue
        source = f"read_parquet({_sql_list(files)})"
        select = "*" if columns is None else ", ".join(f"{typed_value(c, t)} AS {c}" for c, t in columns)
        con.execute(f"CREATE VIEW {table} AS SELECT {select} FROM {source}")
    con.execute("CREATE TABLE case_meta (key VARCHAR PRIMARY KEY, value VARCHAR)")
    con.executemany("INSERT INTO case_meta VALUES (?, ?)", sorted(manifest.get("meta", {}).items()))
    con.execute("INSERT INTO case_meta VALUES ('schema_version', ?) ON CONFLICT DO NOTHING", [SCHEMA_VERSION])
    for statement in _schema_views():
        con.execute(statement)
    for finding, held in sorted(manifest.get("findings", {}).items()):  # (forensics.findings.STORED)
        files = [str(path / "findings" / finding / name) for name in held["files"]]
        view = STORED_FINDING.format(id=finding)
        con.execute(f'CREATE VIEW "{view}" AS SELECT * FROM read_parquet({_sql_list(files)}, union_by_name = true)')
    return con


def hash_text(column: str) -> str:
    """SQL for a record hash (``UHUGEINT``) as Parquet keeps it: hex text (Parquet has no 128-bit integer)."""
    return f"hex({column})"


def typed_value(column: str, kind: str) -> str:
    """SQL for a column of a Parquet case (or the Spark tasks' rows) as the case schema types it."""
    return f"('0x' || {column})::UHUGEINT" if kind == "UHUGEINT" else f"{column}::{kind}"


def _sql_list(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def _schema_views() -> list[str]:
    """The ``CREATE ... VIEW`` statements of ``schema.sql``, in order."""
    text = "\n".join(line for line in sql_text("schema.sql").splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in text.split(";") if s.strip().startswith("CREATE OR REPLACE VIEW")]


def write_parquet_manifest(path: Path, *, meta: dict[str, str], extra: dict[str, Any]) -> None:
    """The manifest of the Parquet case in ``path``, once its tables are in place: every Parquet file
    of each table and each finding (sorted), its rows and SHA-256, the ``case_meta`` rows, and ``extra``."""
    tables = {t: _parquet_files(path / t) for t in CASE_TABLES if (path / t).is_dir()}
    held = path / "findings"
    findings = {f.name: _parquet_files(f) for f in sorted(held.iterdir()) if f.is_dir()} if held.is_dir() else {}
    manifest = {"kind": PARQUET_KIND, "schema_version": SCHEMA_VERSION, **extra, "meta": meta, "tables": tables,
                **({"findings": findings} if findings else {})}
    (path / PARQUET_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _parquet_files(folder: Path) -> dict[str, Any]:
    """A folder's Parquet files (sorted; not those still being written, named ``.*``), their rows and SHA-256."""
    import hashlib

    import pyarrow.parquet as pq

    names = sorted(p.name for p in folder.iterdir() if p.suffix == ".parquet" and not p.name.startswith("."))
    return {
        "files": names,
        "rows": sum(pq.ParquetFile(folder / n).metadata.num_rows for n in names),
        "sha256": {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names},
    }


def export_parquet_case(db: Path | str, path: Path) -> None:
    """The DuckDB case ``db`` as a Parquet case in the new folder ``path`` (each table one file)."""
    con = connect(db, read_only=True, create=False)
    try:
        path.mkdir(parents=True)
        meta = dict(con.execute("SELECT key, value FROM case_meta").fetchall())
        typed = schema_columns()
        for table in CASE_TABLES:
            if not has_table(con, table):
                continue
            columns = typed.get(table)
            select = "*" if columns is None else ", ".join(
                f"{hash_text(c)} AS {c}" if t == "UHUGEINT" else c for c, t in columns)
            (path / table).mkdir()
            target = str(path / table / "part-0.parquet").replace("'", "''")
            con.execute(f"COPY (SELECT {select} FROM {table}) TO '{target}' (FORMAT parquet)")
    finally:
        con.close()
    write_parquet_manifest(path, meta=meta, extra={"written_by": "duckdb"})
