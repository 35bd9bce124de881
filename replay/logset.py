"""Writing canonical log sets: one JSON Lines file per node, seq numbered per node (or, packed,
the nodes' records in files of about a million records each: a replay of ten thousand nodes is
then a few files to ingest, not ten thousand, and a node of forty million records several, each
ingested in memory bounded by its size)."""

from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import pyarrow.compute as pc

from forensics.schema import FIELDS, V1_1_CONFIG

_RANK = {name: i for i, name in enumerate((*FIELDS, *V1_1_CONFIG))}  # (v1.1's after v1's)
#: The fields of each record layout seen (its keys as inserted), in schema order.
_ORDERS: dict[tuple[str, ...], tuple[str, ...]] = {}

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def ts_ns(t: dt.datetime) -> int:
    """Nanoseconds since the epoch of an aware datetime (to the microsecond)."""
    return (t - EPOCH) // dt.timedelta(microseconds=1) * 1000


def ts_text(ns: int) -> str:
    """RFC 3339 UTC text of nanoseconds since the epoch, to the microsecond (as the case keeps it)."""
    second, micros = divmod(ns // 1000, 1_000_000)
    return f"{_second_text(second)}.{micros:06d}Z"


def ts_texts(micros: pa.Array) -> pa.Array:
    """:func:`ts_text` of each time of ``micros`` (microseconds since the epoch, none null), written
    by Arrow's strftime where its years have four digits (as Python's strftime writes them), else
    one at a time."""
    lo, hi = pc.min_max(micros).values()
    if lo.as_py() is None or (_FROM_US <= lo.as_py() and hi.as_py() < _UNTIL_US):
        return pc.strftime(micros.cast(_US_UTC), format="%Y-%m-%dT%H:%M:%SZ")
    return pa.array([ts_text(t * 1000) for t in micros.to_pylist()], pa.string())


#: The times :func:`ts_texts` has Arrow write: the years 1000 to 9999, in microseconds since the epoch.
_FROM_US, _UNTIL_US = -30_610_224_000_000_000, 253_402_300_800_000_000
_US_UTC = pa.timestamp("us", tz="UTC")


@functools.lru_cache(maxsize=1 << 14)
def _second_text(second: int) -> str:
    return (EPOCH + dt.timedelta(seconds=second)).strftime("%Y-%m-%dT%H:%M:%S")


def schema_order(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Record fields ``keys`` in the order :func:`record_line` writes them (the schema's)."""
    order = _ORDERS.get(keys)
    if order is None:
        order = _ORDERS[keys] = tuple(sorted(keys, key=_RANK.__getitem__))  # (a field not in the schema: KeyError)
    return order


def record_line(record: dict[str, Any]) -> str:
    """One record as a JSON line: fields in schema order, absent and null fields left out,
    ``boot`` only when not 0. A field the schema does not have is refused."""
    keys = tuple(record)
    order = _ORDERS.get(keys) or schema_order(keys)
    parts = []
    for k in order:  # (as json.dumps writes the dict, in half the time: texts and whole numbers by hand)
        v = record[k]
        if v is None or (k == "boot" and v == 0):
            continue
        kind = v.__class__
        if kind is str:
            parts.append(f'"{k}":{_string(v)}')
        elif kind is int:
            parts.append(f'"{k}":{v}')
        else:
            parts.append(f'"{k}":{json.dumps(v, separators=(",", ":"), ensure_ascii=False)}')
    return "{" + ",".join(parts) + "}"


#: A packed log set's records a file: a file ends once it holds this many (after the record, or the
#: decode step's records, that reaches it). The ingest reads a file as one transaction, its memory
#: growing with the file: a million-request replay's decode node in one file of 1.16 GB (7 million
#: records) took the ingest of the replayed set to 4.39 GiB, in files of this many to 3.40 GiB.
PART_RECORDS = 1 << 20


class LogSet:
    """Records of every node, numbered per node by ``emit``: kept in emission order until written,
    or, with ``into`` (a folder), written to each node's file as they are emitted (a replay holds
    none of them). ``packed``: the nodes share files (``PART-NNNNN.jsonl``, ``part`` naming them), a
    new one started once one holds :data:`PART_RECORDS` records, within a node's records or between
    two nodes' (the order of a node's records is its seq, never its file)."""

    def __init__(self, into: Path | None = None, *, packed: bool = False, part: str = "part") -> None:
        self.lines: dict[str, list[str]] = {}
        self._seq: dict[str, int] = {}
        self._used: set[str] = set()  # file names written
        self._into = into
        self._open: dict[str, TextIO] = {}
        self.records = 0
        self._packed = packed
        self._part: TextIO | None = None  # packed: the file being written
        self._part_records = 0
        self._closed: Path | None = None  # the last file closed
        self._quoted = _Quoted()
        self._part_name = part  # packed: the files' names, PART-NNNNN.jsonl

    def emit(self, record: dict[str, Any], *, numbered: bool = True) -> None:
        """Add a record to its node's file, numbered by the node's next seq unless ``numbered`` is false."""
        node = record["node"]
        if numbered:
            seq = self._seq.get(node, 0)
            record["seq"] = seq
            self._seq[node] = seq + 1
        if self._into is not None:
            fh = self._open.get(node) or self._start(node, self._into)
            fh.write(record_line(record))
            fh.write("\n")
            self._part_records += 1
            if self._packed and self._part_records >= PART_RECORDS:
                self._close(fh)
        else:
            self.lines.setdefault(node, []).append(record_line(record))
        self.records += 1

    def emit_kv(self, node: str, boot: int, ts: str, request_id: str, op: str, pages: str,
                source: str | None) -> None:
        """:meth:`emit` of the page record ``{kind: kv, ts, node, boot, request_id, op, pages, source}``,
        numbered, its line written as :func:`record_line` writes it (the same bytes) without the
        dict: a replay emits one for every page a decode step takes. ``pages`` is a page string
        (digits, ``-`` and ``,``: nothing to escape)."""
        self.emit_kvs(node, boot, ((ts, request_id, op, pages, source),))

    def emit_kvs(self, node: str, boot: int, records: Iterable[tuple[str, str, str, str, str | None]]) -> None:
        """:meth:`emit_kv` of each ``(ts, request_id, op, pages, source)`` of ``records``, in order."""
        seq = self._seq.get(node, 0)
        q = self._quoted
        head = '{"kind":"kv","ts":'
        at = f',"node":{q(node)},"seq":'
        booted = f",{_BOOT}{boot}" if boot else ""
        lines = []
        for ts, request_id, op, pages, source in records:
            lines.append(f'{head}{q(ts)}{at}{seq}{booted},"request_id":{q(request_id)},"op":{q(op)},'
                         f'"pages":"{pages}"{"" if source is None else f",{_SOURCE}{q(source)}"}}}\n')
            seq += 1
        self._put(node, seq, "".join(lines), len(lines))

    def emit_step_pages(self, node: str, boot: int, pages: Iterable[tuple[str, str, str]]) -> None:
        """:meth:`emit_kvs` of the three records of each ``(ts, request_id, page)`` of ``pages`` (a page
        a decode step took, its page string): its ``alloc``, its ``write`` (source ``decode``) and its
        ``read``, in that order, the same bytes, written with one format a page (the replay's most
        frequent records: three of every four it writes)."""
        seq = self._seq.get(node, 0)
        q = self._quoted
        at = f',"node":{q(node)},"seq":'
        booted = f",{_BOOT}{boot}" if boot else ""
        lines = []
        for ts, request_id, page in pages:
            head = f'{{"kind":"kv","ts":{q(ts)}{at}'
            tail = f'{booted},"request_id":{q(request_id)},"op":'
            lines.append(f'{head}{seq}{tail}"alloc","pages":"{page}"}}\n'
                         f'{head}{seq + 1}{tail}"write","pages":"{page}","source":"decode"}}\n'
                         f'{head}{seq + 2}{tail}"read","pages":"{page}"}}\n')
            seq += 3
        self._put(node, seq, "".join(lines), 3 * len(lines))

    def _put(self, node: str, seq: int, text: str, records: int) -> None:
        """``records`` page records of ``node``, ``text`` their lines (each ending a newline), written
        to its file or kept; ``seq`` its next."""
        self._seq[node] = seq
        if self._into is not None:
            fh = self._open.get(node) or self._start(node, self._into)
            fh.write(text)
            self._part_records += records
            if self._packed and self._part_records >= PART_RECORDS:
                self._close(fh)
        else:
            self.lines.setdefault(node, []).extend(text.split("\n")[:-1])  # (a JSON text holds no newline)
        self.records += records

    @property
    def packed(self) -> bool:
        """Whether the nodes share files of about :data:`PART_RECORDS` records each."""
        return self._packed

    @property
    def writes_files(self) -> bool:
        """Whether records go to their files as they are emitted (``into``), not kept in memory."""
        return self._into is not None

    @property
    def part_records(self) -> int:
        """Packed: the records in the file being written."""
        return self._part_records

    def seq(self, node: str) -> int:
        """``node``'s next seq."""
        return self._seq.get(node, 0)

    def emit_lines(self, node: str, text: bytes, records: int, seq: int, splits: list[int], part_records: int
                   ) -> None:
        """Lines of ``node``'s ``records`` written elsewhere as :meth:`emit` and :meth:`emit_kvs` write them
        (the compiled decode node, replay/decode_fast.py): ``text`` (UTF-8, each line ending a newline),
        numbered up to ``seq`` (the node's next), a packed file closed at each byte offset of ``splits``
        (where a call of the writer reached :data:`PART_RECORDS`), ``part_records`` in the file written last."""
        assert self._into is not None, "written as it is emitted"
        start = 0
        for cut in [*splits, len(text)]:
            if cut > start:
                fh = self._open.get(node) or self._start(node, self._into)
                fh.flush()  # (the bytes as they are, after what the file's text layer holds: UTF-8 both)
                fh.buffer.write(text[start:cut])
                if cut != len(text) or cut in splits:
                    self._close(fh)
            start = cut
        self._seq[node] = seq
        self.records += records
        self._part_records = part_records

    def new_boot(self, node: str) -> None:
        """Seq numbers restart with a node's new boot."""
        self._seq[node] = 0

    def write(self, out: Path) -> list[Path]:
        """One ``NODE.jsonl`` per node in ``out`` (with ``into``: the files there, closed); the
        files written, in node order."""
        written = [self.flush(node, out) for node in sorted(set(self.lines) | set(self._open))]
        self.close()
        return list(dict.fromkeys(written))

    def flush(self, node: str, out: Path) -> Path:
        """Write ``node``'s records to its file in ``out`` and let them go (a replay writes each
        node's as soon as it is done with it); the file written (packed: left open for the next
        node until it holds :data:`PART_RECORDS`)."""
        fh = self._open.pop(node, None)
        lines = self.lines.pop(node, [])
        if fh is None and self._packed and not lines and self._closed is not None:
            return self._closed  # (its last records filled a part, closed then: no part is begun for nothing)
        if fh is None:
            fh = self._start(node, out)
        for line in lines:
            fh.write(line)
            fh.write("\n")
            self._part_records += 1
        if not self._packed or self._part_records >= PART_RECORDS:
            self._close(fh)
        return Path(fh.name)

    def close(self) -> None:
        """Close every file still open (packed: the last part)."""
        for fh in set(self._open.values()) | ({self._part} if self._part else set()):
            self._close(fh)
        self._open.clear()

    def _close(self, fh: TextIO) -> None:
        fh.close()
        self._closed = Path(fh.name)
        if fh is self._part:
            self._part = None
            self._open = {n: f for n, f in self._open.items() if f is not fh}
        self._part_records = 0

    def _start(self, node: str, out: Path) -> TextIO:
        """Open ``node``'s file in ``out``, under a name no other node of this set has (packed:
        the part being written, or the next one)."""
        out.mkdir(parents=True, exist_ok=True)
        if self._packed:
            if self._part is None:
                name = f"{self._part_name}-{len(self._used):05d}.jsonl"
                self._part = (out / name).open("w", encoding="utf-8", newline="\n")
                self._used.add(self._part.name)
                self._part_records = 0
            self._open[node] = self._part
            return self._part
        name = _file_name(node)
        while name in self._used:  # two node names made safe alike: keep both files
            name += "_"
        self._used.add(name)
        fh = (out / f"{name}.jsonl").open("w", encoding="utf-8", newline="\n")
        self._open[node] = fh
        return fh


_BOOT = '"boot":'
_SOURCE = '"source":'
#: What JSON escapes in a string (json.dumps with ensure_ascii=False): quotes, backslashes, controls.
_ESCAPED = re.compile(r'["\\\x00-\x1f]')


class _Quoted:
    """:func:`_string` of the texts a log set repeats (node and request ids, times, ops), kept: a
    replay writes each several times a page. Forgotten wholesale past :data:`_KEPT` texts."""

    def __init__(self) -> None:
        self._kept: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        hit = self._kept.get(text)
        if hit is None:
            if len(self._kept) >= _KEPT:
                self._kept.clear()
            hit = self._kept[text] = _string(text)
        return hit


_KEPT = 1 << 16


def _string(text: str) -> str:
    """``text`` as a JSON string, as json.dumps(ensure_ascii=False) writes it."""
    return f'"{text}"' if _ESCAPED.search(text) is None else json.dumps(text, ensure_ascii=False)


def _file_name(node: str) -> str:
    """A node name made safe as a file name (the node itself stays in every record)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in node) or "node"
