"""An SGLang server's configuration, from its start-up lines.

Reference: ``python/sglang/srt/server_args.py`` (the launcher logs
``server_args=ServerArgs(model_path='...', context_length=..., page_size=64,
disaggregation_mode='prefill', ...)``) and the scheduler's start-up line
``max_total_num_tokens=681280, chunked_prefill_size=..., max_running_requests=...,
context_len=1048576, ...``, which states the KV pool the server really got. The length error
of ``validate_input_length`` (``Input length (N tokens) exceeds the maximum allowed length
(M tokens)``) is read for the prompt length it reveals; its record comes from the finish line.

Canonical record: a ``config`` at the pool line, for a prefill or decode server:
``pool_pages = max_total_num_tokens / page_size + 1`` (page 0 is reserved), so that
``(pool_pages - 1) * page_size`` is the pool in tokens. SGLang does not log its version: the
record says ``engine_version: unknown``.
"""

from __future__ import annotations

import re
from typing import Any

from forensics.adapters.base import Notes, Options, Untranslatable
from forensics.adapters.sglang_log import Facts, LogLine, py_value, rfc3339
from forensics.adapters.sglang_requests import LENGTH_ERROR

_SERVER_ARGS = re.compile(r"server_args=(ServerArgs\(.*\))\s*$", re.S)
_POOL = re.compile(r"max_total_num_tokens=(?P<tokens>\d+),.*?context_len=(?P<context>\d+)")
_RID = re.compile(r"rid='(?P<rid>[^']*)'")
_ROLES = {"prefill": "prefill", "decode": "decode", "null": "unified"}


def learn(line: LogLine, facts: Facts, options: Options) -> bool:
    """First pass: the model, page size, context and pool from a start-up line; whether it was one."""
    if (m := _SERVER_ARGS.search(line.msg)) is not None:
        try:
            args = py_value(m.group(1))
        except (SyntaxError, ValueError):
            return True
        if isinstance(args.get("page_size"), int):
            facts.page_size = args["page_size"]
        if isinstance(args.get("context_length"), int):
            facts.context_length = args["context_length"]
        model = args.get("served_model_name") or args.get("model_path")
        if isinstance(model, str):
            facts.model = model
        role = _ROLES.get(str(args.get("disaggregation_mode")))
        if role is not None:
            facts.role = role
        return True
    if (m := LENGTH_ERROR.search(line.msg)) is not None:  # (finish lines quoting it are read before)
        rid = _RID.search(line.msg)
        if rid is not None:
            facts.learn_prompt(rid["rid"], int(m.group(1)), 3)
            facts.limit[rid["rid"]] = int(m.group(2))
        return True
    return _POOL.search(line.msg) is not None


def translate(line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]] | None:
    """The records of a server_args, pool or length-error line; None for a line of another kind."""
    if _SERVER_ARGS.search(line.msg) is not None:
        return []
    if LENGTH_ERROR.search(line.msg) is not None:  # (finish lines that quote it are read before)
        return []  # its facts are learnt; the rejection is recorded from the request's finish
    m = _POOL.search(line.msg)
    if m is None:
        return None
    role = facts.role_for(options)
    if role not in ("prefill", "decode"):
        notes.add("config", "{n} pool lines of a server whose role is unknown or unified: no config "
                  "record (pass --role prefill or --role decode)")
        return []
    if facts.page_size is None:
        raise Untranslatable("the pool line's page size is unknown: no server_args line in this file")
    tokens = int(m["tokens"])
    return [{
        "kind": "config", "ts": rfc3339(line.when()), "role": role, "engine": "sglang",
        "engine_version": "unknown", "model": facts.model or "unknown",
        "context_length": int(m["context"]), "page_size": facts.page_size,
        "pool_pages": tokens // facts.page_size + 1,
    }]
