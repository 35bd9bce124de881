"""SGLang's per-request timing statistics (``--enable-request-time-stats-logging``).

Reference: ``Req.log_time_stats`` in ``python/sglang/srt/managers/schedule_batch.py``, with the
time-stats class beside it (``TimeStats`` in ``metrics/collector.py`` up to 0.5.8,
``SchedulerReqTimeStats`` in ``observability/req_time_stats.py`` from 0.5.11). The scheduler
logs one line per request when it is done with it, on every TP rank. Two heads::

    Req Time Stats(rid=R, bootstrap_room=B, input len=L, output len=O, type=decode): ...   (0.5.5-0.5.11)
    ReqTimeStats(rid=R, bootstrap_room=B, input_len=L, cached_input_len=C, output_len=O, attempts=A, type=prefill): ...
                                                     (0.5.12 on; ``attempts`` from 0.5.16)

and the steps after the colon, ``name=12.00ms`` or ``name(12.00ms)``, with ``start=`` (the
stage's ``perf_counter``) up to 0.5.11, ``entry_time=`` (its wall-clock time, seconds since the
epoch) from 0.5.12, ``transfer_speed``/``transfer_total`` on prefill from 0.5.7 and
``#retries=`` 0.5.8 to 0.5.15. The fields are read by name, so a release that adds or reorders
one still reads.

``input len`` is the prompt the node worked on. After the placeholder swap a prefill node
reports 1 while the decode node reports the whole prompt: the incident's signature, kept as
the transfer's ``tokens``.

Times of the steps: from ``entry_time`` where the line has it (each step's duration added in
turn); else where the file has the request's finish to the microsecond (the JSON request log),
counted back from it; else from ``start``, put on the wall clock by :meth:`Facts.calibrate`
(every request ended inside the second its line was logged in, and together those seconds pin
the clock offset to a millisecond or so). Failing all, the line's own time is the finish.

Canonical records: on a prefill node (``type=prefill``) ``prefill_started`` (with schema v1.1's
``cached_tokens``: ``cached_input_len``, or before 0.5.12 the finish's ``meta_info.cached_tokens``
in the request log), ``prefill_done`` and the transfer ``completed`` with ``tokens = input len``
(and ``bytes`` from ``transfer_total``, in MiB); on a decode node the transfer ``completed``
(landing) and ``decode_started``. Where the request's transfer failed, no ``completed`` (nor, on
decode, ``decode_started``). A prefill line with ``output_len=0`` made no output token, so sent nothing:
0.5.20 runs a prompt rejected at intake as a one-token forward and then aborts its sender
(``_retire_aborted_prefill_result``): ``prefill_started`` and ``prefill_done`` only. From 0.5.21
such a prompt is retired at the bootstrap queue and still streamed, so its line comes with
``attempts=0``, ``output_len=0`` and times never set (``entry_time`` near the host's boot): a
retirement, no record at all (its rejection is the length abort's own line). Up to 0.5.19 the
stub is prefilled and sent (``output len=1``): the handoff the incident is about. The transfer id
is ``room-B``, the bootstrap room both sides log; the
other side's node is not in the line and is written ``unknown``.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339

_LINE = re.compile(r"(?P<head>Req Time Stats|ReqTimeStats)\((?P<fields>[^)]*)\)(?::\s*(?P<stats>.*))?$", re.S)
_FIELD = re.compile(r"\s*([a-z_ ]+?)=([^,]*)")
_STAT = re.compile(r"(#?[a-z_]+)\s*[=(]\s*(-?[0-9]+(?:\.[0-9]+)?)\s*(ms|GB/s|MB)?")
UNKNOWN_NODE = "unknown"
_MIB = 1024 * 1024


class TimeStats(NamedTuple):
    """A time-stats line read: its head fields and its numbers (durations in seconds)."""

    old_head: bool  # ``Req Time Stats(`` (0.5.5-0.5.11)
    rid: str
    room: str | None
    kind: str  # prefill, decode, unified (or what the release prints)
    input_len: int
    output_len: int | None
    attempts: int | None
    durations: dict[str, float]  # prealloc, transfer, queue, forward, bootstrap, alloc_wait ...
    start: float | None  # perf_counter seconds (up to 0.5.11)
    entry: float | None  # wall-clock seconds since the epoch (from 0.5.12)
    transfer_mib: float | None
    transfer_gbs: float | None
    retries: int | None
    cached_input: int | None = None  # ``cached_input_len``: prompt tokens from the prefix cache (0.5.12 on)

    @property
    def retired(self) -> bool:
        """A prefill line of a request never prefilled: retired at the bootstrap queue (0.5.21 on:
        a prompt rejected at intake, its times never set, no attempt made)."""
        return self.kind == "prefill" and self.attempts == 0 and self.output_len == 0

    @property
    def sent(self) -> bool:
        """Whether a prefill line's request had its KV sent: prefill made its first output token
        (``output_len`` 1). None made (0) is a request aborted before its send, as 0.5.20 does
        with a prompt rejected at intake after its one-token forward (``_retire_aborted_prefill_result``:
        the sender aborted, nothing sent), or retired before any forward."""
        return self.output_len is None or self.output_len > 0

    @property
    def steps(self) -> tuple[float, float, float, float] | None:
        """Decode's (prealloc, transfer, queue, forward), if the line has them all. From 0.5.12 a
        decode server that saw its handshake done (``set_bootstrap_done_time`` in
        ``disaggregation/decode.py``: every served request in a real run) prints the preallocation
        only in its two parts, ``bootstrap_duration`` and ``alloc_wait_duration``
        (``observability/req_time_stats.py``, 0.5.23 :1183-1199): their sum. (0.5.11 prints the
        whole and its parts.)"""
        d = self.durations
        if "prealloc" in d:
            prealloc = d["prealloc"]
        elif "bootstrap" in d and "alloc_wait" in d:
            prealloc = d["bootstrap"] + d["alloc_wait"]
        else:
            return None
        if not {"transfer", "queue", "forward"} <= d.keys():
            return None
        return prealloc, d["transfer"], d["queue"], d["forward"]


def read(line: LogLine, options: Options) -> TimeStats | None:
    """The time-stats line's fields, None for a line of another kind."""
    if "Time Stats(" not in line.msg and "TimeStats(" not in line.msg:
        return None
    return _parse(line.msg)


