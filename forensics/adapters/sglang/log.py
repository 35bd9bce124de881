"""What every SGLang log format shares: the line prefix, Python reprs, and what a file says.

SGLang writes through Python's logging: ``[%(asctime)s{prefix}] %(message)s`` with the date
as ``%Y-%m-%d %H:%M:%S`` (every release from 0.5.5 to 0.5.23; ``.%(msecs)03d`` follows with
``SGLANG_LOG_MS``), the prefix naming the scheduler's ranks (`` TP0``, `` DP1 TP1``; none for the
HTTP and tokenizer process). The request log has its own handlers: up to 0.5.7 the tokenizer's
module logger (the same prefix) and, for JSON, a bare ``%(message)s``; 0.5.8 to 0.5.11 print
``%(message)s`` only (text lines carry no time at all); from 0.5.12 ``[%(asctime)s] %(message)s``,
on stdout and in the ``--log-requests-target`` files alike. The JSON form's own ``timestamp`` is
``datetime.now().isoformat()``. Times are the server's clock, read as UTC. Objects in the text
forms are Python reprs (``GenerateReqInput(rid='a', ...)``), which :func:`py_value` reads
without evaluating anything.
"""

from __future__ import annotations

import ast
import bisect
import datetime as dt
import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from forensics.adapters.base import Options, Untranslatable
from forensics.ids import dp_pool_node

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(
    r"\[(?P<date>\d{4}-\d\d-\d\d |\d\d-\d\d )?(?P<time>\d\d:\d\d:\d\d)(?P<frac>[.,]\d{1,9})?(?P<tags>[^\]]*)\] ?"
)
_DP = re.compile(r"\bDP(\d+)\b")
_TP = re.compile(r"\bTP(\d+)\b")
#: ``<Foo object at 0x7f..>``, ``<HTTPStatus.BAD_REQUEST: 400>``: reprs that are not Python syntax.
_OPAQUE = re.compile(r"<[^<>'\"]*>")
#: Truncated values: ``'abc' ... 'xyz'`` and ``[1, 2] ... [8, 9]`` (_dataclass_to_string_truncated).
_TRUNCATED = re.compile(r"(['\"\]]) \.\.\. (['\"\[])")


class LogLine(NamedTuple):
    """A line split into its time (UTC; ``None`` where it has none or no year) and message;
    ``doc`` is the object of a bare JSON line. (A tuple: a file's every line makes one.)"""

    ts: dt.datetime | None
    precise: bool  # the time has a fraction of a second
    msg: str
    doc: dict[str, Any] | None = None
    undated: bool = False  # a prefix time without a year (and no --year)
    dp: int | None = None  # the DP rank the prefix names (DP attention: its own KV pool)
    prefixed: bool = False  # the line has a logging prefix with a time
    tp: int | None = None  # the TP rank the prefix names (a scheduler's line)

    def when(self) -> dt.datetime:
        """The line's time, or the reason the line cannot be placed in time."""
        if self.ts is None:
            if self.undated:
                raise Untranslatable("the log time has no year; pass --year")
            raise Untranslatable("the line has no log time")
        return self.ts


def split(text: str, year: int | None) -> LogLine:
    """A raw line as time and message (a line that is neither prefixed nor JSON keeps its text).
    A JSON object after the prefix (the request log from 0.5.12) is read as JSON, its own
    ``timestamp`` first, the prefix's time failing that."""
    t = (_ANSI.sub("", text) if "\x1b" in text else text).strip().lstrip("\ufeff")
    if t.startswith("{"):
        return _json_line(t, None, False)
    if not t.startswith("["):
        return LogLine(None, False, t)
    close = t.find("]", 0, _HEAD_MAX)
    if close < 0:  # (no prefix, or one too long to keep: read as the pattern reads it)
        m = _PREFIX.match(t)
        if m is None:
            return LogLine(None, False, t)
        head, at = _read_head(m, year), m.end()
    else:
        head = _head(t[: close + 1], year)
        at = close + 2 if t.startswith(" ", close + 1) else close + 1
    if head is _NO_HEAD:
        return LogLine(None, False, t)
    ts, precise, undated, dp, tp = head
    msg = t[at:]
    if msg.startswith("{"):
        return _json_line(msg, ts, precise)
    return LogLine(ts, ts is not None and precise, msg, None, undated, dp, ts is not None, tp)


