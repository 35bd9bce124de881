"""How a replay compares with the logs: the allocations it reproduced page for page, the exposed
responses and exposure pairs in both or one, and the requests whose outcome changed."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from forensics.errors import CaseError
from forensics.store import case_path, one
from replay.scratch import sql_path
from replay.statements import statement


@dataclass(frozen=True)
class Overlap:
    """What two sets have in common: in both (confirmed), in the replay only, in the logs only."""

    confirmed: int
    replay_only: int
    log_only: int

    @classmethod
    def of(cls, logged: set[Any], replayed: set[Any]) -> Overlap:
        """The overlap of the logged and the replayed set."""
        return cls(len(logged & replayed), len(replayed - logged), len(logged - replayed))


@dataclass(frozen=True)
class Agreement:
    """How a replay compares with the case's page records."""

    logged_allocations: int
    reproduced_allocations: int  # page for page
    exposed_responses: Overlap
    exposure_pairs: Overlap

    def as_dict(self) -> dict[str, Any]:
        """As JSON-ready data (the case's ``replays.agreement``)."""
        logged, same = self.logged_allocations, self.reproduced_allocations
        return {
            "allocations": {"logged": logged, "reproduced": same,
                            "share": round(same / logged, 6) if logged else None},
            "exposed_responses": dataclasses.asdict(self.exposed_responses),
            "exposure_pairs": dataclasses.asdict(self.exposure_pairs),
        }


def agreement(con: duckdb.DuckDBPyConnection) -> Agreement:
    """Allocations reproduced page for page, and exposed responses in both, or one, case (``con``:
    :func:`beside`)."""
    alloc = one(con, statement("allocations_reproduced"))
    pairs = con.execute(statement("exposure_pairs")).fetchall()
    logged_allocs, same = alloc or (0, 0)
    log_pairs = {(r, v) for r, v, src in pairs if src == "log"}
    rep_pairs = {(r, v) for r, v, src in pairs if src == "replay"}
    return Agreement(logged_allocs, same, Overlap.of({r for r, _ in log_pairs}, {r for r, _ in rep_pairs}),
                     Overlap.of(log_pairs, rep_pairs))


def outcomes_changed(con: duckdb.DuckDBPyConnection) -> list[tuple[str, bool]]:
    """Requests delivered in the logs and not in the replay, or the reverse: (request id,
    delivered in the logs), by request id (``con``: :func:`beside`)."""
    rows = con.execute(statement("outcomes_changed")).fetchall()
    return [(str(rid), bool(delivered)) for rid, delivered in rows]


#: What the replay case is attached as, beside the logged case (``kvf_logged`` in ``sql/replay.sql``):
#: names no case file is likely to have (a case's catalog is named for its file).
REPLAYED, LOGGED = "kvf_replayed", "kvf_logged"
#: The statements read beside both cases.
_BESIDE = ("allocations_reproduced", "exposure_pairs", "outcomes_changed")


@contextmanager
def beside(case: duckdb.DuckDBPyConnection, replayed: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the replay case ``replayed`` (attached read-only) with the logged case open on
    ``case`` as :data:`LOGGED`: an in-memory catalog of views of the logged case's tables that the
    statements read. Both are detached after."""
    logged = (one(case, "SELECT current_database()") or ("",))[0]
    if logged in (REPLAYED, LOGGED):
        raise CaseError(f"{case_path(case)}: a case file named {logged}.duckdb cannot be replayed (the replay "
                        "compares it with its own under those names); rename it")
    con = case.cursor()
    try:
        con.execute(f"ATTACH '{sql_path(replayed)}' AS {REPLAYED} (READ_ONLY)")
        con.execute(f"ATTACH ':memory:' AS {LOGGED}")
        source = logged.replace('"', '""')
        for table in _logged_tables(case, logged):
            con.execute(f'CREATE VIEW {LOGGED}.main.{table} AS SELECT * FROM "{source}".main.{table}')
        con.execute(f"USE {REPLAYED}")
        yield con
    finally:
        con.close()
        for name in (LOGGED, REPLAYED):
            case.execute(f"DETACH DATABASE IF EXISTS {name}")


def _logged_tables(case: duckdb.DuckDBPyConnection, catalog: str) -> list[str]:
    """The tables and views the statements read of the logged case (``kvf_logged.NAME``) that it holds,
    in its ``catalog`` (a case not analysed has no ``exposures``, which only the agreement reads)."""
    wanted = {t for name in _BESIDE for t in re.findall(rf"\b{LOGGED}\.(\w+)", statement(name))}
    held = {t for (t,) in case.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = $db AND schema_name = 'main' "
        "UNION SELECT view_name FROM duckdb_views() WHERE database_name = $db AND schema_name = 'main'",
        {"db": catalog}).fetchall()}
    return sorted(wanted & held)
