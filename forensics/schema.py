"""The canonical log schema (v1, and v1.1's additions), declared once as data: ingest, docs and
messages read it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class FieldType(StrEnum):
    """JSON shape a field must have."""

    STR = "string"
    INT = "integer"
    TS = "timestamp"  # RFC 3339 string with offset, or integer nanoseconds
    PAGES = "pages"  # a string of inclusive page-id ranges, "0-63,128"


@dataclass(frozen=True)
class Field:
    """One field of a record: its JSON shape and the values it admits."""

    name: str
    type: FieldType
    choices: tuple[str, ...] = ()
    min_value: int | None = None
    max_value: int | None = None  # where larger values cannot be real (they would break analyses)


#: The largest count of pages or tokens a record may give: 2^40 (a trillion) is far beyond any
#: pool or context; a larger value is a corrupt or hostile record, quarantined as bad_value.
PLAUSIBLE_COUNT = 2**40


@dataclass(frozen=True)
class Variant:
    """The fields a record needs beyond the common ones, for one kind and event/op; ``unless``:
    ``(field, other)`` pairs, each an optional field required where the other is absent."""

    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    unless: tuple[tuple[str, str], ...] = ()


class Reason(StrEnum):
    """Why a record was quarantined (log-schema.md section 4)."""

    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    UNKNOWN_KIND = "unknown_kind"
    UNKNOWN_OP = "unknown_op"
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    BAD_VALUE = "bad_value"
    BAD_TS = "bad_ts"
    NEGATIVE_SEQ = "negative_seq"
    BAD_PAGES = "bad_pages"
    PAGE_OUT_OF_RANGE = "page_out_of_range"
    CONFLICT = "conflict"
    UNREADABLE = "unreadable"
    UNTRANSLATABLE = "untranslatable"


REASON_TEXT: Final[dict[Reason, str]] = {
    Reason.NOT_JSON: "the line is not valid JSON (or not valid UTF-8)",
    Reason.NOT_OBJECT: "the JSON value is not an object",
    Reason.UNKNOWN_KIND: "kind is not config, request, kv, transfer or step",
    Reason.UNKNOWN_OP: "op is not alloc, share, write, read or free",
    Reason.UNKNOWN_EVENT: "event is not one the record kind defines",
    Reason.MISSING_FIELD: "a required field is missing or null",
    Reason.WRONG_TYPE: "a field has the wrong JSON type",
    Reason.BAD_VALUE: "a field's value is outside what it admits (enumeration, minimum, or a count past 2^40)",
    Reason.BAD_TS: "ts is neither an RFC 3339 time with offset nor integer nanoseconds, or is before 1970 or "
                   "after 2200",
    Reason.NEGATIVE_SEQ: "seq is negative",
    Reason.BAD_PAGES: "a page list is not inclusive ranges a-b with a <= b",
    Reason.PAGE_OUT_OF_RANGE: "a page id is outside [0, pool_pages) of the node's config in force",
    Reason.CONFLICT: "another record has the same (node, boot, seq) and a smaller canonical JSON",
    Reason.UNREADABLE: "the row could not be decoded from its file",
    Reason.UNTRANSLATABLE: "an engine log line an adapter recognised but could not turn into canonical records",
}

FIELDS: Final[dict[str, Field]] = {
    f.name: f
    for f in (
        Field("kind", FieldType.STR, ("config", "request", "kv", "transfer", "step")),
        Field("ts", FieldType.TS),
        Field("node", FieldType.STR),
        Field("seq", FieldType.INT, min_value=0),
        Field("boot", FieldType.INT, min_value=0),
        # config
        Field("role", FieldType.STR, ("prefill", "decode", "router")),
        Field("engine", FieldType.STR),
        Field("engine_version", FieldType.STR),
        Field("model", FieldType.STR),
        Field("context_length", FieldType.INT, min_value=1, max_value=PLAUSIBLE_COUNT),
        Field("page_size", FieldType.INT, min_value=1, max_value=PLAUSIBLE_COUNT),
        Field("pool_pages", FieldType.INT, min_value=1, max_value=PLAUSIBLE_COUNT),
        Field("kv_bytes_per_token", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("step_log_interval", FieldType.INT, min_value=1, max_value=PLAUSIBLE_COUNT),  # v1.1
        # request
        Field("request_id", FieldType.STR),
        Field("event", FieldType.STR),
        Field("tenant_id", FieldType.STR),
        Field("prompt_tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("max_new_tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("prefill_node", FieldType.STR),
        Field("decode_node", FieldType.STR),
        Field("reason", FieldType.STR),
        Field("limit_tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("status", FieldType.INT, min_value=0, max_value=999),
        Field("finish_reason", FieldType.STR),
        Field("output_tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("cached_tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),  # v1.1
        # v1.1, finished: times the decode server retracted the request under memory pressure (its
        # pages freed, taken afresh later: SGLang's num_retractions), which the replay does not model
        Field("retractions", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        # kv
        Field("op", FieldType.STR),
        Field("pages", FieldType.PAGES),
        Field("source", FieldType.STR, ("compute", "transfer", "decode")),
        # transfer
        Field("transfer_id", FieldType.STR),
        Field("src_node", FieldType.STR),
        Field("dst_node", FieldType.STR),
        Field("src_pages", FieldType.PAGES),
        Field("dst_pages", FieldType.PAGES),
        Field("tokens", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("bytes", FieldType.INT, min_value=0),
        # step (v1.1)
        Field("running", FieldType.INT, min_value=0, max_value=PLAUSIBLE_COUNT),
        Field("steps", FieldType.INT, min_value=1, max_value=PLAUSIBLE_COUNT),
        # what befell the node's KV cache here: "flushed", emptied while idle (SGLang's flush_cache: its pool
        # afresh, its step count from 0); "retracted", running requests' pages freed under memory pressure
        Field("cache", FieldType.STR, ("flushed", "retracted")),
    )
}

#: Schema v1.1's config flags (docs/schema-v1.1.md): how a node schedules, and what its KV pool
#: holds beside the plain paged layout. Booleans, which no
#: declared field is: the ingest keeps them in the record's text, not as columns, and the replay
#: reads them from there. (v1.1's other additions are declared fields above: ``step_log_interval``,
#: ``cached_tokens``, ``retractions``, and the ``step`` kind's ``running``, ``steps`` and ``cache``.)
V1_1_CONFIG: Final = ("overlap_schedule", "prefix_cache", "speculative_decoding", "kv_offload", "hybrid_pool",
                      "recurrent_state")

COMMON_REQUIRED: Final = ("kind", "ts", "node")
COMMON_OPTIONAL: Final = ("seq", "boot")

KINDS: Final = ("config", "request", "kv", "transfer", "step")

#: Per kind, the field that selects the variant ("event" or "op"), or None.
DISCRIMINATOR: Final[dict[str, str | None]] = {
    "config": None,
    "request": "event",
    "kv": "op",
    "transfer": "event",
    "step": None,
}

#: Fields every record of a kind needs, whatever its event or op.
KIND_FIELDS: Final[dict[str, Variant]] = {
    "config": Variant(
        required=(
            "role", "engine", "engine_version", "model",
            "context_length", "page_size", "pool_pages",
        ),
        optional=("kv_bytes_per_token", "step_log_interval"),
    ),
    "request": Variant(required=("request_id", "event")),
    "kv": Variant(required=("seq", "request_id", "op", "pages")),
    "transfer": Variant(
        required=("transfer_id", "request_id", "event", "src_node", "dst_node"),
        optional=("src_pages", "dst_pages", "tokens", "bytes"),
    ),
    # a decode loop's progress (v1.1): the running batch, and the steps since the node's last one; or,
    # with ``cache: "flushed"``, the node's caches emptied while it was idle (its pool afresh, its count from 0),
    # or with ``cache: "retracted"``, running requests' pages freed under memory pressure (the engine's line
    # says no batch: ``running`` is required only where ``cache`` is absent)
    "step": Variant(optional=("running", "steps", "cache"), unless=(("running", "cache"),)),
}

#: Per kind, the variants by event or op, with the fields each adds.
VARIANTS: Final[dict[str, dict[str, Variant]]] = {
    "config": {},
    "request": {
        "received": Variant(
            required=("tenant_id", "prompt_tokens"),
            optional=("max_new_tokens", "prefill_node", "decode_node"),
        ),
        "admitted": Variant(),
        "rejected": Variant(required=("reason",), optional=("limit_tokens",)),
        "prefill_started": Variant(optional=("cached_tokens",)),
        "prefill_done": Variant(),
        "decode_started": Variant(),
        "finished": Variant(required=("status",), optional=("finish_reason", "output_tokens", "retractions")),
    },
    "kv": {
        "alloc": Variant(),
        "share": Variant(),
        "write": Variant(optional=("source",)),
        "read": Variant(),
        "free": Variant(),
    },
    "transfer": {"started": Variant(), "completed": Variant(), "failed": Variant()},
    "step": {},
}

UNKNOWN_VARIANT_REASON: Final[dict[str, Reason]] = {
    "request": Reason.UNKNOWN_EVENT,
    "kv": Reason.UNKNOWN_OP,
    "transfer": Reason.UNKNOWN_EVENT,
}

#: Field names in sorted order: the order of keys in canonical JSON.
FIELD_ORDER: Final[tuple[str, ...]] = tuple(sorted(FIELDS))


def fields_of(kind: str, variant: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Required and optional field names of a record of this kind and event/op."""
    base = KIND_FIELDS[kind]
    extra = VARIANTS[kind].get(variant or "", Variant())
    required = COMMON_REQUIRED + base.required + extra.required
    optional = COMMON_OPTIONAL + base.optional + extra.optional
    return required, tuple(f for f in optional if f not in required)


def required_unless(kind: str, variant: str | None) -> tuple[tuple[str, str], ...]:
    """``(field, other)``: each optional field of this kind and event/op required where the other is absent."""
    return KIND_FIELDS[kind].unless + VARIANTS[kind].get(variant or "", Variant()).unless


def own_fields(kind: str, variant: str | None) -> tuple[str, ...]:
    """The fields a kind and event/op add to the common ones and to the event/op itself: those
    whose value rules (enumeration, minimum, page list) the variant checks."""
    required, optional = fields_of(kind, variant)
    common = COMMON_REQUIRED + COMMON_OPTIONAL
    return tuple(n for n in required + optional if n not in common and n != DISCRIMINATOR[kind])


def integer_fields() -> frozenset[str]:
    """Fields whose value is an integer (CSV cells are converted for these)."""
    return frozenset(f.name for f in FIELDS.values() if f.type in (FieldType.INT, FieldType.TS))
