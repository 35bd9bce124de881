"""SGLang's decode retraction: running requests' pages freed under memory pressure.

Reference: ``Scheduler.update_running_batch`` (``managers/scheduler.py``; 0.5.5 :1918, 0.5.11
:2861, 0.5.19 :3925, 0.5.23 :4526), where a decode step would find too few free pages: it retracts
running requests (``retract_decode``), frees their pages, and puts them back in the queue (in
disaggregated decode the retracted queue, their KV kept on host and restored into pages taken
afresh, or, without a backup from 0.5.21, aborted). Its line, every scheduler of the DP rank (at
INFO in 0.5.5, a warning from 0.5.7)::

    KV cache pool is full. Retract requests. #retracted_reqs: N, #new_tokens_gained: T, ...
    Testing retraction. #retracted_reqs: N, ...      (SGLANG_TEST_RETRACT: retracted all the same)

It names no request (each one's count comes in its finish's ``meta_info``: requests.py).

Canonical record (schema v1.1, docs/schema-v1.1.md, "A retraction"): on a decode node a ``step``
with ``cache: "retracted"`` and no ``running`` (the line gives no batch), on the line's node (its DP
rank's pool with DP attention), at the line's time; from the DP rank's first scheduler only (the
others repeat it).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339

_RETRACT = re.compile(r"(?:KV cache pool is full\. Retract requests\.|Testing retraction\.) #retracted_reqs: (\d+)")


class RetractLine(NamedTuple):
    """A retraction read: how many requests went back to the queue (aborted ones not counted)."""

    retracted: int


def read(line: LogLine, options: Options) -> RetractLine | None:
    """A retraction, None for a line of another kind."""
    if not line.msg.startswith(("KV cache pool is full", "Testing retraction")) or (
            m := _RETRACT.match(line.msg)) is None:
        return None
    return RetractLine(int(m[1]))


def learn(r: RetractLine, line: LogLine, facts: Facts, options: Options) -> RetractLine:
    """First pass: nothing to learn."""
    return r


def translate(r: RetractLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The retraction's step record, from the DP rank's first scheduler of a decode server."""
    if facts.server.role_for(options) != "decode" or not facts.server.first_of_dp_rank(line.tp):
        return []
    return [{"kind": "step", "ts": rfc3339(line.when()), "node": facts.node_of_line(line), "cache": "retracted"}]


class RetractFormat(LineFormat[LogLine, Facts, RetractLine]):
    """The decode retraction lines."""

    signs = ()  # (a retraction alone does not make a file a server's)
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
