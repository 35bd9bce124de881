"""SGLang's request log (``--log-requests``), JSON and text forms, from prefill and decode nodes.

Reference: ``python/sglang/srt/utils/request_logger.py``. Each server's tokenizer manager
logs a request when it arrives and when it finishes:

- JSON (``--log-requests-format json``): ``{"timestamp": ..., "event": "request.received",
  "rid": ..., "obj": {...}}`` and ``"request.finished"`` with ``"out": {"meta_info": ...}``;
- text: ``Receive: obj=GenerateReqInput(rid='...', ...)`` and
  ``Finish: obj=GenerateReqInput(...), out={'meta_info': {...}}``.

``meta_info`` has ``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (on prefill, what
the time stats' ``prefill_started`` says the prefix cache gave, where they do not),
``finish_reason`` (``{'type': 'abort', 'message': ..., 'status_code': 400}`` for an abort) and the
times decode retracted the request under memory pressure (``num_retractions``, ``total_retractions``
to 0.5.11: a decode finish's ``retractions``, schema v1.1, where above 0).
Prompt text and output are not read (levels 0 and 1 do not log them; at higher levels they are
ignored).

Canonical records, by the node's role (a prefill node's finish is its answer to the router,
not the client's; in disaggregated mode the client gets the decode node's):

=========  ===================================  ==========================================
line       prefill                              decode                 unified (no PD)
=========  ===================================  ==========================================
received   ``received`` (tenant, prompt)        ``admitted``           both
finished   ``rejected`` if aborted, else none   ``finished``           ``finished``
=========  ===================================  ==========================================
"""

from __future__ import annotations

import ast
import datetime as dt
import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options, Untranslatable
from forensics.adapters.sglang.log import Facts, LogLine, dig, py_value, rfc3339, status_code

_TEXT = re.compile(r"(?P<what>Receive|Finish): (?P<args>obj=.*)", re.S)
_EVENTS = {"request.received": "received", "request.finished": "finished"}
#: ``validate_input_length``'s error: the prompt's real length, and the prefill limit.
LENGTH_ERROR = re.compile(r"Input length \((\d+) tokens\) exceeds the maximum allowed length \((\d+) tokens\)")
#: The disaggregation queues' capacity check (prefill and decode): rid, prompt, capacity.
CAPACITY_ERROR = re.compile(r"Request (\S+) exceeds the maximum number of tokens: (\d+) > (\d+)")
#: The tokenizer's context check, as the HTTP server logs the error it raised (no rid).
CONTEXT_ERROR = re.compile(
    r"Error: The input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)")
#: Integrity aborts on decode (0.5.9 on; 0.5.21 on): the finish reason each becomes.
INTEGRITY = {"Metadata corruption detected - bootstrap_room mismatch": "bootstrap_room_mismatch",
             "KV checksum mismatch": "kv_checksum_mismatch"}


class RequestLine(NamedTuple):
    """A request-log line read: its event, request id, the logged request and, for a finish, its output."""

    event: str  # received or finished
    rid: str
    obj: dict[str, Any]
    meta: dict[str, Any]  # out.meta_info of a finish
    #: the items' rids of a batch the server sent itself (its start-up warmup before 0.5.18), the
    #: first of them ``rid``; each item finishes on a line of its own
    batch: tuple[str, ...] = ()

    @property
    def finish_reason(self) -> dict[str, Any]:
        """The output's ``meta_info.finish_reason`` as a dict (empty where it is missing)."""
        fr = self.meta.get("finish_reason")
        if isinstance(fr, dict):
            return fr
        return {"type": fr} if isinstance(fr, str) else {}

    @property
    def aborted(self) -> bool:
        """Whether the request finished aborted."""
        return self.finish_reason.get("type") == "abort"


