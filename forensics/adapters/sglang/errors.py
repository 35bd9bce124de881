"""SGLang's error lines about one request: length and capacity rejections, integrity checks.

References (their lines in each release are in the fixtures' ``SOURCE.json``):

- ``validate_input_length`` (``managers/utils.py``) and ``Req.set_finish_with_abort``: ``Input
  length (N tokens) exceeds the maximum allowed length (M tokens). ..., self.rid='R'``, logged by
  the scheduler (TP rank 0, or every rank in releases that do not check);
- the disaggregation queues' capacity check (``disaggregation/prefill.py``, ``decode.py``):
  ``Request R exceeds the maximum number of tokens: N > M``;
- the tokenizer's context check (``managers/tokenizer_manager.py``), raised and logged by the
  HTTP server: ``[http_server] Error: The input (N tokens) is longer than the model's context
  length (C tokens).`` The line names no request: it is tied to the latest request received
  by then that never finished (the one the tokenizer was validating), in this file or in the
  request log beside it, and its ``rejected`` goes out with that request's receive line;
- decode's integrity checks: ``Context corruption detected: Request R (bootstrap_room=E)
  received metadata from bootstrap_room=A`` (0.5.9 on) and ``KV checksum mismatch req=R
  bootstrap_room=B expected=... got=...`` (0.5.21 on, ``--disaggregation-enable-kv-checksum``).

Each request's record comes from its finish line where the file has one (its abort message
says the same); these lines give a prompt's real length and limit, the DP rank that saw the
request, and the records themselves where the request log is not in the file: ``rejected``
(``input_too_long``, with ``limit_tokens``) for the first two, a ``finished`` 500 with
``finish_reason`` ``bootstrap_room_mismatch`` or ``kv_checksum_mismatch`` for the last two.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339
from forensics.adapters.sglang.requests import CAPACITY_ERROR, CONTEXT_ERROR, LENGTH_ERROR

_RID = re.compile(r"rid='(?P<rid>[^']*)'")
_ROOM = re.compile(r"Context corruption detected: Request (?P<rid>\S+) \(bootstrap_room=")
_CHECKSUM = re.compile(r"KV checksum mismatch (?:on a peer rank )?req=(?P<rid>\S+) bootstrap_room=")


class ErrorLine(NamedTuple):
    """An error line read: what it says (``length``, ``capacity``, ``context``, or the integrity
    check's finish reason), the request it names, the prompt's tokens and the limit (the
    context length for ``context``)."""

    what: str
    rid: str | None  # (a length error names it after its message, where it does)
    tokens: int = 0
    limit: int = 0


def read(line: LogLine, options: Options) -> ErrorLine | None:
    """The error on this line, None for a line of another kind."""
    msg = line.msg
    if "exceeds" in msg:
        if (m := LENGTH_ERROR.search(msg)) is not None:
            named = _RID.search(msg)
            return ErrorLine("length", None if named is None else named["rid"], int(m.group(1)), int(m.group(2)))
        if (m := CAPACITY_ERROR.search(msg)) is not None:
            return ErrorLine("capacity", m.group(1), int(m.group(2)), int(m.group(3)))
    elif "is longer than the model" in msg:
        if (m := CONTEXT_ERROR.search(msg)) is not None:
            return ErrorLine("context", None, int(m.group(1)), int(m.group(2)))
    elif "Context corruption detected" in msg:
        if (m := _ROOM.search(msg)) is not None:
            return ErrorLine("bootstrap_room_mismatch", m["rid"])
    elif "KV checksum mismatch" in msg:
        if (m := _CHECKSUM.search(msg)) is not None:
            return ErrorLine("kv_checksum_mismatch", m["rid"])
    return None


def learn(e: ErrorLine, line: LogLine, facts: Facts, options: Options) -> ErrorLine:
    """First pass: the prompt length, limit and DP rank an error line reveals."""
    if e.what == "length":
        if e.rid is not None:
            facts.seen.learn_prompt(e.rid, e.tokens, 3)
            facts.seen.limit[e.rid] = e.limit
            facts.seen.learn_dp(e.rid, line)
    elif e.what == "capacity":
        assert e.rid is not None
        facts.seen.learn_prompt(e.rid, e.tokens, 3)
        facts.seen.limit.setdefault(e.rid, e.limit)
        facts.seen.learn_dp(e.rid, line)
    elif e.what == "context":  # tied to its request when the pass is over (Facts.tie_pending_context)
        facts.seen.pending_context.append((line.ts, e.tokens, e.limit))
    else:
        assert e.rid is not None
        facts.server.marks.add(f"integrity.{e.what}")
        facts.seen.learn_dp(e.rid, line)
        facts.seen.failed.add(e.rid)
    return e


def translate(e: ErrorLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The records of an error line (only where no finish line says the same)."""
    if e.what == "context":
        return []  # recorded with the request it is tied to, on its receive line
    ts = rfc3339(line.when())
    if e.rid is None or e.rid in facts.seen.finished:
        return []  # names no request; or its finish line records it, with the same message
    base = {"kind": "request", "ts": ts, "request_id": e.rid, "node": facts.node_of_line(line, e.rid)}
    if e.what in ("length", "capacity"):
        return [{**base, "event": "rejected", "reason": "input_too_long", "limit_tokens": e.limit}]
    return [{**base, "event": "finished", "status": 500, "finish_reason": e.what}]


class ErrorFormat(LineFormat[LogLine, Facts, ErrorLine]):
    """The error lines about one request."""

    signs = ("exceeds the maximum number of tokens: ", "exceeds the maximum allowed length (",
             "Context corruption detected: Request ", "KV checksum mismatch")
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
