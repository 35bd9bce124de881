"""How a replay compares with the logs: the allocations it reproduced page for page, the exposed
responses and exposure pairs in both or one, and the requests whose outcome changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from forensics.store import connect, one
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


@contextmanager
def beside(logged: Path, replayed: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the replay case with the logged case attached as ``logged``."""
    con = connect(replayed, read_only=True, create=False)
    try:
        con.execute(f"ATTACH '{sql_path(logged)}' AS logged (READ_ONLY)")
        yield con
    finally:
        con.close()
