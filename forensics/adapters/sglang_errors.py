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
from typing import Any

from forensics.adapters.base import Notes, Options
from forensics.adapters.sglang_log import Facts, LogLine, rfc3339
from forensics.adapters.sglang_requests import CAPACITY_ERROR, CONTEXT_ERROR, LENGTH_ERROR

_RID = re.compile(r"rid='(?P<rid>[^']*)'")
_ROOM = re.compile(r"Context corruption detected: Request (?P<rid>\S+) \(bootstrap_room=")
_CHECKSUM = re.compile(r"KV checksum mismatch (?:on a peer rank )?req=(?P<rid>\S+) bootstrap_room=")


def _match(msg: str) -> tuple[str, re.Match[str]] | None:
    if "exceeds" in msg:
        if (m := LENGTH_ERROR.search(msg)) is not None:
            return "length", m
        if (m := CAPACITY_ERROR.search(msg)) is not None:
            return "capacity", m
    elif "is longer than the model" in msg:
        if (m := CONTEXT_ERROR.search(msg)) is not None:
            return "context", m
    elif "Context corruption detected" in msg:
        if (m := _ROOM.search(msg)) is not None:
            return "bootstrap_room_mismatch", m
    elif "KV checksum mismatch" in msg:
        if (m := _CHECKSUM.search(msg)) is not None:
            return "kv_checksum_mismatch", m
    return None


def learn(line: LogLine, facts: Facts, options: Options) -> bool:
    """First pass: the prompt length, limit and DP rank an error line reveals; whether it was one."""
    hit = _match(line.msg)
    if hit is None:
        return False
    what, m = hit
    if what == "length":
        named = _RID.search(line.msg)
        if named is not None:
            facts.learn_prompt(named["rid"], int(m.group(1)), 3)
            facts.limit[named["rid"]] = int(m.group(2))
            facts.learn_dp(named["rid"], line)
    elif what == "capacity":
        facts.learn_prompt(m.group(1), int(m.group(2)), 3)
        facts.limit.setdefault(m.group(1), int(m.group(3)))
        facts.learn_dp(m.group(1), line)
    elif what == "context":  # tied to its request when the pass is over (Facts.tie_pending_context)
        facts.pending_context.append((line.ts, int(m.group(1)), int(m.group(2))))
    else:
        facts.marks.add(f"integrity.{what}")
        facts.learn_dp(m["rid"], line)
        facts.failed.add(m["rid"])
    return True


def translate(line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]] | None:
    """The records of an error line (only where no finish line says the same); None for another kind."""
    hit = _match(line.msg)
    if hit is None:
        return None
    what, m = hit
    if what == "context":
        return []  # recorded with the request it is tied to, on its receive line
    base = {"kind": "request", "ts": rfc3339(line.when())}
    if what == "length":
        found = _RID.search(line.msg)
        if found is None:
            return []
        rid, limit = found["rid"], int(m.group(2))
    elif what == "capacity":
        rid, limit = m.group(1), int(m.group(3))
    else:
        rid, limit = m["rid"], 0
    if rid in facts.finished:
        return []  # its finish line records it, with the same message
    node = facts.node_of_line(line, rid)
    if what in ("length", "capacity"):
        return [{**base, "request_id": rid, "node": node, "event": "rejected", "reason": "input_too_long",
                 "limit_tokens": limit}]
    return [{**base, "request_id": rid, "node": node, "event": "finished", "status": 500, "finish_reason": what}]
