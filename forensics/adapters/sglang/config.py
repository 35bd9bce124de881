"""An SGLang server's configuration, from its start-up lines.

References: the launcher's ``server_args`` line (``entrypoints/engine.py``): the dataclass
repr ``server_args=ServerArgs(model_path='...', context_length=..., page_size=64,
disaggregation_mode='prefill', ...)`` up to 0.5.18, a dict ``server_args={'model_path': ...}``
from 0.5.19; the scheduler's start-up line (``managers/scheduler.py``, TP rank 0 of each DP
rank) ``max_total_num_tokens=681280, chunked_prefill_size=..., context_len=1048576, ...``,
which states the KV pool the server really got; and, from 0.5.23, the warning of
``managers/tp_worker.py`` ``KV pool holds N tokens, fewer than --context-length C``, which
gives the same where the pool line is missing. And the model runner's lines of a KV pool of
another layout than the plain paged one (:data:`LAYOUT_SIGNS`), printed as it starts, before the
pool line.

Canonical record: a ``config`` at the pool line, for a prefill or decode server, one per KV
pool. With DP attention every DP rank has its own pool of the same size, but the scheduler logs
the line only where its global TP rank is 0 (``if tp_rank == 0``, every release; with DP attention
the TP ranks run on across DP ranks), so DP0's first scheduler alone prints it: the server's
``server_args`` say how many pools there are (``dp_size`` with ``enable_dp_attention``; from
0.5.23, ``attn_dp_size``), and the line gives a config to each (``decode-0.dp0``, ``decode-0.dp1``).
Without DP attention each DP replica's first scheduler is TP rank 0 of its own and prints its own.
For each: ``pool_pages = max_total_num_tokens / page_size + 1`` (page 0 is
reserved), so that ``(pool_pages - 1) * page_size`` is the pool in tokens. SGLang does not log
its version: ``engine_version`` is the range of releases whose formats the file shows
(:mod:`forensics.adapters.sglang.eras`), ``unknown`` where it shows none.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from forensics.adapters.base import LineFormat, Notes, Options, Untranslatable
from forensics.adapters.sglang.log import Facts, LogLine, py_value, rfc3339
from forensics.ids import dp_pool_node

_SERVER_ARGS = re.compile(r"server_args=(ServerArgs\(.*\)|\{.*\})\s*$", re.S)
_POOL = re.compile(r"max_total_num_tokens=(?P<tokens>\d+),.*?context_len=(?P<context>\d+)")
_POOL_WARNING = re.compile(r"KV pool holds (?P<tokens>\d+) tokens, fewer than --context-length (?P<context>\d+)")
_ROLES = {"prefill": "prefill", "decode": "decode", "null": "unified"}
#: How each line a model runner prints of a KV pool the replay does not model begins, and schema
#: v1.1's config field it sets (docs/schema-v1.1.md). ``hybrid_pool``: a hybrid sliding-window
#: model's pools (``SWATokenToKVPoolAllocator``): the sizing line (the model runner's in 0.5.5,
#: ``Use Sliding window memory pool. ...``; its KV cache mixin's in 0.5.7 and 0.5.8 and its pool
#: configurator's from 0.5.11, ``Use sliding window memory pool. ...`` or ``... (all SWA)``) and the
#: pool's (``SWAKVPool mem usage: ...``; from 0.5.19 ``SWAKVPool VA upper bound: ...`` too); the
#: unified memory pool (0.5.18 on, ``[unified-memory-pool] UNIFIED MEMORY POOL ENABLED -- path=...``).
#: ``recurrent_state``: a hybrid linear-attention model's recurrent state (``Mamba Cache is
#: allocated. ...``, every release). Read at the start of the message only: a request's text
#: elsewhere in a line is not a sign.
LAYOUT_SIGNS = (("Use Sliding window memory pool", "hybrid_pool"), ("Use sliding window memory pool", "hybrid_pool"),
                ("SWAKVPool ", "hybrid_pool"), ("[unified-memory-pool] UNIFIED MEMORY POOL ENABLED", "hybrid_pool"),
                ("Mamba Cache is allocated", "recurrent_state"))
#: schema v1.1's KV pool fields, stated on every config a pool line makes (true where a sign was seen)
LAYOUT_FIELDS = ("hybrid_pool", "recurrent_state")


class ConfigLine(NamedTuple):
    """A start-up line read: ``server_args`` (``args``: the arguments, None where they do not
    read; ``form``: ``repr`` or ``dict``), ``pool`` or ``pool_warning`` (its tokens and context),
    or ``layout`` (``form``: the field of :data:`LAYOUT_FIELDS` it sets)."""

    what: str
    args: dict[str, Any] | None = None
    form: str = ""
    tokens: int = 0
    context: int = 0


def read(line: LogLine, options: Options) -> ConfigLine | None:
    """The start-up line's facts, None for a line of another kind."""
    msg = line.msg
    if "server_args=" in msg and (m := _SERVER_ARGS.search(msg)) is not None:
        form = "repr" if m.group(1).startswith("ServerArgs(") else "dict"
        try:
            args = py_value(m.group(1))
        except (SyntaxError, ValueError):
            args = None
        return ConfigLine("server_args", args if isinstance(args, dict) else None, form)
    if "max_total_num_tokens=" in msg and (m := _POOL.search(msg)) is not None:
        return ConfigLine("pool", tokens=int(m["tokens"]), context=int(m["context"]))
    if "KV pool holds" in msg and (m := _POOL_WARNING.search(msg)) is not None:
        return ConfigLine("pool_warning", tokens=int(m["tokens"]), context=int(m["context"]))
    for sign, field in LAYOUT_SIGNS:
        if msg.startswith(sign):
            return ConfigLine("layout", form=field)
    return None


