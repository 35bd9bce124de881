"""What the Spark tasks hand each other: rows of several case tables in one Arrow schema.

A :class:`Wire` puts every column of a set of tables side by side (a column another table has
under the same name and another type is ``table__column``), with ``tbl`` saying which table a row
is of, ``idx`` the file of the run it came from (ingest) and ``wire_node`` the node it goes to.
Spark moves the rows without knowing the case schema; a task takes a table's rows back out as
that table's own columns. A record hash travels as its hex text (Arrow, Parquet and Spark
have no 128-bit integer; hex: DuckDB writes and reads it 300 times faster than decimal text);
:meth:`Wire.insert` turns it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache, cached_property
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from forensics.store import hash_text, scan, schema_columns, typed_value

if TYPE_CHECKING:
    from pyspark.sql import Column

#: The columns every wire row starts with.
HEAD = (pa.field("tbl", pa.string()), pa.field("idx", pa.int32()), pa.field("wire_node", pa.string()))


def select_text(columns: list[tuple[str, str]]) -> str:
    """A query's select list of ``columns`` (name, DuckDB type), a hash as its hex text."""
    return ", ".join(f"{hash_text(c)} AS {c}" if t == "UHUGEINT" else c for c, t in columns)


@cache
def _schema_arrow(tables: tuple[str, ...]) -> dict[str, pa.Schema]:
    """The Arrow schema of each table of the case schema, as its rows leave DuckDB for the wire."""
    typed = schema_columns()
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        out = {}
        for table in tables:
            con.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t}' for c, t in typed[table])})")
            out[table] = con.sql(f"SELECT {select_text(typed[table])} FROM {table}").to_arrow_table().schema
        return out
    finally:
        con.close()


class Wire:
    """The wire of ``tables`` (name -> Arrow schema of its rows on the wire)."""

    def __init__(self, tables: Mapping[str, pa.Schema]) -> None:
        self.tables = dict(tables)
        first: dict[str, pa.DataType] = {}
        self.names: dict[tuple[str, str], str] = {}
        for table, schema in self.tables.items():
            for f in schema:
                same = first.setdefault(f.name, f.type) == f.type
                self.names[table, f.name] = f.name if same else f"{table}__{f.name}"

    @classmethod
    def of_case_tables(cls, tables: tuple[str, ...], extra: Mapping[str, pa.Schema] | None = None) -> Wire:
        """The wire of tables of the case schema (``schema.sql``), and of ``extra`` ones."""
        return cls({**_schema_arrow(tables), **(extra or {})})

    @cached_property
    def schema(self) -> pa.Schema:
        """The wire rows' schema."""
        fields, seen = list(HEAD), set()
        for (table, column), name in self.names.items():
            if name not in seen:
                seen.add(name)
                fields.append(pa.field(name, self.tables[table].field(column).type))
        return pa.schema(fields)

    def to_wire(self, table: str, rows: pa.Table | pa.RecordBatch, idx: int, node: str | None = None) -> pa.RecordBatch:
        """Rows of ``table`` (its wire columns) as wire rows, going to ``node`` (else their own)."""
        n = rows.num_rows
        mine = {self.names[table, c]: rows.column(c) for c in rows.schema.names}
        arrays = []
        for field in self.schema:
            if field.name == "tbl":
                arrays.append(pa.array([table] * n, pa.string()))
            elif field.name == "idx":
                arrays.append(pa.array([idx] * n, pa.int32()))
            elif field.name == "wire_node":
                arrays.append(rows.column("node") if node is None and "node" in rows.schema.names
                              else pa.array([node] * n, pa.string()))
            elif field.name in mine:
                arrays.append(mine[field.name].cast(field.type))
            else:
                arrays.append(pa.nulls(n, field.type))
        return pa.RecordBatch.from_arrays([a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
                                           for a in arrays], schema=self.schema)

    def from_wire(self, table: str, rows: pa.Table) -> pa.Table:
        """Wire rows of ``table`` as its own columns."""
        return pa.table({f.name: rows.column(self.names[table, f.name]) for f in self.tables[table]})

    def insert(self, con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table) -> None:
        """Wire rows of ``table`` into the case's table of that name (a hash back to an integer)."""
        if not rows.num_rows:
            return
        typed = dict(schema_columns().get(table, []))
        select = ", ".join(f"{typed_value(f.name, typed[f.name])} AS {f.name}" if f.name in typed else f.name
                           for f in self.tables[table])
        scan(con, self.from_wire(table, rows), "wire_rows",
             f"INSERT INTO {table} BY NAME SELECT {select} FROM wire_rows")

    def spark_columns(self, table: str, frame_columns: list[str]) -> list[Column]:
        """Spark columns making a DataFrame of ``table``'s own columns (``frame_columns``) into wire rows."""
        from pyspark.sql import functions as F

        from forensics.spark.analysis import spark_schema

        types = {f.name: f.dataType for f in spark_schema(self.schema).fields}
        own = {self.names[table, c]: c for c in frame_columns if (table, c) in self.names}
        out: list[Column] = []
        for field in self.schema:
            if field.name == "tbl":
                out.append(F.lit(table).alias("tbl"))
            elif field.name == "idx":
                out.append(F.lit(None).cast(types["idx"]).alias("idx"))
            elif field.name == "wire_node":
                out.append((F.col("node") if "node" in frame_columns else F.lit(None)).cast(types["wire_node"])
                           .alias("wire_node"))
            elif field.name in own:
                out.append(F.col(own[field.name]).cast(types[field.name]).alias(field.name))
            else:
                out.append(F.lit(None).cast(types[field.name]).alias(field.name))
        return out


__all__ = ["HEAD", "Wire", "select_text"]
