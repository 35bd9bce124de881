"""SGLang's cache flush: the node's KV pool and prefix cache emptied while it was idle.

Reference: ``Scheduler.flush_cache`` (``managers/scheduler.py``; 0.5.11 :3343, 0.5.21 :5187, 0.5.23
:5518), run by the ``/flush_cache`` endpoint and after a weight update. It flushes only where the
scheduler is fully idle (no running batch, waiting, preallocation or transfer queue:
``is_fully_idle``), and then resets the prefix cache (``tree_cache.reset``), the token pool
(``token_to_kv_pool_allocator.clear``: the free list ``1..n`` sorted, nothing released, as at the
start) and the count of decode steps the ``Decode batch`` line is printed by (``reset_metrics``:
``forward_ct_decode = 0``). Its line::

    Cache flushed successfully!

printed by every scheduler to 0.5.12, and from 0.5.18 by each DP group's stats-logging rank only
(attention-TP rank 0). A busy server logs ``Cache not flushed because there are pending
requests`` instead, and nothing is reset.

Canonical record (schema v1.1, docs/schema-v1.1.md, "A cache flush"): on a prefill or decode
node a ``step`` with ``running`` 0 and ``cache: "flushed"``, on the line's node (its DP rank's
pool with DP attention), at the line's time; from the DP rank's first scheduler only (the others
repeat it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339

MESSAGE = "Cache flushed successfully!"


class FlushLine(NamedTuple):
    """A cache flush read (its line says nothing more)."""


def read(line: LogLine, options: Options) -> FlushLine | None:
    """A flush, None for a line of another kind."""
    return FlushLine() if line.msg == MESSAGE else None


def learn(f: FlushLine, line: LogLine, facts: Facts, options: Options) -> FlushLine:
    """First pass: nothing to learn."""
    return f


def translate(f: FlushLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The flush's step record, from the DP rank's first scheduler of a prefill or decode server."""
    if facts.server.role_for(options) not in ("prefill", "decode") or not facts.server.first_of_dp_rank(line.tp):
        return []
    return [{"kind": "step", "ts": rfc3339(line.when()), "node": facts.node_of_line(line), "running": 0,
             "cache": "flushed"}]


class FlushFormat(LineFormat[LogLine, Facts, FlushLine]):
    """The cache-flush lines."""

    signs = ()  # (a flush alone does not make a file a server's)
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