#: The head's fields as every release from 0.5.5 lays them out, read in one match (any other
#: layout is read field by field)
_HEAD = re.compile(r"rid=(?P<rid>[^\s,=]+), bootstrap_room=(?P<bootstrap_room>[^\s,=]+), "
                   r"input[ _]len=(?P<input_len>\d+), (?:cached_input_len=(?P<cached_input_len>\d+), )?"
                   r"output[ _]len=(?P<output_len>\d+), "
                   r"(?:attempts=(?P<attempts>\d+), )?type=(?P<type>[^\s,=]+)")


@functools.lru_cache(maxsize=64)  # (every TP rank prints the same line: read it once)
def _parse(msg: str) -> TimeStats | None:
    m = _LINE.search(msg)
    if m is None:
        return None
    fields = m["fields"]
    laid_out = _HEAD.fullmatch(fields)
    if laid_out is not None:
        rid, room, input_len, cached, output_len, attempts, kind = laid_out.group(
            "rid", "bootstrap_room", "input_len", "cached_input_len", "output_len", "attempts", "type")
    else:
        head = {k.strip().replace(" ", "_"): v.strip() for k, v in _FIELD.findall(fields)}
        if "rid" not in head or "type" not in head or not head.get("input_len", "").isdigit():
            return None
        rid, room, input_len, cached, output_len, attempts, kind = (
            head["rid"], head.get("bootstrap_room"), head["input_len"], head.get("cached_input_len"),
            head.get("output_len"), head.get("attempts"), head["type"])
    durations: dict[str, float] = {}
    numbers: dict[str, float] = {}
    for name, value, unit in _STAT.findall(m["stats"] or ""):
        key = _STAT_KEYS.get((name, unit)) or _stat_key(name, unit)
        into = numbers if key[0] == "n" else durations
        if key[1] not in into:
            into[key[1]] = float(value) / 1000 if key[0] == "d" else float(value)
    return TimeStats(
        m["head"] == "Req Time Stats", rid, None if room in (None, "None") else room, kind, int(input_len),
        _int(output_len), _int(attempts), durations, numbers.get("start", numbers.get("start_time")),
        numbers.get("entry_time"),
        numbers.get("transfer_total"), numbers.get("transfer_speed"),
        int(numbers["#retries"]) if "#retries" in numbers else None, _int(cached),
    )


#: Where a step's number goes, by its name and unit: ``("d", step)`` a duration in seconds
#: (``forward_duration=6.00ms`` -> ``forward``; a step's parts, ``bootstrap(4.00ms)``, as
#: ``part.bootstrap``), ``("n", name)`` any other number as printed
_STAT_KEYS: dict[tuple[str, str], tuple[str, str]] = {}


