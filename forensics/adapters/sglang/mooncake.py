"""SGLang's KV-transfer failures (the Mooncake connector, and the other PD backends alike).

Reference: ``python/sglang/srt/disaggregation/mooncake/conn.py`` (``KVTransferError``,
``KVTransferError(bootstrap_room=B): reason``) and the queues that report it,
``disaggregation/prefill.py`` and ``disaggregation/decode.py``::

    Prefill transfer failed for request rank=4 req.rid='R' req.bootstrap_room=B with exception \
KVTransferError(bootstrap_room=B): Decode instance could be dead, remote mooncake session ... is not alive
    Decode transfer failed for request rank=0 decode_req.req.rid='R' decode_req.req.bootstrap_room=B with ...

(also ``Prefill bootstrap failed`` and ``Decode handshake failed``). Up to 0.5.12 every
tensor-parallel rank logs its own line; from 0.5.13 a failure propagated from another rank is
logged at debug, so one rank prints it. Repeats translate to the same record and count as
duplicates. With DP attention the line's ``DPk`` names the node (``decode-0.dp1``).

Canonical record: a transfer ``failed``, id ``room-B``, this node as the sending (prefill) or
receiving (decode) side, the other side ``unknown``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options
from forensics.adapters.sglang.log import Facts, LogLine, rfc3339
from forensics.adapters.sglang.timestats import UNKNOWN_NODE, transfer_id

_LINE = re.compile(
    r"(?P<side>Prefill|Decode) (?P<stage>transfer|bootstrap|handshake) failed for request rank=\d+ "
    r"(?:decode_req\.)?req\.rid='(?P<rid>[^']*)' (?:decode_req\.)?req\.bootstrap_room=(?P<room>-?\d+|None)"
)


class Failure(NamedTuple):
    """A transfer-failure line read: the side that logged it, the request and its room."""

    side: str  # Prefill or Decode
    rid: str
    room: str


def read(line: LogLine, options: Options) -> Failure | None:
    """The failure on this line, None for a line of another kind."""
    m = _LINE.search(line.msg) if " failed for request rank=" in line.msg else None
    return None if m is None else Failure(m["side"], m["rid"], m["room"])


def learn(m: Failure, line: LogLine, facts: Facts, options: Options) -> Failure:
    """First pass: note the request a transfer-failure line names as failed."""
    facts.seen.failed.add(m.rid)
    facts.seen.learn_dp(m.rid, line)
    facts.seen.learn_room(m.rid, m.room)
    return m


def translate(m: Failure, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The transfer records of a KV-transfer failure line."""
    prefill = m.side == "Prefill"
    node = facts.node_of_line(line, m.rid)
    return [{
        "kind": "transfer", "ts": rfc3339(line.when()), "transfer_id": transfer_id(m.rid, m.room),
        "request_id": m.rid, "event": "failed",
        "src_node": node if prefill else UNKNOWN_NODE, "dst_node": UNKNOWN_NODE if prefill else node, "node": node,
    }]


class FailureFormat(LineFormat[LogLine, Facts, Failure]):
    """The KV-transfer failure lines."""

    signs = ("failed for request rank=",)
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