def parse(line: LogLine, *, whole: bool = False) -> RequestLine | None:
    """The request event on this line, None if it is none; a malformed one is Untranslatable.
    A text line that holds no user text (log levels 0 and 1) is read by :func:`_fast`, unless
    ``whole`` asks for the whole logged request (``--tenant-from``)."""
    if line.doc is None and not whole and line.msg.startswith(("Receive: obj=", "Finish: obj=")):
        fast = _fast(line.msg)
        if fast is not None:
            return fast
    if line.doc is not None:
        event = _EVENTS.get(str(line.doc.get("event")))
        if event is None:
            return None
        obj, out = line.doc.get("obj"), line.doc.get("out")
        rid = line.doc.get("rid")
    else:
        m = _TEXT.match(line.msg)
        if m is None:
            if line.msg.startswith("{") and '"request.' in line.msg:
                raise Untranslatable("a request-log line that is not valid JSON")
            return None
        event = "received" if m["what"] == "Receive" else "finished"
        try:
            args = py_value(f"_({m['args']})")
        except (SyntaxError, ValueError) as exc:
            raise Untranslatable(f"cannot read the logged request ({exc.__class__.__name__})") from None
        obj, out = args.get("obj"), args.get("out")
        rid = obj.get("rid") if isinstance(obj, dict) else None
    if not isinstance(obj, dict):
        raise Untranslatable("the logged request has no object")
    if rid is None:
        rid = obj.get("rid")
    if isinstance(rid, list):
        if event == "received" and _own_batch(rid, obj):
            return RequestLine(event, rid[0], {"bootstrap_host": FAKE_BOOTSTRAP_HOST}, {}, tuple(rid))
        raise Untranslatable("a batch request (rid is a list); log requests one by one")
    if not isinstance(rid, str) or not rid:
        raise Untranslatable("the logged request has no rid")
    meta = dig(out, "meta_info") if event == "finished" else None
    if event == "finished" and not isinstance(meta, dict):
        raise Untranslatable("the finished request has no out.meta_info")
    return RequestLine(event, rid, obj, meta or {})


_FAST_RID = re.compile(
    r"(?P<what>Receive|Finish): obj=GenerateReqInput\((?P<pre>[^'\"(){}\[\]]*?)\brid='(?P<rid>[^'\\]+)'")
_FAST_SAMPLING = re.compile(r", sampling_params=\{(?P<sp>[^{}'\"]*(?:'[a-z_]+': [^{}'\",]*(?:, )?)*)\}")
_FAST_MAX_NEW = re.compile(r"'max_new_tokens': (\d+)")
#: meta_info's counts, each key's first in one scan
_FAST_INT = re.compile(r"'(prompt_tokens|completion_tokens|cached_tokens|dp_rank|num_retractions|total_retractions)': "
                       r"(\d+)")