def _stat_key(name: str, unit: str) -> tuple[str, str]:
    if unit == "ms" and name.endswith("_duration"):
        key = ("d", name[: -len("_duration")].replace("_queue", ""))
    elif unit == "ms":
        key = ("d", f"part.{name}")
    else:
        key = ("n", name)
    if len(_STAT_KEYS) < 4096:
        _STAT_KEYS[name, unit] = key
    return key


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def learn(t: TimeStats, line: LogLine, facts: Facts, options: Options) -> TimeStats:
    """First pass: a time-stats line's role, prompt length, DP rank and steps."""
    facts.server.roles_seen.add(t.kind)
    facts.server.marks.add("time_stats.old_head" if t.old_head else "time_stats.new_head")
    if t.attempts is not None:
        facts.server.marks.add("time_stats.attempts")
    elif not t.old_head:
        facts.server.marks.add("time_stats.no_attempts")
    if t.retries is not None:
        facts.server.marks.add("time_stats.retries")
    if t.kind == "prefill":
        facts.server.marks.add("time_stats.transfer_speed" if t.transfer_gbs is not None
                               else "time_stats.no_transfer_speed")
    facts.seen.learn_dp(t.rid, line)
    facts.seen.learn_room(t.rid, t.room)
    if t.kind == "decode":
        facts.seen.learn_prompt(t.rid, t.input_len, 2)
        steps = t.steps
        if steps is not None and t.entry is not None:
            # (entry_time is the request's arrival in the preallocation queue; its pages are taken at
            # the queue's end, _pre_alloc in pop_preallocated, as step_times has it from start)
            prealloc, transfer, queue, forward = steps
            admitted = _epoch(t.entry) + _s(prealloc)
            landed = admitted + _s(transfer)
            started = landed + _s(queue)
            facts.clock.entry_times[t.rid] = (admitted, landed, started, started + _s(forward))
        elif steps is not None and t.start is not None and line.ts is not None and not line.precise:
            facts.clock.steps[t.rid] = ((t.start, *steps), line.ts)
    elif t.kind == "prefill" and t.input_len > 1:
        facts.seen.learn_prompt(t.rid, t.input_len, 1)
    if t.kind == "prefill" and t.retired:
        facts.server.marks.add("time_stats.retired")
    return t


def transfer_id(rid: str, room: str | None) -> str:
    """The transfer id both sides of a handoff share: its bootstrap room, else the request id."""
    return f"room-{room}" if room not in (None, "None") else f"rid-{rid}"


def translate(t: TimeStats, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The request and transfer records of a time-stats line."""
    rid, kind = t.rid, t.kind
    if kind not in ("prefill", "decode"):
        return []  # a unified server: no handoff to record
    end = line.when()
    node = facts.node_of_line(line, rid)
    base = {"request_id": rid, "node": node}
    xfer: dict[str, Any] = {"kind": "transfer", "transfer_id": transfer_id(rid, t.room), "request_id": rid,
                            "event": "completed", "node": node}
    d = t.durations
    if kind == "prefill":
        if t.retired:  # never prefilled nor sent (its rejection is on its own line)
            notes.add("retired", "{n} time-stats lines of prompts retired at the prefill bootstrap queue "
                      "(no attempt, no output): read as retirements, not transfers")
            return []
        started = done = end
        if t.entry is not None:  # entry into the bootstrap queue, then its steps
            at = _epoch(t.entry)
            wait = d.get("bootstrap", 0.0) + d.get("alloc_wait", 0.0) if "bootstrap" in d else 0.0
            started = at + _s(wait + d.get("queue", 0.0))
            done = min(started + _s(d.get("forward", 0.0)), end + _ONE_SECOND)
            started = min(started, done)
        prefill_started: dict[str, Any] = {"kind": "request", "ts": rfc3339(started), **base,
                                           "event": "prefill_started"}
        cached = t.cached_input if t.cached_input is not None else facts.seen.cached.get(rid)
        if cached is not None:
            prefill_started["cached_tokens"] = cached
        done_records = [prefill_started, {"kind": "request", "ts": rfc3339(done), **base, "event": "prefill_done"}]
        if rid in facts.seen.failed or not t.sent:  # a failure on its own line, or aborted: nothing completed
            return done_records
        sent = {**xfer, "ts": rfc3339(max(done, end)), "src_node": node, "dst_node": UNKNOWN_NODE,
                "tokens": t.input_len}
        if t.transfer_mib:
            sent["bytes"] = round(t.transfer_mib * _MIB)
        return [*done_records, sent]
    if rid in facts.seen.failed:
        return []  # nothing landed: the transfer failure is on its own line
    times = facts.clock.entry_times.get(rid) or facts.clock.step_times(rid)
    if times is not None:
        _, landed, started, _ = times
    else:
        finish = facts.clock.finish_ts.get(rid, end)
        started = finish - _s(d.get("forward", 0.0))
        landed = started - _s(d.get("queue", 0.0))
    return [
        {**xfer, "ts": rfc3339(landed), "src_node": UNKNOWN_NODE, "dst_node": node},
        {"kind": "request", "ts": rfc3339(started), **base, "event": "decode_started"},
    ]


def _epoch(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def _s(seconds: float) -> dt.timedelta:
    return dt.timedelta(0, 0, round(seconds * 1_000_000))  # (positional: keyword calls cost more)


_ONE_SECOND = dt.timedelta(seconds=1)


class TimeStatsFormat(LineFormat[LogLine, Facts, TimeStats]):
    """The time-stats lines, either head."""

    signs = ("Req Time Stats(", "ReqTimeStats(")
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
