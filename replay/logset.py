"""Writing canonical log sets: one JSON Lines file per node, seq numbered per node."""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path
from typing import Any

from forensics.schema import FIELDS

_RANK = {name: i for i, name in enumerate(FIELDS)}


def _rank(item: tuple[str, Any]) -> int:
    return _RANK[item[0]]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def ts_ns(t: dt.datetime) -> int:
    """Nanoseconds since the epoch of an aware datetime (to the microsecond)."""
    return (t - EPOCH) // dt.timedelta(microseconds=1) * 1000


@functools.lru_cache(maxsize=1 << 14)
def ts_text(ns: int) -> str:
    """RFC 3339 UTC text of nanoseconds since the epoch, to the microsecond (as the case keeps it)."""
    micros = ns // 1000
    t = EPOCH + dt.timedelta(microseconds=micros)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_line(record: dict[str, Any]) -> str:
    """One record as a JSON line: fields in schema order, absent and null fields left out,
    ``boot`` only when not 0."""
    out = {k: v for k, v in sorted(record.items(), key=_rank) if v is not None}
    if out.get("boot") == 0:
        del out["boot"]
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False)


class LogSet:
    """Records of every node, kept in emission order; ``emit`` numbers them per node."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self._seq: dict[str, int] = {}
        self._used: set[str] = set()  # file names written
        self.records = 0

    def emit(self, record: dict[str, Any], *, numbered: bool = True) -> None:
        """Add a record to its node's file, numbered by the node's next seq unless ``numbered`` is false."""
        node = record["node"]
        if numbered:
            seq = self._seq.get(node, 0)
            record["seq"] = seq
            self._seq[node] = seq + 1
        self.lines.setdefault(node, []).append(record_line(record))
        self.records += 1

    def new_boot(self, node: str) -> None:
        """Seq numbers restart with a node's new boot."""
        self._seq[node] = 0

    def write(self, out: Path) -> list[Path]:
        """One ``NODE.jsonl`` per node in ``out``; the files written, in name order."""
        return [self.flush(node, out) for node in sorted(self.lines)]

    def flush(self, node: str, out: Path) -> Path:
        """Write ``node``'s records to its file in ``out`` and let them go (a replay writes each
        node's as soon as it is done with it); the file written."""
        out.mkdir(parents=True, exist_ok=True)
        name = _file_name(node)
        while name in self._used:  # two node names made safe alike: keep both files
            name += "_"
        self._used.add(name)
        path = out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8", newline="\n") as fh:
            for line in self.lines.pop(node, []):
                fh.write(line)
                fh.write("\n")
        return path


def _file_name(node: str) -> str:
    """A node name made safe as a file name (the node itself stays in every record)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in node) or "node"