def learn(c: ConfigLine, line: LogLine, facts: Facts, options: Options) -> ConfigLine:
    """First pass: the model, page size, context and role from a start-up line."""
    if c.what == "pool":
        facts.server.pool_seen = True
    elif c.what == "layout":
        facts.server.layouts.add(c.form)
    elif c.what == "pool_warning":
        facts.server.marks.add("pool_warning")
    else:
        facts.server.marks.add(f"server_args.{c.form}")
        args = c.args or {}
        if isinstance(args.get("page_size"), int):
            facts.server.page_size = args["page_size"]
        if isinstance(args.get("context_length"), int):
            facts.server.context_length = args["context_length"]
        model = args.get("served_model_name") or args.get("model_path")
        if isinstance(model, str):
            facts.server.model = model
        role = _ROLES.get(str(args.get("disaggregation_mode")))
        if role is not None:
            facts.server.role = role
        facts.server.dp_pools = _dp_pools(args)
        tp_size = args.get("tp_size")
        if isinstance(tp_size, int) and not isinstance(tp_size, bool) and tp_size >= 1:
            facts.server.attn_tp_size = max(1, tp_size // facts.server.dp_pools)
        facts.server.scheduling = _scheduling(args)
        if args.get("enable_unified_memory") is True:  # (0.5.18 on; its model runner says so too)
            facts.server.layouts.add("hybrid_pool")
        return ConfigLine("server_args")  # (the arguments are not needed again)
    return c


def translate(c: ConfigLine, line: LogLine, facts: Facts, options: Options, notes: Notes) -> list[dict[str, Any]]:
    """The records of a server_args, pool or pool-warning line."""
    if c.what in ("server_args", "layout") or (c.what == "pool_warning" and facts.server.pool_seen):
        return []  # (a warning: the pool line says it, and more)
    role = facts.server.role_for(options)
    if role not in ("prefill", "decode"):
        notes.add("config", "{n} pool lines of a server whose role is unknown or unified: no config "
                  "record (pass --role prefill or --role decode)")
        return []
    if facts.server.page_size is None:
        raise Untranslatable("the pool line's page size is unknown: no server_args line in this file")
    record = {
        "kind": "config", "ts": rfc3339(line.when()), "node": facts.node_of_line(line), "role": role,
        "engine": "sglang", "engine_version": facts.server.era or "unknown", "model": facts.server.model or "unknown",
        "context_length": c.context, "page_size": facts.server.page_size,
        "pool_pages": c.tokens // facts.server.page_size + 1,
        **{k: v for k, v in facts.server.scheduling.items() if k in _SCHEDULING_OF[role]},
        # (the pool line ends the start-up that printed any sign: none there says the plain pool)
        **{k: k in facts.server.layouts for k in LAYOUT_FIELDS if c.what == "pool" or k in facts.server.layouts},
    }
    if facts.server.dp_pools > 1 and line.dp in (0, None):  # DP0's line, for every DP rank's pool
        return [{**record, "node": dp_pool_node(facts.server.node, d)} for d in range(facts.server.dp_pools)]
    return [record]


#: decode's ``--disaggregation-decode-enable-offload-kvcache`` (server_args, 0.5.3 on)
OFFLOAD = "disaggregation_decode_enable_offload_kvcache"
#: Which of schema v1.1's scheduling fields (docs/schema-v1.1.md) a config of each role states.
_SCHEDULING_OF = {"prefill": ("prefix_cache",),
                  "decode": ("overlap_schedule", "prefix_cache", "step_log_interval", "speculative_decoding",
                             "kv_offload")}


def _scheduling(args: dict[str, Any]) -> dict[str, bool | int]:
    """Schema v1.1's scheduling fields from a server's arguments, as printed (after SGLang's own
    adjustments: speculative decoding or pipeline parallelism print ``disable_overlap_schedule=True``
    already): ``overlap_schedule`` (decode's loop; ``not disable_overlap_schedule``),
    ``prefix_cache`` (prefill: ``not disable_radix_cache``; decode:
    ``disaggregation_decode_enable_radix_cache``), ``step_log_interval`` (the steps between two
    decode batch lines: ``decode_log_interval``), ``speculative_decoding`` (``speculative_algorithm``
    set: ``EAGLE``, ``NEXTN``, ...) and ``kv_offload`` (decode: ``disaggregation_decode_enable_offload_kvcache``,
    0.5.3 on). A flag the line does not print says nothing."""
    out: dict[str, bool | int] = {}
    if isinstance(args.get("disable_overlap_schedule"), bool):
        out["overlap_schedule"] = not args["disable_overlap_schedule"]
    if args.get("disaggregation_mode") == "decode":
        if isinstance(args.get("disaggregation_decode_enable_radix_cache"), bool):
            out["prefix_cache"] = args["disaggregation_decode_enable_radix_cache"]
        elif isinstance(args.get("disable_radix_cache"), bool):  # (releases before the decode flag: off on decode)
            out["prefix_cache"] = False
    elif isinstance(args.get("disable_radix_cache"), bool):
        out["prefix_cache"] = not args["disable_radix_cache"]
    if "speculative_algorithm" in args:
        out["speculative_decoding"] = args["speculative_algorithm"] not in (None, "", "None")
    if isinstance(args.get(OFFLOAD), bool):
        out["kv_offload"] = args[OFFLOAD]
    interval = args.get("decode_log_interval")
    if isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1:
        out["step_log_interval"] = interval
    return out


def _dp_pools(args: dict[str, Any]) -> int:
    """How many KV pools a server with DP attention has, from its arguments (1 without)."""
    attn = args.get("attn_dp_size")
    if isinstance(attn, int) and attn > 1:
        return attn
    dp = args.get("dp_size")
    return dp if args.get("enable_dp_attention") is True and isinstance(dp, int) and dp > 1 else 1


class ConfigFormat(LineFormat[LogLine, Facts, ConfigLine]):
    """The start-up lines: server_args, the pool line and its warning, the signs of a pool's layout."""

    signs = ("server_args=ServerArgs(", "server_args={", "max_total_num_tokens=")
    read = staticmethod(read)
    learn = staticmethod(learn)
    translate = staticmethod(translate)
