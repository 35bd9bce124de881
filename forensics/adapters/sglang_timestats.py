"""SGLang's per-request timing statistics (``--enable-request-time-stats-logging``).

Reference: ``Req.log_time_stats`` in ``python/sglang/srt/managers/schedule_batch.py`` and
the ``TimeStats`` formatting beside it. The scheduler logs one line per request when it
completes::

    Req Time Stats(rid=R, bootstrap_room=B, input len=L, output len=O, type=decode): \
prealloc_duration=0.00ms, transfer_duration=12.00ms, queue_duration=0.00ms, forward_duration=800.00ms, start_time=...

``input len`` is the prompt the node worked on. After the placeholder swap a prefill node
reports 1 while the decode node reports the whole prompt: the incident's signature, kept as
the transfer's ``tokens``. ``start_time`` is a ``perf_counter`` reading, not a wall clock, so
the times of the steps are counted back from the request's finish (the finish line's precise
time where the file has one, else this line's own time).

Canonical records: on a prefill node (``type=prefill``) ``prefill_started``, ``prefill_done``
and the transfer ``completed`` with ``tokens = input len``; on a decode node the transfer
``completed`` (landing) and ``decode_started``, unless the request's transfer failed. The
transfer id is ``room-B``, the bootstrap room both sides log; the other side's node is not in
the line and is written ``unknown``.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from forensics.adapters import Notes, Options
from forensics.adapters.sglang_log import Facts, LogLine, rfc3339

_LINE = re.compile(
    r"Req Time Stats\(rid=(?P<rid>[^,]+?)(?:, bootstrap_room=(?P<room>-?\d+|None))?, "
    r"input len=(?P<input>\d+), output len=(?P<output>\d+), type=(?P<type>\w+)\)(?:: (?P<stats>.*))?$",
    re.S,
)
_DURATION = re.compile(r"\b(prealloc(?:_queue)?|transfer|queue|forward)_duration[=(]([0-9.]+)ms")
UNKNOWN_NODE = "unknown"


def _parse(line: LogLine) -> re.Match[str] | None:
    return _LINE.search(line.msg) if "Req Time Stats(" in line.msg else None


def learn(line: LogLine, facts: Facts, options: Options) -> bool:
    m = _parse(line)
    if m is None:
        return False
    kind, tokens = m["type"], int(m["input"])
    facts.roles_seen.add(kind)
    if kind == "decode":
        facts.learn_prompt(m["rid"], tokens, 2)
    elif kind == "prefill" and tokens > 1:
        facts.learn_prompt(m["rid"], tokens, 1)
    return True


def transfer_id(rid: str, room: str | None) -> str:
    return f"room-{room}" if room not in (None, "None") else f"rid-{rid}"


def translate(line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]] | None:
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
        return [
            {"kind": "request", "ts": ts, **base, "event": "prefill_started"},
            {"kind": "request", "ts": ts, **base, "event": "prefill_done"},
            {**xfer, "ts": ts, "src_node": facts.node, "dst_node": UNKNOWN_NODE, "tokens": int(m["input"])},
        ]
    if rid in facts.failed:
        return []  # nothing landed: the transfer failure is on its own line
    durations = {k.replace("_queue", ""): float(v) for k, v in _DURATION.findall(m["stats"] or "")}
    finish = facts.finish_ts.get(rid, end)
    started = finish - _ms(durations.get("forward", 0.0))
    landed = started - _ms(durations.get("queue", 0.0))
    return [
        {**xfer, "ts": rfc3339(landed), "src_node": UNKNOWN_NODE, "dst_node": facts.node},
        {"kind": "request", "ts": rfc3339(started), **base, "event": "decode_started"},
    ]


def _ms(value: float) -> dt.timedelta:
    return dt.timedelta(microseconds=round(value * 1000))