#: A prefix is read once per distinct text (``[2026-11-02 08:00:02 TP0]``: a second and a rank);
#: the heads kept, by year, and the longest kept.
_Head = tuple[dt.datetime | None, bool, bool, int | None, int | None]
_HEADS: dict[tuple[str, int | None], _Head] = {}
_HEAD_MAX = 96
_NO_HEAD: _Head = (None, False, False, None, None)


def _head(head: str, year: int | None) -> _Head:
    """A prefix ``[...]`` (up to the line's first ``]``, where the pattern's tags end)'s time,
    whether it has a fraction, whether it has no year, its DP and TP ranks; ``_NO_HEAD`` where
    it is not one."""
    key = (head, year)
    hit = _HEADS.get(key)
    if hit is None:
        if len(_HEADS) >= 65_536:
            _HEADS.clear()
        if _is_plain(head):  # ``[YYYY-MM-DD HH:MM:SS]`` and its tags: the pattern's answer, read by slicing
            tags = head[20:-1]
            hit = _HEADS[key] = (_second(f"{head[1:11]}T{head[12:20]}"), False, False, *_ranks(tags))
            return hit
        m = _PREFIX.fullmatch(head)
        if m is None:
            return _NO_HEAD
        hit = _HEADS[key] = _read_head(m, year)
    return hit


def _is_plain(head: str) -> bool:
    """Whether a prefix is ``[YYYY-MM-DD HH:MM:SS`` then tags (none, or a space and more) and
    ``]``: no fraction of a second, a full date."""
    return (len(head) >= 21 and head[20] in " ]" and head[5] == head[8] == "-" and head[11] == " "
            and head[14] == head[17] == ":" and head[1:5].isdigit() and head[6:8].isdigit()
            and head[9:11].isdigit() and head[12:14].isdigit() and head[15:17].isdigit() and head[18:20].isdigit())


def _ranks(tags: str) -> tuple[int | None, int | None]:
    """The DP and TP ranks a prefix's tags name (`` DP1 TP1``), None for one they do not."""
    dp = _DP.search(tags) if "DP" in tags else None
    tp = _TP.search(tags) if "TP" in tags else None
    return int(dp.group(1)) if dp else None, int(tp.group(1)) if tp else None


def _read_head(m: re.Match[str], year: int | None) -> _Head:
    dp_rank, tp_rank = _ranks(m["tags"] or "")
    date = (m["date"] or "").strip()
    ts: dt.datetime | None = None
    frac = (m["frac"] or "")[1:]
    undated = False
    if len(date) == 5:  # MM-DD
        if year is None:
            undated = True
        else:
            date = f"{year:04d}-{date}"
    if date and not undated:
        ts = _second(f"{date}T{m['time']}")
        if ts is not None and frac:
            ts += dt.timedelta(microseconds=int(frac.ljust(6, "0")[:6]))
    return ts, bool(frac), undated, dp_rank, tp_rank


@functools.lru_cache(maxsize=4096)
def _second(text: str) -> dt.datetime | None:
    """A prefix's ``YYYY-MM-DDTHH:MM:SS`` as UTC (lines of one second share it: cached)."""
    try:
        return dt.datetime.fromisoformat(f"{text}+00:00")  # (UTC, the zone singleton; replace() is slower)
    except ValueError:
        return None


def _json_line(t: str, prefix_ts: dt.datetime | None, prefix_precise: bool) -> LogLine:
    try:
        doc = json.loads(t)
    except (ValueError, RecursionError):  # (a JSON value nested past Python's stack)
        return LogLine(prefix_ts, prefix_precise, t, prefixed=prefix_ts is not None)
    if not isinstance(doc, dict):
        return LogLine(prefix_ts, prefix_precise, t, prefixed=prefix_ts is not None)
    ts = iso_time(doc.get("timestamp"))
    if ts is None:
        return LogLine(prefix_ts, prefix_precise, t, doc, prefixed=prefix_ts is not None)
    # isoformat() gives microseconds (and leaves out a fraction only when it is zero)
    return LogLine(ts, True, t, doc, prefixed=prefix_ts is not None)


