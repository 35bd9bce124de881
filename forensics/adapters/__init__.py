"""Engine logs in, canonical records out: the adapter registry.

An adapter recognises a log format from a file's first lines (``sniff``, cheap) and turns
each line of such a file into canonical records (``translate``). Every line ends one way:

- translated: one or more canonical records, validated and ingested exactly like canonical
  lines (a record that fails validation is quarantined with the spec's reason);
- untranslatable: an event line the adapter recognised but could not turn into records,
  quarantined verbatim with the reason ``untranslatable`` and why;
- ignored: a line that is no event the adapter translates (other log output), counted.

``canonical`` is in the table too: the toolkit's own format, read by :mod:`forensics.ingestion.readers`.
Adding a format is a package with its :class:`Adapter` records and one entry in :data:`ADAPTERS`
(docs/adapters.md, "Writing the next adapter"); the files it reads along with its own, the ingest
finds where its ``companions`` say (:class:`Beside`).
"""

from __future__ import annotations

from collections.abc import Sequence

from forensics.adapters import sglang
from forensics.adapters.base import (
    LINES_SCHEMA,
    SNIFF_LINES,
    Adapter,
    Beside,
    Companions,
    Lines,
    Notes,
    Options,
    Outcome,
    Unreadable,
    Untranslatable,
    chunks,
    first_object,
    log_like,
    node_of,
    read_tenant_map,
    table,
)
from forensics.errors import BadOption


def _canonical_sniff(head: Sequence[str]) -> bool:
    doc = first_object(head)
    return doc is not None and "kind" in doc


CANONICAL = Adapter(
    name="canonical",
    reads="the toolkit's canonical log schema v1: JSON Lines, CSV or Parquet (log-schema.md)",
    evidence="whatever the records hold: page records give exact exposures",
    sniff=_canonical_sniff,
    translate=None,
)


ADAPTERS: dict[str, Adapter] = table(CANONICAL, *sglang.ADAPTERS)


def get(name: str) -> Adapter:
    """The adapter called ``name``; a clear error naming the known ones otherwise."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise BadOption(f"unknown --format {name!r}; one of: {', '.join(ADAPTERS)}") from None


def sniff(head: Sequence[str]) -> Adapter | None:
    """The first adapter (in table order) that recognises these first lines."""
    for adapter in ADAPTERS.values():
        if adapter.sniff(head):
            return adapter
    return None


__all__ = ["ADAPTERS", "LINES_SCHEMA", "SNIFF_LINES", "Adapter", "Beside", "Companions", "Lines", "Notes", "Options",
           "Outcome", "Unreadable", "Untranslatable", "chunks", "first_object", "get",
           "log_like", "node_of", "read_tenant_map", "sniff", "table"]
