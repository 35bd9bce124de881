"""Writing canonical records from inside an engine: small, thread-safe, standard library only.

An engine that calls this at its page decisions produces the page records that make exposure
analysis exact (log-schema.md section 5)::

    from forensics.emit import Emitter

    log = Emitter("/var/log/kv", node="decode-3")          # one per process
    log.config(role="decode", engine="sglang", engine_version="0.5.21", model="glm-5.3",
               context_length=1_048_576, page_size=64, pool_pages=32_769)
    log.request("r1", "admitted")
    log.kv("r1", "alloc", pages)                           # pages: "0-63,128" or page ids
    log.transfer("x1", "r1", "completed", src_node="prefill-0", dst_node="decode-3", tokens=1)
    log.kv("r1", "write", landed, source="transfer")
    log.kv("r1", "read", pages)                            # at decode start
    log.kv("r1", "free", pages)

Where SGLang would call it is in docs/emit.md. The emitter numbers ``seq`` per node and keeps
``boot``: each new emitter of a node starts the next boot (the count is kept in
``DIR/NODE/boot``), because a new process starts the node's pool afresh. Records are JSON
Lines in ``DIR/NODE/boot-BBBBBB.NNNNNN.jsonl``; a file is closed and the next one started once
it passes ``max_bytes``. Every record is flushed as written (``fsync=True`` also syncs it), so
a crash loses at most the record being written, which ingest then quarantines as not JSON.
Importing this module loads nothing beyond the standard library.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

OPS = ("alloc", "share", "write", "read", "free")
REQUEST_EVENTS = ("received", "admitted", "rejected", "prefill_started", "prefill_done", "decode_started",
                  "finished")
TRANSFER_EVENTS = ("started", "completed", "failed")
ROLES = ("prefill", "decode", "router")


def page_string(pages: str | Iterable[int]) -> str:
    """Page ids (any order, repeats allowed) as the schema's inclusive ranges: ``[3, 1, 2, 7]`` is
    ``"1-3,7"``; a string is taken as already written. A numpy array's runs are found vectorised
    (the reference engine's pages), so numpy is imported only for a caller that has it already."""
    if isinstance(pages, str):
        return pages
    if hasattr(pages, "__array__"):
        starts, ends = _array_runs(pages)
    else:
        starts, ends = _runs(sorted(set(int(p) for p in pages)))
    if not starts:
        raise ValueError("a page list is never empty")
    if starts[0] < 0:
        raise ValueError(f"page ids are >= 0, not {starts[0]}")
    return ranges_text(starts, ends)


def ranges_text(starts: Iterable[int], ends: Iterable[int]) -> str:
    """The page string of runs of page ids, each from ``starts[i]`` to ``ends[i]`` (sorted, apart):
    ``"1-3,7"``."""
    return ",".join(f"{a}-{b}" if b > a else str(a) for a, b in zip(starts, ends, strict=True))


def _runs(ids: list[int]) -> tuple[list[int], list[int]]:
    """The first and last id of each run of consecutive ``ids`` (sorted, distinct)."""
    starts: list[int] = []
    ends: list[int] = []
    for p in ids:
        if ends and p == ends[-1] + 1:
            ends[-1] = p
        else:
            starts.append(p)
            ends.append(p)
    return starts, ends


#: Arrays of at most this many pages are run through in Python, longer ones vectorised.
_SMALL = 64


def _array_runs(pages: Any) -> tuple[list[int], list[int]]:
    """:func:`_runs` of a numpy array of page ids."""
    import numpy as np

    p = np.asarray(pages, dtype=np.int64)
    if len(p) <= _SMALL:  # (a few pages: a Python pass is 3 to 6 times quicker than numpy's calls)
        ids = p.tolist()
        return _runs(ids if all(b > a for a, b in zip(ids, ids[1:], strict=False)) else sorted(set(ids)))
    if len(p) > 1:
        steps = p[1:] - p[:-1]
        if bool((steps == 1).all()):  # (one run: a prompt's pages, most often)
            return [int(p[0])], [int(p[-1])]
    elif len(p):
        return [int(p[0])], [int(p[0])]
    if len(p) > 1 and not bool(np.all(p[1:] > p[:-1])):
        p = np.unique(p)
    if not len(p):
        return [], []
    cuts = np.flatnonzero(p[1:] - p[:-1] != 1)
    return (p[np.concatenate(([0], cuts + 1))].tolist(), p[np.concatenate((cuts, [len(p) - 1]))].tolist())


def _rfc3339(ns: int) -> str:
    t = dt.datetime.fromtimestamp(ns // 1000 / 1e6, tz=dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Emitter:
    """Canonical records of one node, numbered and written safely from any thread."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        node: str,
        *,
        boot: int | None = None,
        max_bytes: int = 256 << 20,
        fsync: bool = False,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        if not node:
            raise ValueError("a node name is needed")
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.node = node
        self.dir = Path(directory) / _safe(node)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.boot = self._next_boot() if boot is None else boot
        self.seq = 0
        self.max_bytes = max_bytes
        self._fsync = fsync
        self._clock = clock
        self._lock = threading.Lock()
        self._index = 0
        self._fh: IO[str] | None = None
        self._size = 0

    # -- records ---------------------------------------------------------------------------

    def config(self, *, role: str, engine: str, engine_version: str, model: str, context_length: int,
               page_size: int, pool_pages: int, kv_bytes_per_token: int | None = None) -> None:
        """The node's serving configuration, at start and whenever it changes."""
        _check(role, ROLES, "role")
        self.record("config", role=role, engine=engine, engine_version=engine_version, model=model,
                    context_length=context_length, page_size=page_size, pool_pages=pool_pages,
                    kv_bytes_per_token=kv_bytes_per_token)

    def request(self, request_id: str, event: str, **fields: Any) -> None:
        """A request's lifecycle event (``received`` needs ``tenant_id`` and ``prompt_tokens``)."""
        _check(event, REQUEST_EVENTS, "request event")
        self.record("request", request_id=request_id, event=event, **fields)

    def kv(self, request_id: str, op: str, pages: str | Iterable[int], *, source: str | None = None) -> None:
        """What a request did to pages: alloc, share, write (``source``: compute, transfer,
        decode), read (at decode start), free."""
        _check(op, OPS, "op")
        self.record("kv", request_id=request_id, op=op, pages=page_string(pages), source=source)

    def transfer(self, transfer_id: str, request_id: str, event: str, *, src_node: str, dst_node: str,
                 **fields: Any) -> None:
        """A KV handoff: started, completed or failed (optional ``tokens``, ``bytes``, pages)."""
        _check(event, TRANSFER_EVENTS, "transfer event")
        for key in ("src_pages", "dst_pages"):
            if fields.get(key) is not None:
                fields[key] = page_string(fields[key])
        self.record("transfer", transfer_id=transfer_id, request_id=request_id, event=event,
                    src_node=src_node, dst_node=dst_node, **fields)

    def record(self, kind: str, **fields: Any) -> None:
        """Any record: ``ts``, ``node``, ``boot`` and ``seq`` are added; None fields left out."""
        body = {k: v for k, v in fields.items() if v is not None}
        with self._lock:
            doc = {"kind": kind, "ts": _rfc3339(self._clock()), "node": self.node, "boot": self.boot,
                   "seq": self.seq, **body}
            line = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
            self._write(line)
            self.seq += 1

    # -- files -----------------------------------------------------------------------------

    def _write(self, line: str) -> None:
        size = len(line.encode("utf-8"))
        if self._fh is None or (self._size and self._size + size > self.max_bytes):
            self._rotate()
        assert self._fh is not None
        self._fh.write(line)
        self._fh.flush()
        if self._fsync:
            os.fsync(self._fh.fileno())
        self._size += size

    def _rotate(self) -> None:
        if self._fh is not None:
            self._fh.close()
        self._index += 1
        path = self.dir / f"boot-{self.boot:06d}.{self._index:06d}.jsonl"
        self._fh = path.open("a", encoding="utf-8", newline="\n")
        self._size = path.stat().st_size

    def _next_boot(self) -> int:
        """One more than the last boot of this node in the directory (0 for the first)."""
        counter = self.dir / "boot"
        try:
            last = int(counter.read_text().strip())
        except (FileNotFoundError, ValueError):
            last = -1
        boot = last + 1
        tmp = counter.with_suffix(".tmp")
        tmp.write_text(f"{boot}\n")
        os.replace(tmp, counter)
        return boot

    @property
    def files(self) -> list[Path]:
        """The files this boot has written."""
        return sorted(self.dir.glob(f"boot-{self.boot:06d}.*.jsonl"))

    def close(self) -> None:
        """Flush and close every file."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> Emitter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; one of {', '.join(allowed)}")


def _safe(node: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in node)
