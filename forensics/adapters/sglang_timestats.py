"""SGLang's per-request timing statistics (``--enable-request-time-stats-logging``).

Reference: ``Req.log_time_stats`` in ``python/sglang/srt/managers/schedule_batch.py`` and
the ``TimeStats`` formatting beside it. The scheduler logs one line per request when it
completes::

    Req Time Stats(rid=R, bootstrap_room=B, input len=L, output len=O, type=decode): \
prealloc_duration=0.00ms, transfer_duration=12.00ms, queue_duration=0.00ms, forward_duration=800.00ms, start_time=...

``input len`` is the prompt the node worked on. After the placeholder swap a prefill node
reports 1 while the decode node reports the whole prompt: the incident's signature, kept as
the transfer's ``tokens``.

Times of the steps: where the file has the request's finish to the microsecond (the JSON
request log), they are counted back from it. Otherwise (text logs, whole seconds) they come
from ``start_time``, the scheduler's ``perf_counter`` when the request entered the prealloc
queue, put on the wall clock by :meth:`Facts.calibrate`: every request ended inside the second
its line was logged in, and together those seconds pin the clock offset to a millisecond or so.
The decode node's admission and finish records take those times too (within their logged
second). Failing both, the line's own time is the finish.

Canonical records: on a prefill node (``type=prefill``) ``prefill_started``, ``prefill_done``
and the transfer ``completed`` with ``tokens = input len``; on a decode node the transfer
``completed`` (landing) and ``decode_started``. Where the request's transfer failed, no
``completed`` (nor, on decode, ``decode_started``). The
transfer id is ``room-B``, the bootstrap room both sides log; the other side's node is not in
the line and is written ``unknown``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from forensics.adapters.base import Notes, Options
from forensics.adapters.sglang_log import Facts, LogLine, rfc3339

_LINE = re.compile(
    r"Req Time Stats\(rid=(?P<rid>[^,]+?)(?:, bootstrap_room=(?P<room>-?\d+|None))?, "
    r"input len=(?P<input>\d+), output len=(?P<output>\d+), type=(?P<type>\w+)\)(?:: (?P<stats>.*))?$",
    re.S,
)
_DURATION = re.compile(r"\b(prealloc(?:_queue)?|transfer|queue|forward)_duration[=(]([0-9.]+)ms")
_START = re.compile(r"\bstart(?:_time)?=([0-9.]+)")
UNKNOWN_NODE = "unknown"


def _parse(line: LogLine) -> re.Match[str] | None:
    return _LINE.search(line.msg) if "Req Time Stats(" in line.msg else None


def learn(line: LogLine, facts: Facts, options: Options) -> bool:
    """First pass: a time-stats line's role, prompt length and steps; whether the line was one."""
    m = _parse(line)
    if m is None:
        return False
    kind, tokens = m["type"], int(m["input"])
    facts.roles_seen.add(kind)
    if kind == "decode":
        facts.learn_prompt(m["rid"], tokens, 2)
        steps = _steps(m["stats"] or "")
        if steps is not None and line.ts is not None and not line.precise:
            facts.steps[m["rid"]] = (steps, line.ts)
    elif kind == "prefill" and tokens > 1:
        facts.learn_prompt(m["rid"], tokens, 1)
    return True


def transfer_id(rid: str, room: str | None) -> str:
    """The transfer id both sides of a handoff share: its bootstrap room, else the request id."""
    return f"room-{room}" if room not in (None, "None") else f"rid-{rid}"


def translate(line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]] | None:
    """The request and transfer records of a time-stats line; None for a line of another kind."""
    m = _parse(line)
    if m is None:
        return None
    rid, kind = m["rid"], m["type"]
    if kind not in ("prefill", "decode"):
        return []  # a unified server: no handoff to record
    end = line.when()
    base = {"request_id": rid}
    xfer = {"kind": "transfer", "transfer_id": transfer_id(rid, m["room"]), "request_id": rid,
            "event": "completed"}
    if kind == "prefill":
        ts = rfc3339(end)
        done = [{"kind": "request", "ts": ts, **base, "event": "prefill_started"},
                {"kind": "request", "ts": ts, **base, "event": "prefill_done"}]
        if rid in facts.failed:  # the failure is on its own line; nothing completed
            return done
        return [*done, {**xfer, "ts": ts, "src_node": facts.node, "dst_node": UNKNOWN_NODE, "tokens": int(m["input"])}]
    if rid in facts.failed:
        return []  # nothing landed: the transfer failure is on its own line
    durations = {k.replace("_queue", ""): float(v) for k, v in _DURATION.findall(m["stats"] or "")}
    calibrated = facts.step_times(rid)
    if rid not in facts.finish_ts and calibrated is not None:
        _, landed, started, _ = calibrated
    else:
        finish = facts.finish_ts.get(rid, end)
        started = finish - _ms(durations.get("forward", 0.0))
        landed = started - _ms(durations.get("queue", 0.0))
    return [
        {**xfer, "ts": rfc3339(landed), "src_node": UNKNOWN_NODE, "dst_node": facts.node},
        {"kind": "request", "ts": rfc3339(started), **base, "event": "decode_started"},
    ]


def _steps(stats: str) -> tuple[float, float, float, float, float] | None:
    """(start, prealloc, transfer, queue, forward) in seconds, if the line has them all."""
    durations = {k.replace("_queue", ""): float(v) / 1000 for k, v in _DURATION.findall(stats)}
    start = _START.search(stats)
    if start is None or not {"prealloc", "transfer", "queue", "forward"} <= durations.keys():
        return None
    return (float(start.group(1)), durations["prealloc"], durations["transfer"], durations["queue"],
            durations["forward"])


def _ms(value: float) -> dt.timedelta:
    return dt.timedelta(microseconds=round(value * 1000))
