"""The SGLang adapters: a server's log output, and its request log files.

``sglang-server`` reads what a prefill or decode server prints (its stdout or log file): the
request log in either form, the timing statistics, transfer failures and start-up lines, all
interleaved; every other line is ignored. ``sglang-requests`` reads the request log written
to files (``--log-requests-target DIR``, ``HOST_RANK.log``), which holds request lines only.

A file is read twice: a first pass learns what single lines need from the whole file (the
node's role, each prompt's real length, precise finish times), the second translates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from forensics.adapters import sglang_config, sglang_mooncake, sglang_requests, sglang_timestats
from forensics.adapters.base import (
    Adapter,
    Lines,
    Notes,
    Options,
    Outcome,
    Untranslatable,
    first_object,
)
from forensics.adapters.sglang_log import Facts, LogLine, split

#: The line formats, in the order a line is offered to them.
_FORMATS = (sglang_requests, sglang_timestats, sglang_mooncake, sglang_config)
_SERVER_MARKS = ("server_args=ServerArgs(", "Req Time Stats(", "Receive: obj=", "Finish: obj=",
                 "failed for request rank=", "max_total_num_tokens=", '"event": "request.')
_EVIDENCE = ("request level: who was served where and when, and the handoff's token counts; "
             "no page records, so victims are named by replay")


def _translate(lines: Lines, path: Path, options: Options, notes: Notes) -> Iterator[Outcome]:
    facts = Facts(node=options.node_for(path))
    for _, text in lines():
        line = split(text, options.year)
        for fmt in _FORMATS:
            if fmt.learn(line, facts, options):
                break
    facts.calibrate()
    if facts.role_for(options) is None:
        notes.add("role", "{n} file(s) of unknown role read as a unified server, whose finishes are the "
                  "client's answers (pass --role prefill or --role decode)")
    for line_no, text in lines():
        line = split(text, options.year)
        yield line_no, text, _records(line, facts, options, notes)


def _records(
    line: LogLine, facts: Facts, options: Options, notes: Notes
) -> list[dict[str, Any]] | Untranslatable | None:
    for fmt in _FORMATS:
        try:
            records = fmt.translate(line, facts, options, notes)
        except Untranslatable as exc:
            return exc
        if records is not None:
            return records or None
    return None


def _requests_sniff(head: Sequence[str]) -> bool:
    doc = first_object(head)
    return doc is not None and str(doc.get("event", "")).startswith("request.") and "kind" not in doc


def _server_sniff(head: Sequence[str]) -> bool:
    return any(mark in text for text in head for mark in _SERVER_MARKS)


ADAPTERS = (
    Adapter(
        name="sglang-requests",
        reads="SGLang's request log files (--log-requests --log-requests-format json "
              "--log-requests-target DIR): request received and finished events",
        evidence=_EVIDENCE,
        sniff=_requests_sniff,
        translate=_translate,
    ),
    Adapter(
        name="sglang-server",
        reads="an SGLang prefill or decode server's log output: request log (JSON or text), "
              "request time stats, KV-transfer failures, server_args and pool size",
        evidence=_EVIDENCE,
        sniff=_server_sniff,
        translate=_translate,
    ),
)
