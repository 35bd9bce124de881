"""The replay's SQL statements, read by name from ``sql/replay.sql``, with the lists the Python
declares once filled in where a statement names them in braces."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache

from forensics.store import sql_blocks

#: A node's order of its records: (boot, seq), a record without seq by its time, then its place
#: in the node's files.
NODE_ORDER = ("boot", "seq NULLS LAST", "ts", "file_id", "line_no", "part")


class SqlList:
    """A list of SQL the Python declares, put in a statement as ``{name}``, or as ``{name:t}``
    with each of its columns qualified by the table alias ``t``."""

    def __init__(self, render: Callable[[str], str]) -> None:
        self._render = render  # the list, each column prefixed with the given text

    @classmethod
    def columns(cls, names: Iterable[str]) -> SqlList:
        """The comma-separated ``names``."""
        names = tuple(names)
        return cls(lambda t: ", ".join(t + n for n in names))

    def __format__(self, alias: str) -> str:
        return self._render(f"{alias}." if alias else "")


def statement(name: str, **lists: SqlList) -> str:
    """The statement ``name`` of ``sql/replay.sql``, its ``{order}`` (:data:`NODE_ORDER`) and
    ``lists`` filled in."""
    return _blocks()[name].format_map({"order": SqlList.columns(NODE_ORDER), **lists})


@cache
def _blocks() -> dict[str, str]:
    """The statements of ``sql/replay.sql`` by name."""
    return {block.name: block.sql for block in sql_blocks("replay.sql", package="replay")}
