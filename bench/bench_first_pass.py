"""The SGLang adapter's first pass two ways on a million-line log: today's, line by line, against a
bulk columnar pass (issue #46, item 2).

Run: python bench/bench_first_pass.py [--lines 1000000] [--release 0.5.23] [--form text|json] [--repeat 5]

The log is bench_sglang_lines.py's (a release fixture's prefill log, its request block repeated).
Timed in alternating rounds, in one process, the load (``/proc/loadavg``) printed at each:

- ``today``: the adapter's first pass as it runs it (``_learn`` into a ``_Kept``, the collector
  paused), in this process;
- ``columnar``: the file read in blocks (64 MiB), its lines split, told apart and their fields
  extracted by Polars' regular expressions over the whole block, then the learning (the part
  that depends on the lines before) as one Python loop over the extracted columns of the lines
  that matter. A line of a shape the columns do not cover (a JSON line, a prefix with a fraction
  of a second or without a year, a bare request line of 0.5.8 to 0.5.11, one with user text or
  an escaped abort message, a decode time-stats line, an integrity error, a start-up line) is
  read there as today's pass reads it (``read_line`` and the format's ``learn``): 3 lines of the
  million here;
- the whole adapter (both passes, no database): as it runs, and with the columnar first pass
  (which keeps nothing for the second: the second pass reads every line again).

Each round's CPU seconds are this process's, its threads' included (Polars'). Each design's
``Facts`` are compared field by field with today's, and the whole adapter's outcomes line by
line; any difference is printed and fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import gc
import hashlib
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sglang_lines import adapter_only, build  # noqa: E402

from forensics.adapters import Options  # noqa: E402
from forensics.adapters.sglang import adapter  # noqa: E402
from forensics.adapters.sglang.adapter import learn_line  # noqa: E402
from forensics.adapters.sglang.formats import read_line  # noqa: E402
from forensics.adapters.sglang.log import Facts, Server, _second  # noqa: E402
from forensics.adapters.sglang.requests import CAPACITY_ERROR, HEALTH_CHECK, LENGTH_ERROR  # noqa: E402

BLOCK = 64 << 20

#: A whole-second prefix (``[2026-11-02 08:00:02 TP0] ``, the tags ending before the 96th
#: character, as sglang/log.py's split reads them): date, time, tags
_PLAIN = r"^\[(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)((?: [^\]\x1b]{0,74})?)\] ?"
_AFTER = r"^\[[^\]]*\] ?"  # (on a line with a plain prefix: up to its message)
_STATS_MARK = r"Time Stats\(|TimeStats\("
#: What any of the formats looks for before reading a line (each ``read``'s test)
_MARKS = (_STATS_MARK + r"| failed for request rank=|exceeds|is longer than the model|Context corruption detected|"
          r"KV checksum mismatch|server_args=|max_total_num_tokens=|KV pool holds| HTTP/")
_ACCESS = r' - "POST /(?:generate|v1/chat/completions|v1/completions)[?\S]* HTTP/[\d.]+" (\d{3})\b'
#: a text request line of levels 0 and 1 (requests._FAST_RID): event, what precedes the rid, rid
_REQUEST = _AFTER + r"(Receive|Finish): obj=GenerateReqInput\(([^'\"(){}\[\]]*?)\brid='([^'\\]+)'"
_SAMPLING = r", sampling_params=\{([^{}'\"]*(?:'[a-z_]+': [^{}'\",]*(?:, )?)*)\}"
_ROOM = r", bootstrap_room=(-?\d+|None)[,)]"
_OWN = ", bootstrap_host='2.2.2.2'"
#: a time-stats line whose head and steps are laid out as every release from 0.5.12 prints them
_TIME_STATS = (_AFTER + r"(Req Time Stats|ReqTimeStats)\(rid=([^\s,=)]+), bootstrap_room=([^\s,=)]+), "
               r"input[ _]len=(\d+), (?:cached_input_len=\d+, )?output[ _]len=(\d+), (?:attempts=(\d+), )?"
               r"type=([^\s,=)]+)\):")
_STEPS = r"\):\s*(?:#?[a-z_]+=-?[0-9]+(?:\.[0-9]+)?\s*(?:ms|GB/s|MB)?(?:, |\s*$))*$"
_FAILURE = (_AFTER + r".*?(Prefill|Decode) (?:transfer|bootstrap|handshake) failed for request rank=\d+ "
            r"(?:decode_req\.)?req\.rid='([^']*)' (?:decode_req\.)?req\.bootstrap_room=(-?\d+|None)")
_LENGTH = r"Input length \((\d+) tokens\) exceeds the maximum allowed length \((\d+) tokens\)"
_CAPACITY = r"Request (\S+) exceeds the maximum number of tokens: (\d+) > (\d+)"
_CONTEXT = r"Error: The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)"

FALLBACK, RECEIVE, FINISH, TIME_STATS, ACCESS, FAILURE, LENGTH, CAPACITY, CONTEXT = range(9)


def _blocks(path: Path) -> Iterator[bytes]:
    """The file in blocks of whole lines (the last line's end left out)."""
    with path.open("rb") as fh:
        pending = b""
        while chunk := fh.read(BLOCK):
            chunk = pending + chunk
            end = chunk.rfind(b"\n")
            if end < 0:
                pending = chunk
                continue
            pending = chunk[end + 1:]
            yield chunk[:end]
        if pending:
            yield pending


def _split(data: bytes) -> pl.Series:
    """A block's lines, decoded as the ingest's reader decodes them (read_csv where no line is
    blank and the bytes are plain UTF-8: three times faster than splitting the decoded block)."""
    if b"\r" in data:
        raise NotImplementedError("a block with carriage returns: its lines split as Python splits them")
    if b"\n\n" not in data and not data.startswith(b"\n") and b"\x01" not in data:
        with contextlib.suppress(UnicodeDecodeError):
            data.decode("utf-8")
            return pl.read_csv(data, has_header=False, separator="\x01", quote_char=None, new_columns=["t"],
                               schema_overrides=[pl.String])["t"]
    return pl.Series("t", [data.decode("utf-8", "backslashreplace")]).str.split("\n").explode()


def _frame(lines: pl.Series) -> tuple[pl.DataFrame, list[tuple[Any, ...]]]:
    """A block's lines as columns: what the learning loop needs of each line that matters, in the
    file's order (``i`` the line's index in the block); and the block's last line with a time."""
    df = lines.to_frame("t").with_row_index("i")
    t = pl.col("t")
    prefix = t.str.extract_groups(_PLAIN)
    df = df.with_columns(
        key=pl.concat_str(prefix.struct.field("1"), pl.lit("T"), prefix.struct.field("2")),
        tags=prefix.struct.field("3"),
        bare=t.str.contains(r"^[^\s\[{\x{feff}]") & ~t.str.contains("\x1b", literal=True),
        request=t.str.contains(_AFTER + r"(?:Receive: |Finish: |\{)"),
        bare_request=t.str.starts_with("Receive: ") | t.str.starts_with("Finish: "),
        marked=t.str.contains(_MARKS),
        blank=t.str.contains(r"^\s*$"),
    )
    valid = pl.col("key").str.strptime(pl.Datetime, "%Y-%m-%dT%H:%M:%S", strict=False).is_not_null()
    df = df.with_columns(plain=valid.fill_null(False), key=pl.when(valid).then(pl.col("key")))
    # the last line with a time before each (what a line read as today's pass reads it may need)
    df = df.with_columns(prev_i=pl.when(pl.col("plain")).then(pl.col("i")).forward_fill().shift(1),
                         prev_key=pl.col("key").forward_fill().shift(1))
    last = df.filter(pl.col("plain")).select("i", "key").tail(1).rows()
    plain, bare, marked = pl.col("plain"), pl.col("bare"), pl.col("marked")
    df = df.filter((plain & (pl.col("request") | marked)) | (bare & (pl.col("bare_request") | marked))
                   | ~(plain | bare | pl.col("blank")))
    df = df.with_columns(kind=pl.when(plain & pl.col("request")).then(RECEIVE)
                         .when(~plain & ~(bare & ~pl.col("bare_request"))).then(FALLBACK))
    df = df.with_columns(access=pl.when(pl.col("kind").is_null()).then(t.str.extract(_ACCESS, 1).cast(pl.Int64)))
    df = df.with_columns(kind=pl.when(pl.col("kind").is_not_null()).then(pl.col("kind"))
                         .when(pl.col("access").is_not_null()).then(ACCESS)
                         .when(plain).then(TIME_STATS).otherwise(FALLBACK))
    parts = [_requests(df.filter(pl.col("kind") == RECEIVE)), _others(df.filter(pl.col("kind") == TIME_STATS)),
             df.filter(pl.col("kind").is_in([FALLBACK, ACCESS]))]
    out = pl.concat(parts, how="diagonal_relaxed").sort("i")
    return out.with_columns(t=pl.when(pl.col("kind") == FALLBACK).then(t)), last


def _requests(df: pl.DataFrame) -> pl.DataFrame:
    """Request lines: event, rid, room, output budget, whether the server sent it itself; for a
    finish, its meta_info's counts, DP rank, send time and an abort's message and status.
    FALLBACK where requests._fast would not read the line (or might not: read as today)."""
    t = pl.col("t")
    head = t.str.extract_groups(_REQUEST)
    finish = head.struct.field("1") == "Finish"
    pre, rid = head.struct.field("2"), head.struct.field("3")
    rooms = t.str.count_matches(", bootstrap_room=", literal=True)
    out_at = t.str.find(", out={", literal=True)
    df = df.with_columns(
        finish=finish, rid=rid, room=t.str.extract(_ROOM, 1), room_at=t.str.find(", bootstrap_room=", literal=True),
        out_at=out_at, own_at=t.str.find(_OWN, literal=True),
        sampling=t.str.extract(_SAMPLING, 1),
        meta=pl.when(finish).then(t.str.split_exact("'meta_info': {", 1).struct.field("field_1")),
        ok=(rid.is_not_null() & ~t.str.contains(r"text=['\"]|'text': ")
            & ~pre.str.contains("bootstrap_room=|sampling_params=")
            & ~rid.str.contains("bootstrap_room=|sampling_params=")
            & (t.str.contains(_SAMPLING) | ~t.str.contains(", sampling_params=", literal=True))
            & ((rooms == 0) | (rooms == 1)) & (~finish | (t.str.count_matches(", out={", literal=True) == 1))
            & (~finish | (t.str.count_matches("'meta_info': {", literal=True) == 1))),
    )
    room_end = pl.col("room_at") + len(", bootstrap_room=") + pl.col("room").str.len_bytes()
    reason = pl.col("meta").str.extract(r"'finish_reason': (?:None|\{'type': '(\w+)')", 0)
    abort_type = pl.col("meta").str.extract(r"'finish_reason': (?:None|\{'type': '(\w+)')", 1)
    rest = pl.col("meta").str.extract(r"'finish_reason': \{'type': 'abort'(.*)$", 1)
    status = rest.str.extract_groups(r"'status_code': (?:(\d+)|<HTTPStatus\.\w+: (\d+)>)")
    df = df.with_columns(
        ok=pl.col("ok") & (pl.col("room_at").is_null() | (pl.col("room").is_not_null()
                                                          & (~pl.col("finish") | (room_end < pl.col("out_at")))))
        & (~pl.col("finish") | (pl.col("meta").is_not_null() & reason.is_not_null()
                                & (t.str.find("'meta_info': {", literal=True) > pl.col("out_at")))),
        own=(pl.col("own_at").is_not_null() & (~pl.col("finish") | (pl.col("own_at") < pl.col("out_at"))))
        | rid.str.starts_with(HEALTH_CHECK),
        room=pl.when(pl.col("room") != "None").then(pl.col("room")),
        max_new=pl.col("sampling").str.extract(r"'max_new_tokens': (\d+)", 1).cast(pl.Int64),
        prompt=pl.col("meta").str.extract(r"'prompt_tokens': (\d+)", 1).cast(pl.Int64),
        cached=pl.col("meta").str.extract(r"'cached_tokens': (\d+)", 1).cast(pl.Int64),
        dp_rank=pl.col("meta").str.extract(r"'dp_rank': (\d+)", 1).cast(pl.Int64),
        sent=pl.col("meta").str.extract(r"'response_sent_to_client_ts': (\d+(?:\.\d+)?(?:e[+-]?\d+)?)", 1),
        abort=abort_type == "abort",
        plain_message=rest.str.split_exact("'message': ", 1).struct.field("field_1").str.extract(r"^'([^'\\]*)'", 1),
        quoted=rest.str.extract(r"'message': ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", 1),
        status=status.struct.field("1").fill_null(status.struct.field("2")).cast(pl.Int64),
    )
    message = pl.col("plain_message").fill_null(pl.col("quoted").str.slice(1, pl.col("quoted").str.len_chars() - 2))
    quoted = pl.col("quoted").is_not_null() & ~pl.col("quoted").str.contains("\\", literal=True)
    df = df.with_columns(ok=pl.col("ok") & (~pl.col("abort").fill_null(False) | pl.col("plain_message").is_not_null()
                                            | quoted),
                         message=pl.when(pl.col("abort")).then(message))
    return df.with_columns(kind=pl.when(~pl.col("ok")).then(FALLBACK).when(pl.col("finish")).then(FINISH)
                           .otherwise(RECEIVE)).drop("meta", "ok", "finish", "sampling", "plain_message", "quoted",
                                                     "room_at", "out_at", "own_at")


def _others(df: pl.DataFrame) -> pl.DataFrame:
    """Time-stats lines of the usual layout on a prefill or unified node (their head and what
    the first pass notes of their steps), transfer failures, length, capacity and context errors.
    FALLBACK for any other line that matters (decode time stats, integrity errors, start-up
    lines: read as today)."""
    stats = pl.col("t").str.contains(_STATS_MARK)
    df = df.with_columns(dp=pl.col("tags").str.extract(r"\bDP(\d+)\b", 1).cast(pl.Int64))
    return pl.concat([_time_stats(df.filter(stats)), _errors(df.filter(~stats))], how="diagonal_relaxed")


def _time_stats(df: pl.DataFrame) -> pl.DataFrame:
    t = pl.col("t")
    df = df.with_columns(head=t.str.extract_groups(_TIME_STATS), steps=t.str.contains(_STEPS),
                         once=t.str.count_matches(_STATS_MARK) == 1)
    head = pl.col("head")
    ok = (head.struct.field("1").is_not_null() & (head.struct.field("7") != "decode") & pl.col("steps")
          & pl.col("once")).fill_null(False)
    return df.with_columns(
        kind=pl.when(ok).then(TIME_STATS).otherwise(FALLBACK),
        old_head=head.struct.field("1") == "Req Time Stats", rid=head.struct.field("2"),
        room=pl.when(head.struct.field("3") != "None").then(head.struct.field("3")),
        input_len=head.struct.field("4").cast(pl.Int64), output_len=head.struct.field("5").cast(pl.Int64),
        attempts=head.struct.field("6").cast(pl.Int64), type=head.struct.field("7"),
        speed=t.str.contains(r"[:,]\s*transfer_speed=-?[0-9]+(?:\.[0-9]+)?\s*(?:GB/s|MB)?(?:, |\s*$)"),
        retries=t.str.contains(r"[:,]\s*#retries=-?[0-9]+(?:\.[0-9]+)?\s*(?:GB/s|MB)?(?:, |\s*$)"),
    ).drop("head", "steps", "once")


def _errors(df: pl.DataFrame) -> pl.DataFrame:
    t = pl.col("t")
    df = df.with_columns(fail=t.str.extract_groups(_FAILURE), length=t.str.extract_groups(_LENGTH),
                         capacity=t.str.extract_groups(_CAPACITY), context=t.str.extract_groups(_CONTEXT),
                         named=t.str.extract(_AFTER + r".*?rid='([^']*)'", 1),
                         failed=t.str.contains(" failed for request rank=", literal=True),
                         exceeds=t.str.contains("exceeds", literal=True),
                         longer=t.str.contains("is longer than the model", literal=True))
    fail, length, capacity, context = pl.col("fail"), pl.col("length"), pl.col("capacity"), pl.col("context")
    exceeds = pl.col("exceeds")
    kind = (pl.when(pl.col("failed") & fail.struct.field("1").is_not_null()).then(FAILURE)
            .when(pl.col("failed")).then(FALLBACK)
            .when(exceeds & length.struct.field("1").is_not_null()).then(LENGTH)
            .when(exceeds & capacity.struct.field("1").is_not_null()).then(CAPACITY)
            .when(~exceeds & pl.col("longer") & context.struct.field("1").is_not_null()).then(CONTEXT)
            .otherwise(FALLBACK))
    df = df.with_columns(kind=kind)
    k = pl.col("kind")
    return df.with_columns(
        rid=pl.when(k == FAILURE).then(fail.struct.field("2")).when(k == CAPACITY).then(capacity.struct.field("1"))
        .when(k == LENGTH).then(pl.col("named")),
        room=pl.when((k == FAILURE) & (fail.struct.field("3") != "None")).then(fail.struct.field("3")),
        tokens=pl.when(k == LENGTH).then(length.struct.field("1")).when(k == CAPACITY)
        .then(capacity.struct.field("2")).when(k == CONTEXT).then(context.struct.field("1")).cast(pl.Int64),
        limit=pl.when(k == LENGTH).then(length.struct.field("2")).when(k == CAPACITY)
        .then(capacity.struct.field("3")).when(k == CONTEXT).then(context.struct.field("2")).cast(pl.Int64),
    ).drop("fail", "length", "capacity", "context", "named", "failed", "exceeds", "longer")


_COLUMNS = ("i", "kind", "t", "key", "prev_i", "prev_key", "access", "rid", "room", "max_new", "prompt", "dp_rank",
            "cached", "sent", "own", "message", "status", "old_head", "input_len", "output_len", "attempts", "type",
            "speed", "retries", "dp", "tokens", "limit")


def columnar_learn(path: Path, facts: Facts, options: Options) -> Facts:
    """The first pass over a file, into ``facts``: the same facts as ``adapter._learn``."""
    if options.tenant_from is not None or options.year is not None:
        raise NotImplementedError("--tenant-from, --year: every request line read whole")
    facts.clock.last_ts = None
    facts.boots.lines, facts.boots.in_flight_at_restart = [], []
    base = 0  # the line number before the block's first
    last_ts = None
    for data in _blocks(path):
        lines = _split(data)
        df, last = _frame(lines)
        cols = [df[c].to_list() if c in df.columns else [None] * len(df) for c in _COLUMNS]
        last_i = -1  # (the line in this block last_ts is the time of; -1, a block before)
        for (i, kind, t, key, prev_i, prev_key, access, rid, room, max_new, prompt, dp_rank, cached, sent, own, message,
             status, old_head, input_len, output_len, attempts, type_, speed, retries, dp, tokens,
             limit) in zip(*cols, strict=True):
            if kind == FALLBACK:
                if prev_i is not None and prev_i > last_i:
                    last_ts = _second(prev_key)
                facts.clock.last_ts = last_ts
                if (ts := _fallback(base + i + 1, t, facts, options)) is not None:
                    last_i, last_ts = i, ts
                continue
            if kind == ACCESS:
                facts.seen.access[access] = facts.seen.access.get(access, 0) + 1
                continue
            ts = _second(key)  # (the frame's keys are times strptime read)
            assert ts is not None
            last_i, last_ts = i, ts
            if kind == TIME_STATS:
                facts.server.roles_seen.add(type_)
                facts.server.marks.add("time_stats.old_head" if old_head else "time_stats.new_head")
                if attempts is not None:
                    facts.server.marks.add("time_stats.attempts")
                elif not old_head:
                    facts.server.marks.add("time_stats.no_attempts")
                if retries:
                    facts.server.marks.add("time_stats.retries")
                if dp is not None:
                    facts.seen.dp_of.setdefault(rid, dp)
                if room is not None and rid not in facts.seen.rooms:
                    facts.seen.rooms[rid] = room
                if type_ == "prefill":
                    facts.server.marks.add("time_stats.transfer_speed" if speed else "time_stats.no_transfer_speed")
                    if input_len > 1:
                        facts.seen.learn_prompt(rid, input_len, 1)
                    if attempts == 0 and output_len == 0:
                        facts.server.marks.add("time_stats.retired")
            elif kind == RECEIVE or kind == FINISH:
                _request(kind == FINISH, rid, room, ts, max_new, prompt, dp_rank, cached, sent, own, message, status,
                         facts)
            elif kind == FAILURE:
                facts.seen.failed.add(rid)
                if dp is not None:
                    facts.seen.dp_of.setdefault(rid, dp)
                if room is not None and rid not in facts.seen.rooms:
                    facts.seen.rooms[rid] = room
            elif kind == CONTEXT:
                facts.seen.pending_context.append((ts, tokens, limit))
            elif rid is not None:  # LENGTH, CAPACITY (a length error naming no request: nothing)
                facts.seen.learn_prompt(rid, tokens, 3)
                if kind == LENGTH:
                    facts.seen.limit[rid] = limit
                else:
                    facts.seen.limit.setdefault(rid, limit)
                if dp is not None:
                    facts.seen.dp_of.setdefault(rid, dp)
            if len(facts.boots.lines) > 1 and rid is not None:
                facts.boots.of[rid] = len(facts.boots.lines) - 1
        if last and last[0][0] > last_i:
            last_ts = _second(last[0][1])
        base += len(lines)
    facts.clock.last_ts = last_ts
    return facts


def _request(finish: bool, rid: str, room: str | None, ts: dt.datetime, max_new: int | None, prompt: int | None,
             dp_rank: int | None, cached: int | None, sent: str | None, own: bool, message: str | None,
             status: int | None, facts: Facts) -> None:
    """requests.learn, from a request line's columns."""
    facts.server.marks.add("request.text.prefixed")
    if room is not None and rid not in facts.seen.rooms:
        facts.seen.rooms[rid] = str(int(room))
    if own:
        facts.seen.warmups.add(rid)
    if not finish:
        facts.seen.received.add(rid)
        if rid not in facts.seen.warmups:
            facts.seen.open_receives[rid] = ts
        facts.seen.received_at.setdefault(rid, ts)
        if max_new is not None:
            facts.seen.max_new[rid] = max_new
        return
    facts.seen.finished.add(rid)
    facts.seen.open_receives.pop(rid, None)
    facts.seen.learn_cached(rid, cached)
    code = (status or 500) if message is not None else 200
    if rid not in facts.seen.batched and not rid.startswith(HEALTH_CHECK):
        facts.seen.finish_status[code] = facts.seen.finish_status.get(code, 0) + 1
    if dp_rank is not None:
        facts.seen.dp_of.setdefault(rid, dp_rank)
    if sent is not None:
        at = dt.datetime.fromtimestamp(float(sent), dt.UTC)
        if ts <= at < ts + _ONE_SECOND:
            facts.clock.finish_ts[rid] = at
    m = LENGTH_ERROR.search(message) if message else None
    c = CAPACITY_ERROR.search(message) if message and m is None else None
    if m:
        facts.seen.learn_prompt(rid, int(m.group(1)), 3)
        facts.seen.limit[rid] = int(m.group(2))
    elif c:
        facts.seen.learn_prompt(rid, int(c.group(2)), 3)
        facts.seen.limit[rid] = int(c.group(3))
    elif prompt is not None:
        facts.seen.learn_prompt(rid, prompt, 2)
    if message and _FAILED.search(message):
        facts.seen.failed.add(rid)


_ONE_SECOND = dt.timedelta(seconds=1)
_FAILED = re.compile(r"(transfer|bootstrap|handshake) failed")


def _fallback(line_no: int, text: str, facts: Facts, options: Options) -> Any:
    """A line read and learnt from as ``adapter._learn`` does; its time."""
    line, k, value = read_line(text, options)
    learn_line(line_no, line, k, value, facts, options)
    return line.ts


def _lines(path: Path) -> Callable[[], Iterator[tuple[int, str]]]:
    def lines() -> Iterator[tuple[int, str]]:
        with path.open() as fh:
            for n, t in enumerate(fh, 1):
                if not t.isspace():  # (as forensics.ingestion.readers.text_lines: blank lines left out)
                    yield n, t.rstrip("\n")
    return lines


def today(path: Path) -> Facts:
    """The first pass as the adapter runs it (adapter._translate): into facts and a _Kept."""
    options = Options()
    kept = adapter._Kept()
    with adapter._first_pass() as frozen:
        facts = adapter._learn(_lines(path), Facts(Server(node=options.node_for(path))), options, kept)
    if frozen:
        gc.unfreeze()
    del kept
    return facts


def columnar(path: Path) -> Facts:
    """The columnar first pass, the collector paused as for today's."""
    options = Options()
    with adapter._first_pass() as frozen:
        facts = columnar_learn(path, Facts(Server(node=options.node_for(path))), options)
    if frozen:
        gc.unfreeze()
    return facts


@contextlib.contextmanager
def _columnar_first_pass(path: Path) -> Iterator[None]:
    """The adapter with the columnar first pass (which keeps nothing for the second)."""
    real = adapter._learn

    def learn(lines: Any, facts: Facts, options: Options, kept: Any = None) -> Facts:
        return columnar_learn(path, facts, options) if kept is not None else real(lines, facts, options, kept)

    adapter._learn = learn
    try:
        yield
    finally:
        adapter._learn = real


def whole(path: Path, digest: bool = False) -> tuple[int, str, list[tuple[str, int, str]]]:
    """Both passes (bench_sglang_lines.adapter_only): lines, and with ``digest`` a digest of
    their outcomes, and the notes."""
    from forensics.adapters import Notes

    if not digest:
        return adapter_only(path), "", []
    adapter_ = next(a for a in adapter.ADAPTERS if a.name == "sglang-server")
    assert adapter_.translate is not None
    notes = Notes()
    h = hashlib.blake2b()
    n = 0
    for line_no, _, out in adapter_.translate(_lines(path), path, Options(), notes):
        h.update(f"{line_no}{out!r}".encode())
        n += 1
    return n, h.hexdigest(), notes.rows()


def differences(a: Facts, b: Facts) -> list[str]:
    """The fields in which two Facts differ."""
    out = []
    for part in dataclasses.fields(Facts):
        pa, pb = getattr(a, part.name), getattr(b, part.name)
        for f in dataclasses.fields(pa):
            x, y = getattr(pa, f.name), getattr(pb, f.name)
            if x != y or (isinstance(x, dict) and list(x) != list(y)):  # (dict order: open_receives is tied in order)
                size = f" ({len(x):,} against {len(y):,})" if hasattr(x, "__len__") else f" ({x!r} against {y!r})"
                out.append(f"{part.name}.{f.name}{size}")
    return out


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--release", default="0.5.23")
    parser.add_argument("--form", default="text", choices=("text", "json"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-whole", action="store_true", help="the first passes only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "prefill-0.log"
        n = build(log, args.lines, args.release, args.form)
        print(f"SGLang {args.release} {args.form} prefill log: {n:,} lines, {log.stat().st_size / 2**20:,.0f} MiB; "
              f"Polars {pl.__version__}, {pl.thread_pool_size()} threads", flush=True)
        # the same facts, and the same outcomes, before anything is timed
        want = today(log)
        diff = differences(want, columnar(log))
        print("Facts, columnar against today: " + ("the same" if not diff else "DIFFERENT in " + ", ".join(diff)),
              flush=True)
        assert not diff
        if not args.no_whole:
            ref = whole(log, digest=True)
            with _columnar_first_pass(log):
                other = whole(log, digest=True)
            same = ref == other
            print(f"outcomes of the whole adapter, columnar first pass against today's: "
                  f"{'the same' if same else 'DIFFERENT'} ({ref[0]:,} lines, notes {len(ref[2])})", flush=True)
            assert same
        runs: dict[str, Callable[[], Any]] = {
            "today": lambda: today(log),
            "columnar": lambda: columnar(log),
        }
        if not args.no_whole:
            runs["whole adapter, today"] = lambda: whole(log)
            runs["whole adapter, columnar first pass"] = lambda: _with(_columnar_first_pass(log), lambda: whole(log))
        times: dict[str, list[float]] = {k: [] for k in runs}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for r in range(args.repeat):
            order = list(runs) if r % 2 == 0 else list(reversed(runs))
            for name in order:
                load = _load()
                t, used = time.perf_counter(), _cpu()
                runs[name]()
                times[name].append(time.perf_counter() - t)
                cpu[name].append(_cpu() - used)
                gc.collect()
                print(f"  round {r + 1}, {name}: {n / times[name][-1]:,.0f} lines/s, {cpu[name][-1]:.1f} s CPU "
                      f"(load {load})", flush=True)
        base = statistics.median(times["today"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:50s} {med:6.2f} s {n / med:10,.0f} lines/s  ({base / med:.2f}x today's first pass; "
                  f"CPU {statistics.median(cpu[name]):.1f} s; rounds {', '.join(f'{n / x:,.0f}' for x in ts)})")


def _cpu() -> float:
    """CPU seconds of this process (its threads included)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _with(cm: contextlib.AbstractContextManager[Any], f: Callable[[], Any]) -> Any:
    with cm:
        return f()


if __name__ == "__main__":
    main()
