"""A simulated run written as SGLang servers would have logged it: drills for the adapters.

From a canonical log set made by the simulator, each prefill and decode node gets the log
output an SGLang v0.5 server prints with ``--log-requests --log-requests-level 1
--enable-request-time-stats-logging`` (``kvforensics simulate --sglang-logs DIR``). Line
formats follow SGLang's source: request_logger.py (text form by default, SGLang's own
default; ``text=False`` for ``--log-requests-format json``), the scheduler's time stats,
validate_input_length's error, server_args and the pool line. Tenants, which SGLang does not
log, go to ``tenants.json`` for ``--tenant-map`` (a folder ingest passes it over).

Times: the JSON request log has microseconds; the bracketed prefix whole seconds; the time
stats' durations 10 microseconds and ``start_time`` (the scheduler's perf_counter, here
seconds since the node's config plus 1000) milliseconds.

What SGLang's logs cannot show is not written: page records, and a transfer that lands after
decode gave up on it (the timeout shows as the request's 504, the late landing nowhere).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

Emit = Callable[[dt.datetime, str], None]
LENGTH_ERROR = ("Input length ({n} tokens) exceeds the maximum allowed length ({m} tokens). "
                "Use a shorter input or enable --allow-auto-truncate.")


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _prefix(t: dt.datetime, rank: str = " TP0") -> str:
    return f"[{t.strftime('%Y-%m-%d %H:%M:%S')}{rank}] "


def _ms(a: dt.datetime, b: dt.datetime) -> str:
    return f"{(b - a) / dt.timedelta(milliseconds=1):.2f}ms"


def _perf(t0: dt.datetime, t: dt.datetime) -> str:
    """``time.perf_counter()`` at ``t`` as the scheduler prints it, for a process started at ``t0``."""
    return f"{1000 + (t - t0).total_seconds():.3f}"


def _room(rid: str) -> int:
    return 1000 + int("".join(c for c in rid if c.isdigit()) or "0")


def _obj(rid: str, max_new: int | None) -> dict[str, Any]:
    return {"text": None, "input_ids": None, "sampling_params": {"max_new_tokens": max_new, "temperature": 0.7},
            "rid": rid, "return_logprob": False, "stream": False, "bootstrap_host": "10.0.0.1",
            "bootstrap_port": 8998, "bootstrap_room": _room(rid)}


def _py(value: Any) -> str:
    """A value as SGLang's _dataclass_to_string_truncated writes it."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_py(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _request_line(t: dt.datetime, event: str, obj: dict[str, Any], out: dict[str, Any] | None,
                  text: bool) -> str:
    if not text:
        logged = {k: v for k, v in obj.items() if k not in ("text", "input_ids")}  # level 1 skips them
        data: dict[str, Any] = {"timestamp": t.replace(tzinfo=None).isoformat(), "event": f"request.{event}",
                                "rid": obj["rid"], "obj": logged}
        if out is not None:
            data["out"] = out
        return json.dumps(data, ensure_ascii=False)
    fields = ", ".join(f"{k}={_py(v)}" for k, v in obj.items())
    head = "Receive" if event == "received" else "Finish"
    line = f"{_prefix(t, '')}{head}: obj=GenerateReqInput({fields})"
    return line + (f", out={_py(out)}" if out is not None else "")


def write(logs: Path, out: Path, *, text: bool = True) -> tuple[list[Path], Path]:
    """SGLang-style logs of the simulated log set ``logs`` in ``out``: the files, and the tenant map."""
    records = [json.loads(line) for f in sorted(logs.glob("*.jsonl")) for line in f.read_text().splitlines()]
    by_node: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_node[r["node"]].append(r)
    received = {r["request_id"]: r for r in by_node.pop("router", []) if r.get("event") == "received"}
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for node, recs in sorted(by_node.items()):
        recs.sort(key=lambda r: (r.get("boot", 0), r["seq"]))
        config = next(r for r in recs if r["kind"] == "config")
        files.append(_node_log(node, config, recs, received, out, text))
    tenants = out / "tenants.json"
    tenants.write_text(json.dumps({rid: r["tenant_id"] for rid, r in sorted(received.items())}, indent=0) + "\n")
    return files, tenants


