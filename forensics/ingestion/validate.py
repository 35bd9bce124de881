"""SQL that validates staged lines against the schema declaration and computes canonical JSON.

The whole check runs as one vectorised DuckDB query over a relation of lines
``(line_no BIGINT, raw VARCHAR)``: each line is parsed once (one ``json_extract`` of every
declared field) and the first failing check, in the order of log-schema.md section 4,
names the quarantine reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import duckdb

from forensics.ingestion import recordhash
from forensics.schema import (
    COMMON_OPTIONAL,
    DISCRIMINATOR,
    FIELD_ORDER,
    FIELDS,
    KINDS,
    UNKNOWN_VARIANT_REASON,
    VARIANTS,
    FieldType,
    Reason,
    fields_of,
    own_fields,
    required_unless,
)

#: RFC 3339's date-time (section 5.6), every part in its range: ``T`` or ``t`` (or a space, which
#: its note allows), ``Z`` or ``z``, a leap second only at a minute's end; whether the day exists
#: in its month is DuckDB's cast to say.
_RFC3339 = (r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]([01][0-9]|2[0-3]):"
            r"([0-5][0-9]:[0-5][0-9]|59:60)(\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])")
#: The times a record may give: later and earlier ones are no incident's (and break analyses).
PLAUSIBLE_TIMES = ("1970-01-01 00:00:00+00", "2201-01-01 00:00:00+00")
#: A page id has at most 13 digits: the last of a pool of 2^40 pages (schema.PLAUSIBLE_COUNT) has 13.
_PAGES = r"[0-9]{1,13}(-[0-9]{1,13})?(,[0-9]{1,13}(-[0-9]{1,13})?)*"
_INT = r"-?(0|[1-9][0-9]*)"
_WS = "' ' || chr(9) || chr(10) || chr(13)"
#: Lines DuckDB's lenient parser accepts but strict JSON may not: trailing commas, and the
#: literals nan, inf and infinity in any case, signed or not, where a value starts.
LENIENT_SUSPECT = r",\s*[\]}]|[:\[,]\s*[-+]?(?i:nan|inf)"


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _j(name: str) -> str:
    return f'"j_{name}"'


def _present(name: str) -> str:
    # json_transform gives SQL NULL for an absent key and for a JSON null alike
    return f"({_j(name)} IS NOT NULL)"


def _is_str(name: str) -> str:
    return f"starts_with({_j(name)}, '\"')"


#: Record columns that plain_stage_sql's source gives under another name.
PLAIN_SOURCE = {"event": "event_s", "op": "op_s", "max_page": "max_hi"}


@dataclass(frozen=True)
class _Fields:
    """How the checks see a record's fields: as JSON text (any line) or already typed.

    Typed fields come from the fast path (:mod:`forensics.ingestion.fast.jsonlines`), which takes only lines
    whose every value has its field's JSON type: there a field is present when its typed value
    is (ts: its JSON text), and the type checks hold by construction.
    """

    typed: bool

    def present(self, name: str) -> str:
        if not self.typed:
            return _present(name)
        column = "j_ts" if name == "ts" else PLAIN_SOURCE.get(name, name)
        return f"({column} IS NOT NULL)"

    def is_str(self, name: str) -> str:
        return "TRUE" if self.typed else _is_str(name)

    def type_ok(self, name: str) -> str:
        return "TRUE" if self.typed else _type_ok(name)


_JSON_FIELDS = _Fields(typed=False)
_TYPED_FIELDS = _Fields(typed=True)


def _is_int(name: str) -> str:
    return f"regexp_full_match({_j(name)}, {_q(_INT)})"


def _type_ok(name: str) -> str:
    ftype = FIELDS[name].type
    if ftype in (FieldType.STR, FieldType.PAGES):
        return _is_str(name)
    if ftype is FieldType.INT:
        return _is_int(name)
    return f"({_is_str(name)} OR {_is_int(name)})"


def _str_value(name: str) -> str:
    j = _j(name)
    return (
        f"CASE WHEN {_is_str(name)} THEN "
        f"CASE WHEN contains({j}, '\\') THEN json_extract_string({j}, '$') ELSE {j}[2:-2] END END"
    )


def _typed_value(name: str) -> str:
    ftype = FIELDS[name].type
    if ftype in (FieldType.STR, FieldType.PAGES):
        return _str_value(name)
    if ftype is FieldType.INT:
        return f"CASE WHEN {_is_int(name)} THEN TRY_CAST({_j(name)} AS BIGINT) END"
    # ts: RFC 3339 text with offset, or integer nanoseconds since the epoch
    j = _j(name)
    text = _str_value(name)
    return (
        f"CASE WHEN {_is_str(name)} THEN rfc3339_ts({text}) "
        f"WHEN {_is_int(name)} THEN "
        f"TRY_CAST(make_timestamp(TRY_CAST({j} AS BIGINT) // 1000) AS TIMESTAMPTZ) END"
    )


#: The time check: after the checks of presence and type, before all others.

def _ts_checks(chain: _Chain) -> None:
    """The checks of the time: that it reads, and that it is a plausible one (messages without the
    time as written: a record's content is shown only with --show-content)."""
    chain.add("ts IS NULL", Reason.BAD_TS, _q("ts is not an RFC 3339 time with offset, nor integer nanoseconds"))
    early, late = PLAUSIBLE_TIMES
    chain.add(f"ts < TIMESTAMPTZ {_q(early)} OR ts >= TIMESTAMPTZ {_q(late)}", Reason.BAD_TS,
              _q("ts is before 1970 or after 2200: no time of an incident's logs"))


class _Chain:
    """Ordered checks; the first that holds names the reason."""

    def __init__(self) -> None:
        self.branches: list[tuple[str, str]] = []

    def add(self, condition: str, reason: Reason, detail: str) -> None:
        self.branches.append((condition, f"{{'reason': {_q(reason.value)}, 'detail': {detail}}}"))

    def nest(self, condition: str, inner: _Chain) -> None:
        """Rows meeting ``condition`` take ``inner``'s verdict (NULL when all its checks pass)."""
        if inner.branches:
            self.branches.append((condition, inner.sql()))

    def sql(self) -> str:
        whens = "\n    ".join(f"WHEN {cond} THEN {then}" for cond, then in self.branches)
        return f"CASE\n    {whens}\n  END"


def _variants() -> Iterable[tuple[str, str | None, str]]:
    """Every (kind, variant, its name in the ``variant`` column)."""
    for kind in KINDS:
        if DISCRIMINATOR[kind] is None:
            yield kind, None, f"{kind}/"
        else:
            for variant in VARIANTS[kind]:
                yield kind, variant, f"{kind}/{variant}"


def _variant_sql() -> str:
    """SQL naming a record's variant, ``kind/event`` or ``kind/op`` (``config/``)."""
    whens = " ".join(
        f"WHEN {_q(kind)} THEN {disc}_s" for kind, disc in DISCRIMINATOR.items() if disc
    )
    return f"kind || '/' || coalesce(CASE kind {whens} END, '')"


def _checks(fields: _Fields) -> _Chain:
    chain = _Chain()
    lit = _q
    if not fields.typed:  # a typed line is a JSON object without a repeated key, and no adapter's
        # an adapter marks a line it recognised but could not translate: chr(1) and the why
        chain.add("starts_with(doc, chr(1))", Reason.UNTRANSLATABLE, "substr(doc, 2)")
        # the reader marks a line it could not read (too long, a CSV row of the wrong shape) with chr(2)
        chain.add("starts_with(doc, chr(2))", Reason.UNREADABLE, "substr(doc, 2)")
        chain.add("NOT is_json", Reason.NOT_JSON, lit("not valid JSON"))
        chain.add("NOT is_obj", Reason.NOT_OBJECT, lit("a JSON value that is not an object"))
        chain.add(
            "len(keys) <> len(list_distinct(keys))",
            Reason.NOT_JSON,
            lit("an object with a repeated key"),
        )
    chain.add("NOT " + fields.present("kind"), Reason.MISSING_FIELD, lit("missing field 'kind'"))
    chain.add("NOT " + fields.is_str("kind"), Reason.WRONG_TYPE, lit("'kind' must be a string"))
    chain.add(
        f"kind NOT IN ({', '.join(lit(k) for k in KINDS)})",
        Reason.UNKNOWN_KIND,
        lit(f"kind is not one of {'/'.join(KINDS)}"),
    )
    for name in ("ts", "node"):
        chain.add("NOT " + fields.present(name), Reason.MISSING_FIELD, lit(f"missing field '{name}'"))
    chain.add(
        "kind = 'kv' AND NOT " + fields.present("seq"),
        Reason.MISSING_FIELD,
        lit("missing field 'seq'"),
    )
    for name in ("node", *COMMON_OPTIONAL, "ts"):
        chain.add(
            f"{name} IS NULL AND {fields.present(name)} AND NOT {fields.type_ok(name)}",
            Reason.WRONG_TYPE,
            lit(f"'{name}' must be {_type_word(name)}"),
        )
    _ts_checks(chain)
    chain.add("seq < 0", Reason.NEGATIVE_SEQ, "'seq is ' || seq")
    for name in COMMON_OPTIONAL:
        chain.add(
            f"{fields.present(name)} AND {name} IS NULL",
            Reason.BAD_VALUE,
            lit(f"'{name}' is out of range"),
        )
    chain.add("boot < 0", Reason.BAD_VALUE, "'boot is ' || boot")
    for kind in KINDS:
        disc = DISCRIMINATOR[kind]
        if disc is None:
            continue
        k = f"kind = {lit(kind)}"
        chain.add(f"{k} AND NOT {fields.present(disc)}", Reason.MISSING_FIELD, lit(f"missing field '{disc}'"))
        chain.add(f"{k} AND NOT {fields.is_str(disc)}", Reason.WRONG_TYPE, lit(f"'{disc}' must be a string"))
        names = ", ".join(lit(v) for v in VARIANTS[kind])
        chain.add(
            f"{k} AND {disc}_s NOT IN ({names})",
            UNKNOWN_VARIANT_REASON[kind],
            lit(f"'{disc}' of a {kind} record is not one of {'/'.join(VARIANTS[kind])}"),
        )
    for kind, variant, name in _variants():
        chain.nest(f"variant = {lit(name)}", _variant_checks(kind, variant, fields))
    return chain


def _variant_checks(kind: str, variant: str | None, fields: _Fields) -> _Chain:
    """Checks of the fields a kind and event/op adds: missing, then type, then value."""
    chain = _Chain()
    lit = _q
    required, optional = fields_of(kind, variant)
    own = own_fields(kind, variant)
    for name in own:
        if name in required:
            chain.add(f"NOT {fields.present(name)}", Reason.MISSING_FIELD, lit(f"missing field '{name}'"))
    for name, other in required_unless(kind, variant):
        chain.add(f"NOT {fields.present(name)} AND NOT {fields.present(other)}", Reason.MISSING_FIELD,
                  lit(f"missing field '{name}'"))
    for name in own:
        chain.add(
            f"{name} IS NULL AND {fields.present(name)} AND NOT {fields.type_ok(name)}",
            Reason.WRONG_TYPE,
            lit(f"'{name}' must be {_type_word(name)}"),
        )
    for name in own:
        field = FIELDS[name]
        if name == "pages":
            chain.add(
                "page_ranges IS NULL OR list_bool_or(list_transform(page_ranges, lambda r: r.lo > r.hi))",
                Reason.BAD_PAGES,
                lit("'pages' is not a list of page ranges a-b with a <= b"),
            )
        elif field.type is FieldType.PAGES:
            chain.add(
                f"{fields.present(name)} AND NOT pages_ok({name})",
                Reason.BAD_PAGES,
                lit(f"'{name}' is not a list of page ranges a-b with a <= b"),
            )
        elif field.choices:
            choices = ", ".join(lit(c) for c in field.choices)
            chain.add(
                f"{name} NOT IN ({choices})",
                Reason.BAD_VALUE,
                lit(f"'{name}' is not one of {'/'.join(field.choices)}"),
            )
        elif field.type is FieldType.INT:
            chain.add(
                f"{fields.present(name)} AND {name} IS NULL",
                Reason.BAD_VALUE,
                lit(f"'{name}' is out of range"),
            )
            if field.min_value is not None:
                chain.add(
                    f"{name} < {field.min_value}",
                    Reason.BAD_VALUE,
                    f"'{name} is ' || {name} || ', below {field.min_value}'",
                )
            if field.max_value is not None:
                chain.add(
                    f"{name} > {field.max_value}",
                    Reason.BAD_VALUE,
                    f"'{name} is ' || {name} || ', beyond {field.max_value:,}: not a real one'",
                )
    return chain


def _type_word(name: str) -> str:
    return {
        FieldType.STR: "a string",
        FieldType.INT: "an integer",
        FieldType.PAGES: "a string of page ranges",
        FieldType.TS: "an RFC 3339 string or integer nanoseconds",
    }[FIELDS[name].type]


def _canonical_sql() -> str:
    """Canonical JSON: keys sorted, values as DuckDB minifies them, no white space."""
    parts = ", ".join(
        f"CASE WHEN {_j(n)} IS NOT NULL THEN {_q(json.dumps(n) + ':')} || {_j(n)} END"
        for n in FIELD_ORDER
    )
    known = f"'{{' || concat_ws(',', {parts}) || '}}'"
    present = " + ".join(f"({_j(n)} IS NOT NULL)::INT" for n in FIELD_ORDER)
    generic = (
        "'{' || array_to_string(list_transform(list_sort(keys), lambda k: to_json(k) || ':' || "
        "json_extract(t, '/' || replace(replace(k, '~', '~0'), '/', '~1'))), ',') || '}'"
    )
    return f"CASE WHEN len(keys) = {present} THEN {known} ELSE {generic} END"


MACROS = f"""
CREATE OR REPLACE TEMP MACRO page_ranges(p) AS
  list_transform(string_split(p, ','), lambda r: {{
      'lo': CAST(split_part(r, '-', 1) AS BIGINT),
      'hi': CAST(coalesce(nullif(split_part(r, '-', 2), ''), split_part(r, '-', 1)) AS BIGINT)}});
CREATE OR REPLACE TEMP MACRO rfc3339_ts(t) AS
  CASE WHEN regexp_full_match(t, {_q(_RFC3339)}) THEN
    CASE WHEN substr(t, 18, 2) = '60'  -- a leap second: the next second (the 60th is no time DuckDB has)
         THEN TRY_CAST(upper(substr(t, 1, 17) || '59' || substr(t, 20)) AS TIMESTAMPTZ) + INTERVAL 1 SECOND
         ELSE TRY_CAST(upper(t) AS TIMESTAMPTZ) END
  END;
CREATE OR REPLACE TEMP MACRO pages_ok(p) AS
  CASE WHEN regexp_full_match(p, {_q(_PAGES)})
       THEN NOT list_bool_or(list_transform(page_ranges(p), lambda r: r.lo > r.hi))
       ELSE FALSE END;
"""


def prepare(con: duckdb.DuckDBPyConnection) -> None:
    """Give ``con`` what the validator's SQL calls: the page-list macros and ``rec_hash``."""
    con.execute(MACROS)
    recordhash.register(con)


def stage_sql(source: str, *, with_canon: bool = False, by_file: bool = False) -> str:
    """A SELECT over ``source(line_no, part, raw, doc)``: every record's verdict and typed fields.

    ``part`` numbers the records an adapter made of one source line (0 for canonical lines).

    ``with_canon`` adds the canonical JSON text (wanted only to settle conflicts); ``by_file``
    passes ``source``'s ``file_id`` on (lines of several files staged at once).
    """
    canon_col = " canon," if with_canon else ""
    f = "file_id, " if by_file else ""
    spec = json.dumps({n: "JSON" for n in FIELD_ORDER})
    extracted = ",\n    ".join(f"v.{n} AS {_j(n)}" for n in FIELD_ORDER)
    typed = ",\n    ".join(
        f"{_typed_value(n)} AS {n}" for n in FIELD_ORDER if n not in ("event", "op")
    )
    check = _checks(_JSON_FIELDS).sql()
    return f"""
WITH a AS (
  SELECT {f}line_no, part, raw, doc, coalesce(doc, raw) AS t FROM {source}
  WHERE CASE WHEN starts_with(raw, '{{') THEN TRUE ELSE trim(raw, {_WS}) <> '' END
), b AS (
  SELECT *, json_valid(t) AS is_json FROM a
), c AS (
  SELECT *, CASE WHEN NOT is_json THEN FALSE WHEN starts_with(t, '{{') THEN TRUE
              ELSE json_type(t) = 'OBJECT' END AS is_obj FROM b
), d AS (
  SELECT {f}line_no, part, raw, doc, t, is_json, is_obj,
    CASE WHEN is_obj THEN json_transform(t, {_q(spec)}) END AS v,
    CASE WHEN is_obj THEN json_keys(t) END AS keys
  FROM c
), e AS (
  SELECT {f}line_no, part, raw, doc, t, is_json, is_obj, keys,
    {extracted}
  FROM d
), f AS (
  SELECT *,
    {typed},
    CASE WHEN starts_with(j_pages, '"') AND regexp_full_match({_str_value('pages')}, {_q(_PAGES)})
         THEN page_ranges({_str_value('pages')}) END AS page_ranges,
    {_str_value('event')} AS event_s,
    {_str_value('op')} AS op_s
  FROM e
), g AS (
  SELECT *, {_variant_sql()} AS variant FROM f
), h AS (
  SELECT *, {check} AS verdict FROM g
), k AS (
  SELECT *, CASE WHEN verdict IS NULL THEN {_canonical_sql()} END AS canon FROM h
)
SELECT
  {f}line_no, part, raw, doc,
  verdict.reason AS q_reason, verdict.detail AS q_detail,
  rec_hash(canon) AS rec_hash,{canon_col}
  regexp_matches(t, {_q(LENIENT_SUSPECT)}) AND is_json AS suspect,
  {', '.join(n for n in FIELD_ORDER if n not in ('event', 'op', 'boot'))},
  coalesce(boot, 0) AS boot,
  event_s AS event, op_s AS op,
  CASE WHEN verdict IS NULL AND kind = 'kv' THEN page_ranges END AS page_ranges,
  CASE WHEN verdict IS NULL AND kind = 'kv'
       THEN list_max(list_transform(page_ranges, lambda r: r.hi)) END AS max_page
FROM k
"""


#: Fields the fast path hands over typed under their own names (ts, event and op are derived).
PLAIN_TYPED = tuple(n for n in FIELD_ORDER if n not in ("ts", "event", "op"))


def plain_stage_sql(source: str, *, rules_kept: bool = False, by_file: bool = False) -> str:
    """The rows :func:`stage_sql` gives, for lines the fast path read
    (:mod:`forensics.ingestion.fast.jsonlines`).

    ``source`` has ``line_no, part, raw``, the hash of the canonical JSON as ``hash_hi, hash_lo``
    (:mod:`forensics.ingestion.fast.rechash`), the typed fields :data:`PLAIN_TYPED`,
    ``event_s``, ``op_s``, the ts as ``ts_text`` (with ``ts_shape``, whether it has the RFC 3339
    shape) or ``ts_int``, and already as a time where the fast path could read it (``ts_us``;
    casting 2 M texts cost DuckDB 0.15 s of CPU), and ``page_ranges`` with ``max_hi`` where
    ``pages`` parses.
    The checks are the same chain over typed fields; the canonical JSON comes built and hashed.
    ``rules_kept``: every line of ``source`` keeps the rules but the time's (the fast path's
    ``rules_ok``, jsonlines.RULES), so it can only fail on its time, and only that is checked (the
    statement is then a fraction of the size, and DuckDB plans it in a fraction of the time);
    otherwise every check is made. ``by_file``: ``source``'s ``file_id`` is passed on.
    """
    f = "file_id, " if by_file else ""
    if rules_kept:
        ts_columns = ""
        time_only = _Chain()
        _ts_checks(time_only)
        check = time_only.sql()
    else:
        check = _checks(_TYPED_FIELDS).sql()
        # the chain asks whether a ts was given: j_ts, as the SQL path has it (its text is never shown)
        ts_columns = ",\n    coalesce(ts_text, CAST(ts_int AS VARCHAR)) AS j_ts"
    return f"""
WITH f AS (
  SELECT {f}line_no, part, raw, NULL::VARCHAR AS doc, hash_hi, hash_lo, page_ranges, max_hi, event_s, op_s,
    {', '.join(PLAIN_TYPED)},
    CASE WHEN ts_us IS NOT NULL THEN ts_us
         WHEN ts_text IS NOT NULL THEN CASE WHEN ts_shape THEN rfc3339_ts(ts_text) END
         WHEN ts_int IS NOT NULL THEN TRY_CAST(make_timestamp(ts_int // 1000) AS TIMESTAMPTZ) END AS ts{ts_columns}
  FROM {source}
), g AS (
  SELECT *, {_variant_sql()} AS variant FROM f
), h AS (
  SELECT *, {check} AS verdict FROM g
)
SELECT
  {f}line_no, part, raw, doc,
  verdict.reason AS q_reason, verdict.detail AS q_detail,
  CASE WHEN verdict IS NULL THEN rec_hash_of(hash_hi, hash_lo) END AS rec_hash,
  FALSE AS suspect,
  {', '.join(n for n in FIELD_ORDER if n not in ('event', 'op', 'boot'))},
  coalesce(boot, 0) AS boot,
  event_s AS event, op_s AS op,
  CASE WHEN verdict IS NULL AND kind = 'kv' THEN page_ranges END AS page_ranges,
  CASE WHEN verdict IS NULL AND kind = 'kv' THEN max_hi END AS max_page
FROM h
"""