#: meta_info's count of the times decode retracted the request (every release: ``total_retractions``
#: to 0.5.11, ``num_retractions`` from 0.5.12; tokenizer_manager.py, its meta_info)
RETRACTIONS = ("num_retractions", "total_retractions")
ONE_SECOND = dt.timedelta(seconds=1)
#: meta_info's wall-clock time the response was sent to the client (0.5.6 on), epoch seconds
SENT = "response_sent_to_client_ts"
_FAST_SENT = re.compile(r"'response_sent_to_client_ts': (\d+(?:\.\d+)?(?:e[+-]?\d+)?)")
_FAST_REASON = re.compile(r"'finish_reason': (?:None|\{'type': '(?P<type>\w+)'(?P<rest>.*))")
_FAST_MESSAGE = re.compile(r"'message': (?P<q>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
_FAST_PLAIN_MESSAGE = re.compile(r"'message': '([^'\\]*)'")  # (the usual message: no quote, no escape)
_FAST_STATUS = re.compile(r"'status_code': (?:(?P<n>\d+)|<HTTPStatus\.\w+: (?P<e>\d+)>)")


_FAST_ROOM = re.compile(r", bootstrap_room=(-?\d+|None)(?=[,)])")
#: The bootstrap host SGLang gives the requests it sends itself, with no transfer behind them: the
#: start-up warmup of a disaggregated server (before 0.5.18 one batch, an item per DP rank; from
#: 0.5.18 one per DP rank, room = the DP rank; server-assigned rids) and its health checks
#: (``entrypoints/http_server.py``, every release)
FAKE_BOOTSTRAP_HOST = "2.2.2.2"


#: The rid prefix of SGLang's health checks (``/health_generate``, and ``/health`` where it generates:
#: ``HEALTH_CHECK_RID_PREFIX``, written out in 0.5.5), which its scheduler tells by that prefix alone
HEALTH_CHECK = "HEALTH_CHECK"


def own_request(r: RequestLine) -> bool:
    """Whether the server sent the request itself: bootstrap host 2.2.2.2 (the warmup and health
    checks of a disaggregated server), or a health check's rid (a unified server's have no host)."""
    return r.obj.get("bootstrap_host") == FAKE_BOOTSTRAP_HOST or r.rid.startswith(HEALTH_CHECK)


def _own_batch(rids: list[Any], obj: dict[str, Any]) -> bool:
    """Whether a batch request (``rid`` a list) is the server's own: every item's bootstrap host
    2.2.2.2 (before 0.5.18 the start-up warmup is one batch, an item per DP rank)."""
    hosts = obj.get("bootstrap_host")
    return (bool(rids) and all(isinstance(rid, str) and rid for rid in rids) and isinstance(hosts, list)
            and len(hosts) == len(rids) and all(host == FAKE_BOOTSTRAP_HOST for host in hosts))


def _fast(msg: str) -> RequestLine | None:
    """A text request line read by a few patterns instead of the repr's whole grammar (about 40
    times faster), where it can be done safely: the line holds no user text (SGLang's log levels
    0 and 1 leave out ``text``, ``input_ids`` and the output), the rid comes before any string,
    and each field read is where the patterns expect it. None sends the line to the full parse."""
    m = _FAST_RID.match(msg)
    if m is None or _has_text(msg):
        return None
    obj: dict[str, Any] = {"rid": m["rid"]}
    if ", sampling_params=" in msg:
        sp = _FAST_SAMPLING.search(msg, m.end())
        skeleton = sp["sp"] if sp is not None else _skeleton(msg, msg.find(", sampling_params={", m.end()))
        if skeleton is None:
            return None
        max_new = _FAST_MAX_NEW.search(skeleton)
        if max_new is not None:
            obj["sampling_params"] = {"max_new_tokens": int(max_new.group(1))}
    at = msg.rfind(", out={") if m["what"] != "Receive" else len(msg)
    if (i := msg.find(", bootstrap_room=")) >= 0:  # (once, in the request part, or the full parse decides)
        room = _FAST_ROOM.match(msg, i, at if at >= 0 else len(msg)) if i >= m.end() else None
        if room is None or msg.find(", bootstrap_room=", i + 1) >= 0:
            return None
        if room.group(1) != "None":
            obj["bootstrap_room"] = int(room.group(1))
    if f", bootstrap_host='{FAKE_BOOTSTRAP_HOST}'" in msg[:at if at >= 0 else len(msg)]:
        obj["bootstrap_host"] = FAKE_BOOTSTRAP_HOST
    if m["what"] == "Receive":
        return RequestLine("received", m["rid"], obj, {})
    meta_at = msg.rfind("'meta_info': {", at if at >= 0 else 0)
    if at < 0 or meta_at < 0:
        return None
    meta_text = msg[meta_at:]
    meta: dict[str, Any] = {}
    for found in _FAST_INT.finditer(meta_text):
        if found.group(1) not in meta:
            meta[found.group(1)] = int(found.group(2))
    sent = _FAST_SENT.search(meta_text)
    if sent is not None:
        meta[SENT] = float(sent.group(1))
    reason = _FAST_REASON.search(meta_text)
    if reason is None:
        return None
    if reason["type"] is not None:
        fr: dict[str, Any] = {"type": reason["type"]}
        if reason["type"] == "abort":
            rest = reason["rest"]
            plain, status = _FAST_PLAIN_MESSAGE.match(rest, rest.find("'message': ")), _FAST_STATUS.search(rest)
            if plain is not None:
                fr["message"] = plain.group(1)
            else:
                message = _FAST_MESSAGE.search(rest)
                if message is None:
                    return None
                quoted = message["q"]
                fr["message"] = quoted[1:-1] if "\\" not in quoted else ast.literal_eval(quoted)
            if status is not None:
                fr["status_code"] = int(status["n"] or status["e"])
        meta["finish_reason"] = fr
    return RequestLine("finished", m["rid"], obj, meta)


def _has_text(msg: str) -> bool:
    """Whether the line may log user text: ``text='``, ``text="`` or ``'text': `` in it (one
    scan for the three: 0.85 us on a 1,640-character request line, against 2.15 us for three
    substring tests)."""
    return _TEXT_FIELD.search(msg) is not None


_TEXT_FIELD = re.compile(r"text(?:=['\"]|(?<='text)': )")


def _skeleton(msg: str, at: int) -> str | None:
    """The ``sampling_params`` dict starting at ``at`` (``, sampling_params={``) with its nested
    values dropped (stop lists may hold anything) and its strings emptied unless they are words
    (its keys): the keys and numbers of its top level. A string value that is a word is followed
    by ``,`` or ``}``, never by ``: N``, so ``'max_new_tokens': N`` there is the key. None where
    it does not close as a repr would."""
    if at < 0:
        return None
    i, depth, out, quote, start = msg.index("{", at), 0, [], "", 0
    while i < len(msg):
        c = msg[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
                if depth == 1:  # a key (or a word) kept, any other string emptied
                    word = msg[start:i]
                    out.append(f"'{word}'" if word.isidentifier() else "''")
        elif c in "'\"":
            quote, start = c, i + 1
        elif c in "{[(":
            depth += 1
        elif c in "}])":
            depth -= 1
            if depth == 0:
                return "".join(out)
        elif depth == 1:
            out.append(c)
        i += 1
    return None


#: The empty object and output of a request line kept for the second pass (never written to).
_NONE: dict[str, Any] = {}


def read(line: LogLine, options: Options) -> RequestLine | Untranslatable | None:
    """The request event on this line (None for a line of another kind; the reason for a
    malformed one), read whole where ``--tenant-from`` needs the logged request."""
    if line.doc is None and not line.msg.startswith(("Receive: ", "Finish: ", "{")):
        return None  # (what parse would say, at once: a line of another kind)
    try:
        return parse(line, whole=options.tenant_from is not None)
    except Untranslatable as exc:
        return exc


#: The era marks of a request line, by (JSON, prefixed)
_MARKS = {(doc, prefixed): f"request.{'json' if doc else 'text'}.{'prefixed' if prefixed else 'bare'}"
          for doc in (False, True) for prefixed in (False, True)}


def learn(r: RequestLine, line: LogLine, facts: Facts, options: Options) -> RequestLine:
    """First pass: the prompt length, tenant and output budget each request line reveals;
    what of it the second pass reads."""
    facts.server.marks.add(_MARKS[line.doc is not None, line.prefixed])
    room = r.obj.get("bootstrap_room")  # (dig's answer for a path of one key)
    if isinstance(room, int) and not isinstance(room, bool):
        facts.seen.learn_room(r.rid, room)
    if own_request(r):  # the server's own warmup or health check: no client's request
        facts.seen.warmups.update(r.batch or (r.rid,))
        facts.seen.batched.update(r.batch[1:])
    if r.event == "received":
        facts.seen.received.update(r.batch or (r.rid,))
        if r.rid not in facts.seen.warmups:  # (a health check skipped by a busy server never finishes: no client waits)
            facts.seen.open_receives[r.rid] = line.ts or facts.clock.last_ts
        if line.ts is not None:
            facts.seen.received_at.setdefault(r.rid, line.ts)
        if options.tenant_from is not None:
            tenant = dig(r.obj, options.tenant_from)
            if isinstance(tenant, (str, int)) and not isinstance(tenant, bool):
                facts.seen.tenant[r.rid] = str(tenant)
        sampling = r.obj.get("sampling_params")  # (as dig reads sampling_params.max_new_tokens)
        max_new = sampling.get("max_new_tokens") if isinstance(sampling, dict) else None
        if isinstance(max_new, int) and not isinstance(max_new, bool):
            facts.seen.max_new[r.rid] = max_new
        return RequestLine(r.event, r.rid, _NONE, _NONE)
    facts.seen.finished.add(r.rid)
    facts.seen.open_receives.pop(r.rid, None)
    fr = r.finish_reason
    aborted = fr.get("type") == "abort"
    status = (status_code(fr.get("status_code")) or 500) if aborted else 200  # (finish_status)
    # (one answer a batch; a GET a health check)
    if r.rid not in facts.seen.batched and not r.rid.startswith(HEALTH_CHECK):
        facts.seen.finish_status[status] = facts.seen.finish_status.get(status, 0) + 1
    dp = r.meta.get("dp_rank")
    if isinstance(dp, int) and not isinstance(dp, bool):
        facts.seen.dp_of.setdefault(r.rid, dp)
    facts.seen.learn_cached(r.rid, r.meta.get("cached_tokens"))  # (a prefill's: its prefill_started says it)
    if line.precise and line.ts is not None:
        facts.clock.finish_ts[r.rid] = line.ts
    elif (when := _line_time(line, facts)) is not None and (sent := _sent_at(r, line, when)) is not None:
        facts.clock.finish_ts[r.rid] = sent  # (the time stats of a decode request are counted back from it)
    message = str(fr.get("message", ""))
    m = LENGTH_ERROR.search(message) if message else None
    c = CAPACITY_ERROR.search(message) if message and m is None else None
    if m:
        facts.seen.learn_prompt(r.rid, int(m.group(1)), 3)
        facts.seen.limit[r.rid] = int(m.group(2))
    elif c:
        facts.seen.learn_prompt(r.rid, int(c.group(2)), 3)
        facts.seen.limit[r.rid] = int(c.group(3))
    elif isinstance(r.meta.get("prompt_tokens"), int):  # (only the length abort swaps the prompt)
        facts.seen.learn_prompt(r.rid, r.meta["prompt_tokens"], 2)
    if aborted and re.search(r"(transfer|bootstrap|handshake) failed", message):
        facts.seen.failed.add(r.rid)
    return RequestLine(r.event, r.rid, _NONE, _kept(r.meta))


def _bare(line: LogLine, facts: Facts) -> bool:
    """Whether the line has no time of its own: 0.5.8 to 0.5.11 print the request log bare."""
    return line.ts is None and not line.prefixed and not line.undated and facts.clock.last_ts is not None


def _line_time(line: LogLine, facts: Facts) -> dt.datetime | None:
    """The line's time (a bare line was written after the one before it); None where it has
    none (``line.when()`` says why)."""
    return facts.clock.last_ts if _bare(line, facts) else line.ts


def _sent_at(r: RequestLine, line: LogLine, when: dt.datetime) -> dt.datetime | None:
    """A text finish line's ``response_sent_to_client_ts`` where it falls inside the second the
    line was logged in (``when``): the finish to the microsecond. None elsewhere."""
    sent = r.meta.get(SENT) if r.event == "finished" and not line.precise else None
    if isinstance(sent, (int, float)) and not isinstance(sent, bool) \
            and when <= (at := dt.datetime.fromtimestamp(sent, dt.UTC)) < when + ONE_SECOND:
        return at
    return None


def translate(r: RequestLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The request records of a request-log line."""
    if _bare(line, facts):
        notes.add("bare_time", "{n} request-log lines have no time of their own (SGLang 0.5.8 to 0.5.11 print "
                  "them bare): each takes the time of the line before it, to the second")
    when = _line_time(line, facts) or line.when()
    sent = _sent_at(r, line, when)
    if sent is not None:
        when = sent
    role = facts.server.role_for(options) or "unified"
    # a whole-second time made precise from the decode time stats: their entry_time (0.5.12 on)
    # or their start put on the wall clock
    calibrated = (facts.clock.entry_times.get(r.rid) or facts.clock.step_times(r.rid)) \
        if role == "decode" and not line.precise and sent is None else None
    if calibrated is not None:
        if r.event == "received":  # preallocation: at or after the second the request arrived in
            if calibrated[0] >= when:
                when = calibrated[0]
        elif when <= calibrated[3] < when + ONE_SECOND:  # logged at the finish
            when = calibrated[3]
    if role == "decode" and not line.precise:
        # the lines are in the order things happened: no time made precise may undo it
        if facts.clock.last_decode_line is not None:
            when = max(when, facts.clock.last_decode_line)
        facts.clock.last_decode_line = when
    ts = rfc3339(when)
    base = {"kind": "request", "ts": ts, "request_id": r.rid, "node": facts.node_of_line(line, r.rid)}
    if r.event == "received":
        out: list[dict[str, Any]] = []
        if role in ("prefill", "unified"):
            out.append(_received(base, r, facts, options, notes, prefill=role == "prefill"))
        if role in ("decode", "unified"):
            out.append({**base, "event": "admitted"})
        if r.rid in facts.seen.rejected_on_receive:  # refused by the tokenizer, in the server log beside this file
            at, context = facts.seen.rejected_on_receive[r.rid]
            out.append({**base, "ts": rfc3339(max(at, when)), "event": "rejected", "reason": "input_too_long",
                        "limit_tokens": context})
        return out
    fr = r.finish_reason
    if role == "prefill":
        if not r.aborted:
            return []  # the prefill's answer to the router; transfer and timing come from time stats
        reason, limit = abort_reason(str(fr.get("message", ""))), facts.seen.limit.get(r.rid)
        return [{**base, "event": "rejected", "reason": reason,
                 **({"limit_tokens": limit} if limit is not None and reason == "input_too_long" else {})}]
    status = finish_status(r)
    finish_reason = abort_reason(str(fr.get("message", ""))) if r.aborted else fr.get("type")
    record: dict[str, Any] = {**base, "event": "finished", "status": status}
    if isinstance(finish_reason, str):
        record["finish_reason"] = finish_reason
    if isinstance(r.meta.get("completion_tokens"), int):
        record["output_tokens"] = r.meta["completion_tokens"]
    retracted = next((r.meta[k] for k in RETRACTIONS if k in r.meta), None)
    if isinstance(retracted, int) and not isinstance(retracted, bool) and retracted > 0:
        record["retractions"] = retracted  # (schema v1.1: the replay lists it, its node's victims possible)
    return [record]


def _kept(meta: dict[str, Any]) -> dict[str, Any]:
    """What translation reads of a finish's meta_info."""
    return {k: meta[k] for k in ("finish_reason", "prompt_tokens", "completion_tokens", SENT, *RETRACTIONS)
            if k in meta}


def _received(base: dict[str, Any], r: RequestLine, facts: Facts, options: Options, notes: Notes,
              *, prefill: bool) -> dict[str, Any]:
    prompt = facts.seen.prompt_tokens(r.rid)
    if prompt is None:
        raise Untranslatable(
            f"the prompt length of {r.rid} is not in this file (no finish, time-stats or length-error line)")
    tenants = options.tenants or {}
    tenant: str | None = tenants.get(r.rid) or facts.seen.tenant.get(r.rid)
    if tenant is None and facts.seen.by_room and r.rid in facts.seen.rooms:
        tenant = tenants.get(f"room-{facts.seen.rooms[r.rid]}")
    if tenant is None:
        tenant = "unknown"
        notes.add("tenant", "{n} requests have no tenant: tenant_id 'unknown' "
                  "(pass --tenant-map FILE or --tenant-from FIELD)")
    record = {**base, "event": "received", "tenant_id": tenant, "prompt_tokens": prompt}
    if r.rid in facts.seen.max_new:
        record["max_new_tokens"] = facts.seen.max_new[r.rid]
    if prefill:
        record["prefill_node"] = facts.server.node
    return record


def finish_status(r: RequestLine) -> int:
    """The HTTP status a finish line answers with: an abort's ``status_code`` (500 where it has
    none), else 200."""
    return (status_code(r.finish_reason.get("status_code")) or 500) if r.aborted else 200


def abort_reason(message: str) -> str:
    """A short reason for an abort message: the cases the investigation cares about by name."""
    if LENGTH_ERROR.search(message) or CAPACITY_ERROR.search(message) or CONTEXT_ERROR.search(message):
        return "input_too_long"
    for text, reason in INTEGRITY.items():
        if text in message:
            return reason
    if re.search(r"(transfer|bootstrap|handshake) failed", message):
        return "kv_transfer_failed"
    return "abort"


class RequestFormat(LineFormat[LogLine, Facts, RequestLine]):
    """The request log's lines, received and finished, in either form."""

    signs = ("Receive: obj=", "Finish: obj=", '"event": "request.')
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