def iso_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 time (naive ones read as UTC), or None."""
    if not isinstance(value, str):
        return None
    try:
        ts = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return ts.replace(tzinfo=dt.UTC) if ts.tzinfo is None else ts.astimezone(dt.UTC)


def rfc3339(ts: dt.datetime) -> str:
    """``2026-09-14T08:01:02.500000Z``: UTC, to the microsecond. (A cache of each second's text
    cost 3.6 us a record where seconds seldom repeat and saved 0.2 us where they do; isoformat of
    an aware time takes 1.5 us.)"""
    if ts.tzinfo is not dt.UTC:
        ts = ts.astimezone(dt.UTC)
    # (%-formatting: 0.77 us, an f-string with the same seven fields 1.3 to 1.5 us)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ" % (  # noqa: UP031
        ts.year, ts.month, ts.day, ts.hour, ts.minute, ts.second, ts.microsecond)


def py_value(text: str) -> Any:
    """A Python repr as data: calls become dicts (``__type__`` naming the class), literals
    stay, anything else is kept as its source text. Nothing is evaluated."""
    src = _syntax(text)
    try:
        tree = ast.parse(src, mode="eval")
        return _value(tree.body, src)
    except (RecursionError, MemoryError):  # a repr nested (or an expression chained) past what Python parses
        raise ValueError("nested too deeply to read") from None


#: A string literal as ``repr`` writes one: quoted with ' or ", its quotes and backslashes escaped
_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")


def _syntax(text: str) -> str:
    """A repr made Python syntax: opaque reprs quoted, truncations joined (``'a' ... 'z'`` as
    ``'a' + 'z'``), outside its string literals only: a user's text (a prompt or output logged at
    levels 2 and 3) may hold ``<...>`` or ``' ... '`` itself, and is left as it was logged."""
    if "<" not in text and " ... " not in text:
        return text
    out, at, quoted = [], 0, False
    for m in _STRING.finditer(text):
        out.append(_code(text[at:m.start()], quoted, True))
        out.append(m.group(0))
        at, quoted = m.end(), True
    out.append(_code(text[at:], quoted, False))
    return "".join(out)


def _code(gap: str, after_string: bool, before_string: bool) -> str:
    """The code between two string literals (or the text's ends) with :data:`_OPAQUE` and
    :data:`_TRUNCATED` applied, the strings each side stood for by a quote."""
    if "<" not in gap and " ... " not in gap:
        return gap
    left, right = "'" if after_string else "", "'" if before_string else ""
    done = _TRUNCATED.sub(r"\1 + \2", _OPAQUE.sub(lambda m: repr(m.group(0)), left + gap + right))
    return done[len(left):len(done) - len(right)]


def _value(node: ast.AST, src: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {_value(k, src) if k is not None else "**": _value(v, src)
                for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(e, src) for e in node.elts]
    if isinstance(node, ast.Call):
        # (get_source_segment splits the whole source at every call: only for the unusual)
        name = node.func.id if isinstance(node.func, ast.Name) else ast.get_source_segment(src, node.func)
        out: dict[str, Any] = {"__type__": name}
        out.update({k.arg or "**": _value(k.value, src) for k in node.keywords})
        return out
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        if isinstance(value, (int, float)):
            return -value
    return ast.get_source_segment(src, node)


def status_code(value: Any) -> int | None:
    """An HTTP status as logged: 400, "400", or the repr ``<HTTPStatus.BAD_REQUEST: 400>``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = re.search(r"(\d{3})>?$", value.strip())
        if m:
            return int(m.group(1))
    return None


def dig(obj: Any, path: str) -> Any:
    """The value at a dotted path in nested dicts (``custom_labels.tenant``), or None."""
    for key in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


#: Seconds a calibration constraint is widened by, for the rounding of the printed times.
CLOCK_SLACK = 0.002


@dataclass
class Server:
    """What a file says of the server that wrote it: its node and role, its configuration, and
    the marks of its release's formats."""

    node: str = ""  # the node the file is from
    role: str | None = None  # from server_args (disaggregation_mode) or time-stats types
    roles_seen: set[str] = field(default_factory=set)
    page_size: int | None = None
    context_length: int | None = None
    model: str | None = None
    pool_seen: bool = False  # the file has the scheduler's pool line
    #: KV pools of the server with DP attention (each DP rank its own, of the size the pool line
    #: gives: only global TP rank 0, DP0's first scheduler, prints it); 1 without
    dp_pools: int = 1
    #: the TP ranks of each DP rank's attention (``tp_size``, divided among the DP pools): a
    #: scheduler at a multiple of it is its DP rank's first, the one that logs its batch statistics
    attn_tp_size: int | None = None
    #: schema v1.1's scheduling fields the server_args state (config._scheduling)
    scheduling: dict[str, bool | int] = field(default_factory=dict)
    #: schema v1.1's KV pool fields its start-up lines state (config.LAYOUT_SIGNS): ``hybrid_pool``,
    #: ``recurrent_state``
    layouts: set[str] = field(default_factory=set)
    marks: set[str] = field(default_factory=set)  # format marks seen (eras.py turns them into releases)
    era: str | None = None  # the releases whose formats the file shows (eras.era)

    def first_of_dp_rank(self, tp: int | None) -> bool:
        """Whether a scheduler line of TP rank ``tp`` is from its DP rank's first scheduler (the
        one whose attention-TP rank is 0); where ``tp_size`` is unknown, whether it is TP0's."""
        if tp is None:
            return True
        return tp % self.attn_tp_size == 0 if self.attn_tp_size else tp == 0

    def role_for(self, options: Options) -> str | None:
        """The node's role: ``--role``, else what the file said, else None."""
        if options.role is not None:
            return options.role
        if self.role is not None:
            return self.role
        if len(self.roles_seen) == 1:
            return next(iter(self.roles_seen))
        return None


@dataclass
class Seen:
    """What a file says of each request: what it was received and finished with, its prompt's
    real length, its room and DP rank, and how it was answered.

    The prompt length of a request, for one: after the placeholder swap a prefill node logs
    an input of 1 token, and only the length error says how long the prompt was.
    """

    prompt: dict[str, tuple[int, int]] = field(default_factory=dict)  # rid -> (rank, tokens)
    limit: dict[str, int] = field(default_factory=dict)  # rid -> max_req_input_len logged
    tenant: dict[str, str] = field(default_factory=dict)  # rid -> tenant (--tenant-from)
    max_new: dict[str, int] = field(default_factory=dict)
    failed: set[str] = field(default_factory=set)  # requests whose transfer failed or aborted on decode
    dp_of: dict[str, int] = field(default_factory=dict)  # rid -> the DP rank whose scheduler logged it
    rooms: dict[str, str] = field(default_factory=dict)  # rid -> its bootstrap room, as logged
    received: set[str] = field(default_factory=set)  # every request the file has a receive line of
    received_at: dict[str, dt.datetime] = field(default_factory=dict)  # rid -> its request line's time
    finished: set[str] = field(default_factory=set)  # requests with a finish line in the file
    #: (first pass) received, not finished, in order: rid -> the time it was received
    open_receives: dict[str, dt.datetime | None] = field(default_factory=dict)
    #: the tokenizer's context-length rejections, which name no request: (time, tokens, context)
    pending_context: list[tuple[dt.datetime | None, int, int]] = field(default_factory=list)
    #: the requests those rejections are tied to (tie_pending_context): rid -> (time, context)
    rejected_on_receive: dict[str, tuple[dt.datetime, int]] = field(default_factory=dict)
    #: requests the server sent itself (bootstrap host 2.2.2.2: its start-up warmup, health
    #: checks; or a health check's rid): no client's, so no record of them (counted in a file note)
    warmups: set[str] = field(default_factory=set)
    #: the items of the server's own batch past its first (the warmup before 0.5.18): the batch is
    #: one POST, answered once, so their finishes are no answer of their own (access lines)
    batched: set[str] = field(default_factory=set)
    #: HTTP statuses of the generate requests' uvicorn access lines, and of the finish lines
    #: (with the tokenizer's rejections, which answer 400 with no finish line)
    access: dict[int, int] = field(default_factory=dict)
    finish_status: dict[int, int] = field(default_factory=dict)
    #: the file's records name requests by bootstrap room (``room-B``), not by rid (--request-ids)
    by_room: bool = False
    #: rid -> the prompt tokens its finish's ``meta_info.cached_tokens`` says the prefix cache gave
    cached: dict[str, int] = field(default_factory=dict)

    def learn_cached(self, rid: str, tokens: Any) -> None:
        """Note the prompt tokens a finish says came from the prefix cache (``cached_tokens``)."""
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            self.cached.setdefault(rid, tokens)

    def learn_room(self, rid: str, room: Any) -> None:
        """Note the bootstrap room a line gives ``rid`` (``None`` for a request without one)."""
        if rid not in self.rooms and room not in (None, "None", ""):  # (the first room a rid is given)
            self.rooms[rid] = str(room)

    def learn_dp(self, rid: str, line: LogLine) -> None:
        """Note the DP rank a scheduler line about ``rid`` names (its prefix's ``DPk``)."""
        if line.dp is not None:
            self.dp_of.setdefault(rid, line.dp)

    def learn_prompt(self, rid: str, tokens: int, rank: int) -> None:
        """Keep the most trustworthy prompt length seen for ``rid`` (higher ``rank`` wins)."""
        old = self.prompt.get(rid)
        if old is None or rank > old[0]:
            self.prompt[rid] = (rank, tokens)

    def prompt_tokens(self, rid: str) -> int | None:
        """The real prompt length the file logged for ``rid``, if any."""
        hit = self.prompt.get(rid)
        return None if hit is None else hit[1]

    def tie_pending_context(self) -> int:
        """Tie the context-length rejections (this file's, or its server log's) to the requests
        this file received: each to the latest one received by then that never finished (the one
        being tokenized; a rejected request gets no finish line). How many found none."""
        untied = 0
        items = list(self.open_receives.items())  # (in the order received)
        times = [at for _, at in items]
        known = [at for at in times if at is not None]
        ordered = len(known) == len(times) and all(a <= b for a, b in zip(known, known[1:], strict=False))
        taken: set[int] = set()

        def latest(before: dt.datetime | None) -> int:
            """The last receive not yet tied that came before ``before`` (-1: none): by bisection
            where the receives are in time order, as a server's are."""
            if ordered:
                i = len(known) - 1 if before is None else bisect.bisect_left(known, before) - 1
                while i >= 0 and i in taken:
                    i -= 1
                return i
            return max((k for k, at in enumerate(times)
                        if k not in taken and (before is None or at is None or at < before)), default=-1)

        for when, tokens, context in self.pending_context:
            # (the error line's time is to the second, a JSON receive's to the microsecond)
            i = latest(None if when is None else when + dt.timedelta(seconds=1))
            if i < 0:
                untied += 1
                continue
            taken.add(i)
            rid = items[i][0]
            del self.open_receives[rid]
            self.learn_prompt(rid, tokens, 3)
            self.finished.add(rid)
            if when is not None:
                self.rejected_on_receive[rid] = (when, context)
        self.pending_context = []
        return untied


@dataclass
class Clock:
    """A file's times beyond its lines' own: decode requests' steps and the wall-clock time of the
    scheduler's ``perf_counter`` zero, precise finish times, and the times the passes carry from
    one line to the next."""

    #: decode time stats: rid -> (start, prealloc, transfer, queue, forward) in perf_counter
    #: seconds, and the whole second the line was logged in (text logs have no fraction)
    steps: dict[str, tuple[tuple[float, float, float, float, float], dt.datetime]] = field(default_factory=dict)
    offset: dt.datetime | None = None  # wall-clock time of perf_counter 0 (calibrate())
    #: decode time stats with ``entry_time`` (0.5.12 on): rid -> (admitted, landed, decode
    #: started, finished) on the wall clock, as step_times gives them from ``start``
    entry_times: dict[str, tuple[dt.datetime, dt.datetime, dt.datetime, dt.datetime]] = field(default_factory=dict)
    finish_ts: dict[str, dt.datetime] = field(default_factory=dict)  # precise finish times
    last_ts: dt.datetime | None = None  # (both passes) the time of the last line that had one
    last_decode_line: dt.datetime | None = None  # (translation) time of the last decode request line

    def calibrate(self, received_at: dict[str, dt.datetime]) -> None:
        """Find the wall-clock time of the scheduler's ``perf_counter`` zero from the decode
        time stats: each request ended (start + its durations) inside the second its line was
        logged in; all those constraints together pin the offset to about a millisecond.
        Left None when there are none, or when they contradict each other (a restart)."""
        lower = upper = None
        for (start, *durations), second in self.steps.values():
            end = start + sum(durations)
            # start is printed to the millisecond and each duration to 10 us: allow for it
            lo = second.timestamp() - end - CLOCK_SLACK
            hi = lo + 1.0 + 2 * CLOCK_SLACK
            lower = lo if lower is None else max(lower, lo)
            upper = hi if upper is None else min(upper, hi)
        for rid, ((start, *_), _) in self.steps.items():
            # and the request was admitted (start) no earlier than its request line was logged
            # (to the second, or the microsecond): with few requests the first constraints leave
            # up to a second open
            received = received_at.get(rid)
            if received is not None and lower is not None:
                lower = max(lower, received.timestamp() - start - CLOCK_SLACK)
        if lower is not None and upper is not None and lower < upper:
            self.offset = dt.datetime.fromtimestamp((lower + upper) / 2, tz=dt.UTC)

    def step_times(self, rid: str) -> tuple[dt.datetime, dt.datetime, dt.datetime, dt.datetime] | None:
        """(admitted, landed, decode started, finished) of a decode request from its steps:
        counted back from its finish where the file has it to the microsecond, else from its
        ``start`` put on the wall clock (:meth:`calibrate`, good to about a millisecond only
        with many requests: a precise finish is never mixed with a calibrated start)."""
        hit = self.steps.get(rid)
        if hit is None:
            return None
        (start, prealloc, transfer, queue, forward), _ = hit
        if (finish := self.finish_ts.get(rid)) is not None:
            started = finish - dt.timedelta(seconds=forward)
            landed = started - dt.timedelta(seconds=queue)
            return landed - dt.timedelta(seconds=transfer), landed, started, finish
        if self.offset is None:
            return None
        base = self.offset + dt.timedelta(seconds=start)
        at = [base + dt.timedelta(seconds=prealloc)]
        for step in (transfer, queue, forward):
            at.append(at[-1] + dt.timedelta(seconds=step))
        return at[0], at[1], at[2], at[3]


@dataclass
class Boots:
    """The processes of the server a file spans: each ``server_args`` line starts one, so from the
    second on a restart (a new boot: its pool fresh)."""

    #: the lines (numbers) of the file's server_args lines; and at each restart, the requests
    #: received and not finished before it (in flight when the process ended)
    lines: list[int] = field(default_factory=list)
    in_flight_at_restart: list[int] = field(default_factory=list)
    #: the times of the server_args lines read (with whether to the fraction of a second), and the
    #: boot each request's lines were on: what a --log-requests-target file beside the server's log
    #: (no start-up lines of its own) takes its boots from
    times: list[tuple[dt.datetime, bool]] = field(default_factory=list)
    of: dict[str, int] = field(default_factory=dict)


@dataclass
class Batches:
    """A scheduler's ``Decode batch`` lines, as runs: lines alike one after the other (the same
    scheduler, time and running batch) are repeats at the log's time resolution, not one line
    printed twice, and are read as one record that counts all their steps. The first pass counts
    each run's lines; the second reads them back run by run. Per (node, TP rank) of the line."""

    runs: dict[tuple[str, int | None], list[int]] = field(default_factory=dict)  # run lengths, in order
    last: dict[tuple[str, int | None], tuple[dt.datetime | None, int]] = field(default_factory=dict)
    at: dict[tuple[str, int | None], int] = field(default_factory=dict)  # (second pass) the run read last

    def count(self, scheduler: tuple[str, int | None], said: tuple[dt.datetime | None, int]) -> None:
        """First pass: a line of ``scheduler`` saying ``said`` (its time and running batch)."""
        runs = self.runs.setdefault(scheduler, [])
        if self.last.get(scheduler) == said:
            runs[-1] += 1
        else:
            runs.append(1)
        self.last[scheduler] = said

    def rewind(self) -> None:
        """Before the second pass."""
        self.last.clear()
        self.at.clear()

    def run_of(self, scheduler: tuple[str, int | None], said: tuple[dt.datetime | None, int]) -> int:
        """Second pass: how many lines the run a line starts has; 0 for a line that continues one."""
        if self.last.get(scheduler) == said:
            return 0
        self.last[scheduler] = said
        k = self.at[scheduler] = self.at.get(scheduler, -1) + 1
        runs = self.runs.get(scheduler, [])
        return runs[k] if k < len(runs) else 1  # (past the first pass's lines: a file that grew)


@dataclass
class Facts:
    """What a whole file says, learnt in a first pass, that single lines need: of its server,
    of each request, of its clock, of its boots and of its decode batches."""

    server: Server = field(default_factory=Server)
    seen: Seen = field(default_factory=Seen)
    clock: Clock = field(default_factory=Clock)
    boots: Boots = field(default_factory=Boots)
    batches: Batches = field(default_factory=Batches)

    def calibrate(self) -> None:
        """The clock's ``perf_counter`` zero, from its steps and the requests' receive times."""
        self.clock.calibrate(self.seen.received_at)

    def node_of_line(self, line: LogLine, rid: str | None = None) -> str:
        """The node a line's records are on: with DP attention each DP rank has its own KV pool,
        so it is a node of its own (``decode-0.dp1``), named by the line's prefix or, for the
        tokenizer's lines (no ranks), by the DP rank that served the request; else the file's."""
        dp = line.dp if line.dp is not None else (self.seen.dp_of.get(rid) if rid is not None else None)
        node = self.server.node
        return node if dp is None else dp_pool_node(node, dp)
