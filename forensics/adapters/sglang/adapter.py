"""The SGLang adapters: a server's log output, and its request log files.

``sglang-server`` reads what a prefill or decode server prints (its stdout or log file): the
request log in either form, the timing statistics, transfer failures and start-up lines, all
interleaved; every other line is ignored. ``sglang-requests`` reads the request log written
to files (``--log-requests-target DIR``, ``HOST_RANK.log``), which holds request lines only.
Each is read with its companions, which the ingest finds where :data:`_COMPANIONS` says: a server
log with its request-log folder, a request-log file with its server's log.

A file is read twice, in this process: a first pass learns what single lines need from the whole
file (the node's role, each prompt's real length, precise finish times), the second translates.
Each line is read once: the first pass keeps, line by line, what the second needs of it (its time
and what its format read, not its text), up to ``KEEP_LINES`` lines a file; past them, and for
any line whose length is not the one the first pass saw, the second pass reads it again.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import datetime as dt
import gc
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from forensics.adapters.base import (
    Adapter,
    Beside,
    Companions,
    LineFormat,
    Lines,
    Notes,
    Options,
    Outcome,
    Untranslatable,
    first_object,
    no_companions,
    node_of,
)
from forensics.adapters.sglang.eras import era
from forensics.adapters.sglang.formats import CONFIG, FORMATS, read_line
from forensics.adapters.sglang.log import Batches, Boots, Facts, LogLine, Seen, Server, split

#: What only an SGLang server prints, its formats' signs: a file with any of these in its first lines
#: is one (a rotated piece may hold nothing but error lines: the capacity and length checks', the
#: integrity checks').
_SERVER_MARKS = tuple(sign for fmt in FORMATS for sign in fmt.signs)
#: The files a file is read with: a server log's ``--log-requests-target`` folder, the folder named
#: after its node beside it (``prefill-0.log`` and ``prefill-0/HOST_RANK.log``); and the server log
#: a request-log file belongs to, the ``NODE.log`` beside a folder ``NODE`` holding the file, else
#: the one SGLang server log in the file's own folder.
_COMPANIONS = {"requests": Beside(("node",), ("sglang-requests", "sglang-server")),
               "server": Beside(("up", "here"), ("sglang-server",), one=True)}
_EVIDENCE = ("request level: who was served where and when, and the handoff's token counts; "
             "no page records, so victims are named by replay")


def _translate(lines: Lines, path: Path, options: Options, notes: Notes,
               companions: Companions = no_companions) -> Iterator[Outcome]:
    kept = _Kept()
    with _first_pass() as frozen:
        facts = _learn(lines, Facts(Server(node=options.node_for(path))), options, kept)
        server = None
        said = facts.server
        if said.role_for(options) is None and not said.roles_seen and (facts.seen.received_at or facts.seen.finished):
            # (a file of error lines alone is a server's own: no request log)
            server = next(iter(companions("server")), None)
            if server is not None:  # a --log-requests-target file: its server's log says the rest
                facts = _learn(server[1], Facts(Server(node=options.node or node_of(server[0]))), options)
                kept.clear()
                facts = _learn(lines, facts, options, kept)
                notes.add("server", "{n} request-log file(s) read with the server log beside them "
                          f"({server[0].name})")
        else:
            for _, beside in companions("requests"):  # its --log-requests-target folder
                theirs = _learn(beside, Facts(Server(node=facts.server.node)), options)
                facts.seen.finished |= theirs.seen.finished
                facts.seen.received |= theirs.seen.received  # (their ids: whether the server assigned them)
                facts.seen.warmups |= theirs.seen.warmups
                for rid, room in theirs.seen.rooms.items():
                    facts.seen.rooms.setdefault(rid, room)
                for rid, at in theirs.clock.finish_ts.items():
                    facts.clock.finish_ts.setdefault(rid, at)
                for rid, at in theirs.seen.received_at.items():
                    facts.seen.received_at.setdefault(rid, at)
                for rid, tokens in theirs.seen.cached.items():  # (what prefill_started says it cached)
                    facts.seen.cached.setdefault(rid, tokens)
                for status, n in theirs.seen.finish_status.items():
                    facts.seen.finish_status[status] = facts.seen.finish_status.get(status, 0) + n
        refused = len(facts.seen.pending_context)  # (the tokenizer's rejections: a 400 each, no finish line)
        if untied := facts.seen.tie_pending_context():
            notes.add("context_unnamed", "{n} context-length rejections name no request this file received: "
                      "recorded from the request log beside it where there is one (docs/adapters.md)", untied)
        if server is None and (differs := _access_differs(facts.seen, refused)) is not None:
            notes.add("access", f"the HTTP statuses clients got differ from the finish lines' ({differs}): "
                      "finding evidence.access_status_differs", 1)
        facts.calibrate()
        facts.server.era = era(facts.server.marks)
        if facts.server.era is not None:
            notes.add("era", f"{{n}} file(s) in the format of SGLang {facts.server.era}")
        if facts.server.role_for(options) is None:
            notes.add("role", "{n} file(s) say nothing of their server's role (no server_args, no time stats): "
                      "read as a unified server, whose finishes are the client's answers; pass --role prefill "
                      "or --role decode (finding evidence.role_unknown)")
    facts.seen.by_room = options.request_ids == "room" or (
        options.request_ids == "auto" and _server_assigned(facts.seen))
    if facts.seen.by_room and options.request_ids == "auto":
        notes.add("request_ids", "{n} file(s) whose server assigned every request id itself (a uuid4 hex each, no "
                  "client's or router's): requests named by bootstrap room (room-B), which both servers of a "
                  "request log, as --request-ids room does (--request-ids rid keeps the rids)")
    if facts.seen.warmups:
        notes.add("warmup", "{n} requests the server sent itself (bootstrap host 2.2.2.2 or a HEALTH_CHECK rid: its "
                  "start-up warmup or a health check) left out: no client's request, no transfer",
                  len(facts.seen.warmups))
    if len(facts.boots.lines) > 1:
        notes.add("restart", f"{{n}} restart(s) of the server inside one file (a server_args line each): each a "
                  f"new boot of its node, its pool fresh; requests in flight at each, left unfinished: "
                  f"{', '.join(map(str, facts.boots.in_flight_at_restart))}", len(facts.boots.lines) - 1)
    try:
        outcomes = _second_pass(lines, kept, facts, options, notes)
        if len(facts.boots.lines) < 2 and len(facts.boots.times) > 1:  # a request-log file beside a restarted server
            outcomes = _booted_beside(outcomes, facts.boots)
        yield from _booted(outcomes, facts.boots.lines)
    finally:
        if frozen:
            gc.unfreeze()


def _booted(outcomes: Iterator[Outcome], boot_lines: list[int]) -> Iterator[Outcome]:
    """Each record of a line after the file's k-th ``server_args`` line on boot k (from 0): a
    server restarted inside one captured file is a new process, its pool afresh."""
    if len(boot_lines) < 2:
        yield from outcomes
        return
    for line_no, text, out in outcomes:
        boot = bisect.bisect_right(boot_lines, line_no) - 1
        if boot > 0 and isinstance(out, list):
            for record in out:
                record["boot"] = boot
        yield line_no, text, out


def _booted_beside(outcomes: Iterator[Outcome], boots: Boots) -> Iterator[Outcome]:
    """The records of a --log-requests-target file (no start-up lines of its own) on the boots of
    its server's log beside it: a request on the boot the server's lines about it were on, else the
    boot whose start-up came before the record's time (at the start-up line's resolution; a record
    in the same second as a whole-second restart is taken as before it)."""
    starts = [(ts if precise else ts.replace(microsecond=0), precise) for ts, precise in boots.times]
    for line_no, text, out in outcomes:
        if isinstance(out, list):
            for record in out:
                boot = boots.of.get(record.get("request_id") or "")
                if boot is None:
                    at = dt.datetime.fromisoformat(record["ts"].replace("Z", "+00:00"))
                    boot = sum(1 for ts, precise in starts[1:]
                               if (at >= ts if precise else at.replace(microsecond=0) > ts))
                if boot > 0:
                    record["boot"] = boot
        yield line_no, text, out


def _second_pass(lines: Lines, kept: _Kept, facts: Facts, options: Options,
                 notes: Notes) -> Iterator[Outcome]:
    facts.clock.last_ts = None
    facts.batches.rewind()
    it = iter(lines())
    # the lines the first pass kept (``it`` last: zip takes no line past them, and stops at the end of a
    # file shorter than the first pass saw)
    for length, line, k, value, (line_no, text) in zip(kept.lengths, kept.lines, kept.formats, kept.values, it,
                                                       strict=False):
        if length != len(text):  # (a file that changed under the first pass)
            line, k, value = read_line(text, options)
        yield line_no, text, _translated(line, k, value, facts, options, notes)
    for line_no, text in it:  # (past what the first pass kept)
        line, k, value = read_line(text, options)
        yield line_no, text, _translated(line, k, value, facts, options, notes)


def _translated(line: LogLine, k: int, value: Any, facts: Facts, options: Options,
                notes: Notes) -> list[dict[str, Any]] | Untranslatable | None:
    """What the second pass makes of a line read as ``(line, k, value)``; the line's time taken
    as the last one seen."""
    if facts.seen.warmups and getattr(value, "rid", None) in facts.seen.warmups:  # the server's own request
        out: list[dict[str, Any]] | Untranslatable | None = []
    else:
        out = None if k < 0 else _records(FORMATS[k], value, line, facts, options, notes)
    if line.ts is not None:
        facts.clock.last_ts = line.ts
    return _by_room(out, facts.seen, notes) if facts.seen.by_room and isinstance(out, list) else out


#: An id SGLang assigns a request itself where the client gives none (``uuid.uuid4().hex``, io_struct)
_SERVER_RID = re.compile(r"[0-9a-f]{32}")


def _server_assigned(seen: Seen) -> bool:
    """Whether every request the file received (its warmups aside) has an id its server assigned
    and a bootstrap room: then the two servers of a request logged two ids, and only the room ties
    them (a client's id on both is named by the room just as well)."""
    rids = [rid for rid in seen.received if rid not in seen.warmups]
    return bool(rids) and all(_SERVER_RID.fullmatch(rid) and rid in seen.rooms for rid in rids)


def _by_room(records: list[dict[str, Any]], seen: Seen, notes: Notes) -> list[dict[str, Any]]:
    """``--request-ids room``: each record names its request by the bootstrap room its file
    logs for the rid (``room-B``, as its transfers are named), so that two servers that each
    assigned their own rid name the request alike. A request without a room keeps its rid."""
    out = []
    for r in records:
        rid = r.get("request_id")
        room = seen.rooms.get(rid) if rid is not None else None
        if room is None:
            if rid is not None:
                notes.add("no_room", "{n} records name a request with no bootstrap room in the file: "
                          "kept under its rid (--request-ids room)")
            out.append(r)
            continue
        out.append({**r, "request_id": f"room-{room}"})
    return out


#: Lines a file's first pass keeps for its second: at most about 0.4 GB (measured: the process peaked
#: 0.41 GB above the previous commit's on a million lines of 0.5.23's text log).
KEEP_LINES = 1_000_000


class _Kept:
    """What the first pass keeps of each line, line by line: its length (to check that the second
    pass reads the same line), its time and ranks (a LogLine without text, one for the lines that
    share them), its format (the index in FORMATS, -1 for none) and what the format read of it."""

    def __init__(self) -> None:
        self.lengths = array.array("q")
        self.lines: list[LogLine] = []
        self.formats = array.array("b")
        self.values: list[Any] = []
        self.shared: dict[tuple[Any, ...], LogLine] = {}

    def add(self, text: str, line: LogLine, k: int, value: Any) -> None:
        key = (line.ts, line.precise, line.undated, line.dp, line.prefixed, line.tp)
        bare = self.shared.get(key)
        if bare is None:
            bare = self.shared[key] = LogLine(line.ts, line.precise, "", None, line.undated, line.dp, line.prefixed,
                                              line.tp)
        self.lengths.append(len(text))
        self.lines.append(bare)
        self.formats.append(k)
        self.values.append(value)

    def clear(self) -> None:
        del self.lengths[:], self.formats[:]
        self.lines.clear()
        self.values.clear()
        self.shared.clear()


@contextlib.contextmanager
def _first_pass() -> Iterator[list[bool]]:
    """Python's cyclic garbage collector kept off the first pass and what it keeps. The pass
    makes no cycles; what it keeps (a few objects a line, a million lines) is otherwise walked by
    the collector three times over as it ages (measured: 12 % of the adapter's time on a
    million lines), and by every full collection after. So the collector is paused for the pass
    (no other code runs meanwhile: it yields nothing), and what exists at its end is frozen
    (``gc.freeze``: still freed by reference counting, not walked) until the file is translated;
    the flag yielded says whether it was frozen (not where something else had frozen objects)."""
    was = gc.isenabled()
    gc.disable()
    frozen: list[bool] = []
    try:
        yield frozen
        if gc.get_freeze_count() == 0:
            gc.freeze()
            frozen.append(True)
    finally:
        if was:
            gc.enable()


def _learn(lines: Lines, facts: Facts, options: Options, kept: _Kept | None = None) -> Facts:
    """The first pass over a file's lines, into ``facts`` (and, given ``kept``, what the second
    pass needs of each line, into it)."""
    facts.clock.last_ts = None
    facts.boots.lines, facts.boots.in_flight_at_restart = [], []  # (the lines of this file, not of one read before)
    facts.batches = Batches()
    for line_no, text in lines():
        line, k, value = read_line(text, options)
        value = learn_line(line_no, line, k, value, facts, options)
        if line.ts is not None:
            facts.clock.last_ts = line.ts
        if kept is not None and len(kept.lengths) < KEEP_LINES:
            kept.add(text, line, k, value)
    return facts


def learn_line(line_no: int, line: LogLine, k: int, value: Any, facts: Facts, options: Options) -> Any:
    """What the first pass learns from one line (read as format ``k`` into ``value``), into
    ``facts``; what of it the second pass reads (None for an access line)."""
    if k < 0 and value is not None:  # an access line: the HTTP status a client got
        facts.seen.access[value] = facts.seen.access.get(value, 0) + 1
        return None
    if k < 0 or isinstance(value, Untranslatable):
        return value
    value = FORMATS[k].learn(value, line, facts, options)
    if k == CONFIG and value.what == "server_args":  # a process of the server starts
        if facts.boots.lines:
            # (received and never finished, but neither the server's own nor refused by its tokenizer)
            open_ = facts.seen.received - facts.seen.finished - facts.seen.warmups
            facts.boots.in_flight_at_restart.append(max(0, len(open_) - len(facts.seen.pending_context)))
        facts.boots.lines.append(line_no)
        if line.ts is not None:
            facts.boots.times.append((line.ts, line.precise))
    elif len(facts.boots.lines) > 1 and isinstance(rid := getattr(value, "rid", None), str):
        facts.boots.of[rid] = len(facts.boots.lines) - 1
    return value


def _access_differs(seen: Seen, refused: int) -> str | None:
    """Where the access lines' statuses (what the clients got) are not those of the finish lines
    (and the tokenizer's 400s): both, status by status; None where they agree or the file has
    no access line."""
    if not seen.access:
        return None
    said = dict(seen.finish_status)
    if refused:
        said[400] = said.get(400, 0) + refused
    if said == seen.access:
        return None
    return f"access lines {_by_status(seen.access)}; finish lines {_by_status(said)}"


def _by_status(counts: dict[int, int]) -> str:
    return ", ".join(f"{n:,} x {status}" for status, n in sorted(counts.items())) or "none"


def _records(fmt: LineFormat[LogLine, Facts, Any], value: Any, line: LogLine, facts: Facts, options: Options,
             notes: Notes) -> list[dict[str, Any]] | Untranslatable | None:
    if isinstance(value, Untranslatable):
        return value
    try:
        records = fmt.translate(value, line, facts, options, notes)
    except Untranslatable as exc:
        return exc
    return records or None


def _requests_sniff(head: Sequence[str]) -> bool:
    doc = first_object(head)
    if doc is None:  # from 0.5.12 the JSON lines come after a time: [2026-11-02 08:00:02] {...}
        first = next((t for t in head if t.strip()), "")
        doc = split(first, None).doc
    return doc is not None and str(doc.get("event", "")).startswith("request.") and "kind" not in doc


def _server_sniff(head: Sequence[str]) -> bool:
    return any(mark in text for text in head for mark in _SERVER_MARKS)


ADAPTERS = (
    Adapter(
        name="sglang-requests",
        reads="SGLang's request log files (--log-requests --log-requests-format json "
              "--log-requests-target DIR): request received and finished events",
        evidence=_EVIDENCE,
        sniff=_requests_sniff,
        translate=_translate,
        companions=_COMPANIONS,
    ),
    Adapter(
        name="sglang-server",
        reads="an SGLang prefill or decode server's log output: request log (JSON or text), "
              "request time stats, KV-transfer failures, server_args and pool size",
        evidence=_EVIDENCE,
        sniff=_server_sniff,
        translate=_translate,
        companions=_COMPANIONS,
    ),
)
