"""The main job: ingest a log set, analyse it, and give the figures."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from forensics.adapters import Options
from forensics.exposure.analysis import analyse
from forensics.ingestion import IngestResult, Progress, ingest
from forensics.ingestion.readers import Limits
from forensics.store import HeldCase, held

#: A long job's phases, told as they run: ``phase(name)`` is entered while the phase named runs
#: (the CLI shows it on stderr; None: nothing is told).
Phase = Callable[[str], AbstractContextManager[object]]


def untold(name: str) -> AbstractContextManager[object]:
    """A phase nobody is told of."""
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Investigation:
    """What ``investigate`` found: how the records ended, and the exposure figures."""

    ingest: IngestResult
    exposure: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        """The investigation as JSON-ready data (what ``investigate --json`` prints)."""
        data = self.ingest.as_dict()
        return {
            "db": data["db"],
            "records": data["records"],
            "exposure": self.exposure,
            "files": data["files"],
            "skipped": data["skipped"],
            "refused": data["refused"],
            "case": data["case"],
        }


def investigate(
    paths: Sequence[Path | str],
    db: Path | str | HeldCase,
    *,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    fast: bool | None = None,
    limits: Limits | None = None,
    phase: Phase | None = None,
) -> Investigation:
    """Ingest ``paths`` into the case ``db`` (``format`` and ``options`` as for :func:`ingest`),
    rebuild its timelines and exposures. ``fast``: the compiled accelerators (True), none (False),
    or each where the input is large enough to gain from it (None). ``limits``: the reader's bounds.
    ``phase``: told of the ingest and the analysis as each runs. ``db``: the case's path, or the case
    a long job holds open (:func:`investigate_on`)."""
    with held(db) as case:
        return investigate_on(case, paths, progress=progress, format=format, options=options, fast=fast,
                              limits=limits, phase=phase)


def investigate_on(
    case: HeldCase,
    paths: Sequence[Path | str],
    *,
    progress: Progress | None = None,
    format: str | None = None,
    options: Options | None = None,
    fast: bool | None = None,
    limits: Limits | None = None,
    phase: Phase | None = None,
) -> Investigation:
    """:func:`investigate` into the case ``case`` holds open (opened there by the ingest, where not yet)."""
    told = phase or untold
    with told("ingest"):
        # (the ingest takes a path, and the held case as one: its connection a cursor on the case)
        result = ingest(paths, case, progress=progress, format=format, options=options,
                        fast=fast, limits=limits)
        # the ingest turns off the vacuum of its commits for the whole database: on again, as on a case opened anew
        case.connection.execute("RESET max_vacuum_tasks")
    with told("analysis"):
        con = case.cursor()  # (the analysis's temporary tables go with it)
        try:
            figures = analyse(con, fast=fast)
        finally:
            con.close()
    return Investigation(result, figures)
