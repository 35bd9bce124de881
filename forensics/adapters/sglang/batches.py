"""SGLang's decode batch statistics: the running batch every ``decode_log_interval`` steps.

Reference: ``log_decode_stats`` (``managers/scheduler_metrics_mixin.py`` to 0.5.8,
``observability/scheduler_metrics_mixin.py`` in 0.5.11 and 0.5.12,
``managers/scheduler_components/metrics_reporter.py`` from 0.5.18; the line of each release is in
the fixtures' ``SOURCE.json``, ``batch_stats``), called after every ``decode_log_interval``-th
decode step (``forward_ct_decode``, counted from the process's start) by the scheduler whose
attention-TP rank is 0: one per DP rank with DP attention, TP rank 0 without. Its line::

    Decode batch, #running-req: N, #token: T, token usage: U, ...   (``Decode batch.`` before)

Canonical record (schema v1.1, docs/schema-v1.1.md): on a decode node a ``step`` with
``running`` N, on the line's node (its DP rank's pool with DP attention), at the line's time; its
``steps`` left to the config's ``step_log_interval`` (``server_args``' ``decode_log_interval``).
Lines alike one after the other (the same scheduler, time and running batch: two intervals
inside the log's time resolution) are one record whose ``steps`` counts them all
(:class:`~forensics.adapters.sglang.log.Batches`): as two records they would be one record and a
duplicate. A line of another scheduler (``--enable-metrics-for-all-schedulers``) repeats its DP
rank's first and is read for nothing; so is a prefill or unified server's.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339

_DECODE_BATCH = re.compile(r"Decode batch\b[^#]{0,40}#running-req: (?P<running>\d+)")


class BatchLine(NamedTuple):
    """A decode batch-statistics line read: the requests in the running batch."""

    running: int


def read(line: LogLine, options: Options) -> BatchLine | None:
    """The decode batch line's running batch, None for a line of another kind."""
    if not line.msg.startswith("Decode batch") or (m := _DECODE_BATCH.match(line.msg)) is None:
        return None
    return BatchLine(int(m["running"]))


def learn(b: BatchLine, line: LogLine, facts: Facts, options: Options) -> BatchLine:
    """First pass: the line counted in its scheduler's run of lines alike."""
    facts.batches.count((facts.node_of_line(line), line.tp), (line.ts, b.running))
    return b


def translate(b: BatchLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The step record of a run's first line (none for the others of the run)."""
    node = facts.node_of_line(line)
    lines = facts.batches.run_of((node, line.tp), (line.ts, b.running))
    if not lines or facts.server.role_for(options) != "decode" or not facts.server.first_of_dp_rank(line.tp):
        return []
    record: dict[str, Any] = {"kind": "step", "ts": rfc3339(line.when()), "node": node, "running": b.running}
    interval = facts.server.scheduling.get("step_log_interval")
    if lines == 1:
        return [record]
    if isinstance(interval, int) and not isinstance(interval, bool):
        return [{**record, "steps": lines * interval}]
    notes.add("steps_unknown", "{n} decode batch lines repeat the one before them (its time and running batch) "
              "where the server's decode_log_interval is unknown: each a record, the repeats duplicates", lines - 1)
    return [dict(record) for _ in range(lines)]


class BatchFormat(LineFormat[LogLine, Facts, BatchLine]):
    """The decode batch-statistics lines."""

    signs = ()  # (batch statistics alone do not make a file a server's: no format sign)
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
