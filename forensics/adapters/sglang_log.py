"""What every SGLang log format shares: the line prefix, Python reprs, and per-file facts.

SGLang writes through Python's logging: ``[%(asctime)s{prefix}] %(message)s`` with the date
as ``%Y-%m-%d %H:%M:%S`` (older releases) or ``%m-%d %H:%M:%S`` (newer, no year), the prefix
naming the rank (`` TP0``, `` DP0 TP1``). The request logger's JSON form writes bare JSON
objects (``%(message)s``) with an ISO ``timestamp``. Times are the server's clock, read as
UTC. Objects in the text forms are Python reprs (``GenerateReqInput(rid='a', ...)``), which
:func:`py_value` reads without evaluating anything.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
from dataclasses import dataclass, field
from typing import Any

from forensics.adapters.base import Options, Untranslatable

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(
    r"\[(?P<date>\d{4}-\d\d-\d\d |\d\d-\d\d )?(?P<time>\d\d:\d\d:\d\d)(?P<frac>[.,]\d{1,9})?(?P<tags>[^\]]*)\] ?"
)
#: ``<Foo object at 0x7f..>``, ``<HTTPStatus.BAD_REQUEST: 400>``: reprs that are not Python syntax.
_OPAQUE = re.compile(r"<[^<>'\"]*>")
#: Truncated values: ``'abc' ... 'xyz'`` and ``[1, 2] ... [8, 9]`` (_dataclass_to_string_truncated).
_TRUNCATED = re.compile(r"(['\"\]]) \.\.\. (['\"\[])")


@dataclass(frozen=True)
class LogLine:
    """A line split into its time (UTC; ``None`` where it has none or no year) and message;
    ``doc`` is the object of a bare JSON line."""

    ts: dt.datetime | None
    precise: bool  # the time has a fraction of a second
    msg: str
    doc: dict[str, Any] | None = None
    undated: bool = False  # a prefix time without a year (and no --year)

    def when(self) -> dt.datetime:
        """The line's time, or the reason the line cannot be placed in time."""
        if self.ts is None:
            if self.undated:
                raise Untranslatable("the log time has no year; pass --year")
            raise Untranslatable("the line has no log time")
        return self.ts


def split(text: str, year: int | None) -> LogLine:
    """A raw line as time and message (a line that is neither prefixed nor JSON keeps its text)."""
    t = _ANSI.sub("", text).strip().lstrip("\ufeff")
    if t.startswith("{"):
        try:
            doc = json.loads(t)
        except (ValueError, RecursionError):  # (a JSON value nested past Python's stack)
            return LogLine(None, False, t)
        if isinstance(doc, dict):
            ts = iso_time(doc.get("timestamp"))
            # isoformat() gives microseconds (and leaves out a fraction only when it is zero)
            return LogLine(ts, ts is not None, t, doc)
        return LogLine(None, False, t)
    m = _PREFIX.match(t)
    if m is None:
        return LogLine(None, False, t)
    msg = t[m.end():]
    date = (m["date"] or "").strip()
    if not date:
        return LogLine(None, False, msg)
    if len(date) == 5:  # MM-DD
        if year is None:
            return LogLine(None, False, msg, undated=True)
        date = f"{year:04d}-{date}"
    frac = (m["frac"] or "")[1:]
    try:
        ts = dt.datetime.fromisoformat(f"{date}T{m['time']}").replace(tzinfo=dt.UTC)
    except ValueError:
        return LogLine(None, False, msg)
    if frac:
        ts += dt.timedelta(microseconds=int(frac.ljust(6, "0")[:6]))
    return LogLine(ts, bool(frac), msg)


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
    """``2026-09-14T08:01:02.500000Z``: UTC, to the microsecond."""
    return ts.astimezone(dt.UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def py_value(text: str) -> Any:
    """A Python repr as data: calls become dicts (``__type__`` naming the class), literals
    stay, anything else is kept as its source text. Nothing is evaluated."""
    src = _TRUNCATED.sub(r"\1 + \2", _OPAQUE.sub(lambda m: repr(m.group(0)), text))
    try:
        tree = ast.parse(src, mode="eval")
        return _value(tree.body, src)
    except (RecursionError, MemoryError):  # a repr nested (or an expression chained) past what Python parses
        raise ValueError("nested too deeply to read") from None


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
class Facts:
    """What a whole file says, learnt in a first pass, that single lines need.

    The prompt length of a request, for one: after the placeholder swap a prefill node logs
    an input of 1 token, and only the length error says how long the prompt was.
    """

    node: str = ""  # the node the file is from
    role: str | None = None  # from server_args (disaggregation_mode) or time-stats types
    page_size: int | None = None
    context_length: int | None = None
    model: str | None = None
    prompt: dict[str, tuple[int, int]] = field(default_factory=dict)  # rid -> (rank, tokens)
    limit: dict[str, int] = field(default_factory=dict)  # rid -> max_req_input_len logged
    tenant: dict[str, str] = field(default_factory=dict)  # rid -> tenant (--tenant-from)
    max_new: dict[str, int] = field(default_factory=dict)
    finish_ts: dict[str, dt.datetime] = field(default_factory=dict)  # precise finish times
    failed: set[str] = field(default_factory=set)  # requests whose transfer failed or aborted on decode
    roles_seen: set[str] = field(default_factory=set)
    #: decode time stats: rid -> (start, prealloc, transfer, queue, forward) in perf_counter
    #: seconds, and the whole second the line was logged in (text logs have no fraction)
    steps: dict[str, tuple[tuple[float, float, float, float, float], dt.datetime]] = field(default_factory=dict)
    offset: dt.datetime | None = None  # wall-clock time of perf_counter 0 (calibrate())
    last_decode_line: dt.datetime | None = None  # (translation) time of the last decode request line
    parsed: dict[str, Any] = field(default_factory=dict)  # request lines parsed by the first pass

    def calibrate(self) -> None:
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
        if lower is not None and upper is not None and lower < upper:
            self.offset = dt.datetime.fromtimestamp((lower + upper) / 2, tz=dt.UTC)

    def step_times(self, rid: str) -> tuple[dt.datetime, dt.datetime, dt.datetime, dt.datetime] | None:
        """Calibrated (admitted, landed, decode started, finished) of a decode request."""
        hit = self.steps.get(rid)
        if hit is None or self.offset is None:
            return None
        (start, prealloc, transfer, queue, forward), _ = hit
        base = self.offset + dt.timedelta(seconds=start)
        at = [base + dt.timedelta(seconds=prealloc)]
        for step in (transfer, queue, forward):
            at.append(at[-1] + dt.timedelta(seconds=step))
        return at[0], at[1], at[2], at[3]

    def learn_prompt(self, rid: str, tokens: int, rank: int) -> None:
        """Keep the most trustworthy prompt length seen for ``rid`` (higher ``rank`` wins)."""
        old = self.prompt.get(rid)
        if old is None or rank > old[0]:
            self.prompt[rid] = (rank, tokens)

    def prompt_tokens(self, rid: str) -> int | None:
        """The real prompt length the file logged for ``rid``, if any."""
        hit = self.prompt.get(rid)
        return None if hit is None else hit[1]

    def role_for(self, options: Options) -> str | None:
        """The node's role: ``--role``, else what the file said, else None."""
        if options.role is not None:
            return options.role
        if self.role is not None:
            return self.role
        if len(self.roles_seen) == 1:
            return next(iter(self.roles_seen))
        return None