def _node_log(node: str, config: dict[str, Any], recs: list[dict[str, Any]], received: dict[str, dict[str, Any]],
              out: Path, text: bool) -> Path:
    role, page = config["role"], config["page_size"]
    t0 = _ts(config["ts"])
    lines: list[tuple[dt.datetime, int, str]] = []

    def emit(t: dt.datetime, line: str) -> None:
        lines.append((t, len(lines), line))

    emit(t0, f"{_prefix(t0, '')}server_args=ServerArgs(model_path='zai-org/{config['model']}', "
             f"context_length={config['context_length']}, page_size={page}, tp_size=8, log_requests=True, "
             f"log_requests_level=1, log_requests_format='{'text' if text else 'json'}', "
             f"disaggregation_mode='{role}', disaggregation_transfer_backend='mooncake')")
    emit(t0, f"{_prefix(t0)}max_total_num_tokens={(config['pool_pages'] - 1) * page}, chunked_prefill_size=8192, "
             f"max_prefill_tokens=16384, max_running_requests=4096, context_len={config['context_length']}, "
             "available_gpu_mem=9.87 GB")
    state: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in recs:
        rid, kind = r.get("request_id"), r["kind"]
        if rid is None or kind == "kv":
            continue
        t = _ts(r["ts"])
        rq = received[rid]
        obj = _obj(rid, rq.get("max_new_tokens"))
        s = state[rid]
        if role == "prefill":
            _prefill_lines(emit, t, r, rq, obj, s, text)
        else:
            _decode_lines(emit, t, r, rq, obj, s, text, t0)
    lines.sort(key=lambda x: (x[0], x[1]))
    path = out / f"{node}.log"
    path.write_text("".join(line + "\n" for _, _, line in lines))
    return path


def _prefill_lines(emit: Emit, t: dt.datetime, r: dict[str, Any], rq: dict[str, Any], obj: dict[str, Any],
                   s: dict[str, Any], text: bool) -> None:
    """A prefill node's lines for one of its records: the request log at arrival, the length
    error at rejection, the time stats and the finish (an abort if rejected) once sent."""
    rid, kind, event = r["request_id"], r["kind"], r.get("event")
    if "received" not in s and kind == "request":
        s["received"] = True
        arrived = _ts(rq["ts"])
        emit(arrived, _request_line(arrived, "received", obj, None, text))
    if kind == "request" and event == "rejected":
        s["abort"] = LENGTH_ERROR.format(n=rq["prompt_tokens"], m=r.get("limit_tokens"))
        emit(t, f"{_prefix(t)}{s['abort']}, self.rid={rid!r}")
    if kind == "request" and event == "finished":  # rejected at admission (the hardened engine)
        out = _finish_out(rid, 1, 0, abort=s.get("abort", r.get("finish_reason", "abort")), status=r["status"])
        emit(t, _request_line(t, "finished", obj, out, text))
    if kind == "transfer" and event == "completed":
        emit(t, f"{_prefix(t)}Req Time Stats(rid={rid}, bootstrap_room={_room(rid)}, input len={r['tokens']}, "
                "output len=1, type=prefill): queue_duration=0.00ms, forward_duration=30.00ms, start_time=0.000")
        out = _finish_out(rid, r["tokens"], 1, abort=s.get("abort"), status=400)
        emit(t, _request_line(t, "finished", obj, out, text))


def _decode_lines(emit: Emit, t: dt.datetime, r: dict[str, Any], rq: dict[str, Any], obj: dict[str, Any],
                  s: dict[str, Any], text: bool, t0: dt.datetime) -> None:
    """A decode node's lines: the request log at admission; at the finish, the time stats
    (durations between admission, landing, decode start and finish) and the request log."""
    rid, kind, event = r["request_id"], r["kind"], r.get("event")
    if kind == "request" and event == "admitted":
        s["admitted"] = t
        emit(t, _request_line(t, "received", obj, None, text))
    elif kind == "transfer" and event == "completed":
        s.setdefault("landed", t)
    elif kind == "request" and event == "decode_started":
        s["started"] = t
    elif kind == "request" and event == "finished":
        if r["status"] < 400 and "started" in s:
            emit(t, f"{_prefix(t)}Req Time Stats(rid={rid}, bootstrap_room={_room(rid)}, "
                    f"input len={rq['prompt_tokens']}, output len={r.get('output_tokens', 0)}, type=decode): "
                    f"prealloc_duration=0.00ms, transfer_duration={_ms(s['admitted'], s['landed'])}, "
                    f"queue_duration={_ms(s['landed'], s['started'])}, "
                    f"forward_duration={_ms(s['started'], t)}, start_time={_perf(t0, s['admitted'])}")
            out = _finish_out(rid, rq["prompt_tokens"], r.get("output_tokens", 0))
        else:
            out = _finish_out(rid, rq["prompt_tokens"], 0, abort=r.get("finish_reason", "abort"), status=r["status"])
        emit(t, _request_line(t, "finished", obj, out, text))


def _finish_out(rid: str, prompt: int, completion: int, *, abort: str | None = None,
                status: int = 200) -> dict[str, Any]:
    reason: dict[str, Any] = ({"type": "abort", "message": abort, "status_code": status, "err_type": None}
                              if abort is not None else {"type": "length", "length": completion})
    return {"meta_info": {"id": rid, "finish_reason": reason, "prompt_tokens": prompt,
                          "completion_tokens": completion, "cached_tokens": 0, "e2e_latency": 0.5}}
