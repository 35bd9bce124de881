"""The compiled fast path gives exactly the stage rows of the SQL validator, line for line."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
from conftest import example_dirs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ingest import QUARANTINE_CASES

from forensics.ingestion.fast import jsonlines
from forensics.ingestion.pipeline import _strict_json_ok, plain_stages
from forensics.ingestion.readers.blocks import _split
from forensics.ingestion.readers.lines import _line_bounds
from forensics.ingestion.readers.tables import _lines_table
from forensics.ingestion.validate import PLAUSIBLE_TIMES, plain_stage_sql, prepare, stage_sql
from forensics.schema import FIELDS, VARIANTS, FieldType, fields_of

STAGE_ORDER = "ORDER BY line_no"


def both_ways(lines: list[str]) -> tuple[list[Any], list[Any], int]:
    """The stage rows of ``lines`` by the SQL validator alone, and with the fast path; plain lines."""
    data = "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass")
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    prepare(con)
    con.register("every", _lines_table(data, 1))
    block = _split(data, 1)
    con.register("others", block.lines)
    # ``suspect`` only picks lines for the strict re-check, which a plain line passes by construction
    names = [c for c in con.sql(f"SELECT * FROM ({stage_sql('others')})").columns if c != "suspect"]
    columns = ", ".join(f'"{c}"' for c in names)
    reference = con.sql(f"SELECT {columns} FROM ({stage_sql('every')}) {STAGE_ORDER}").fetchall()
    line = names.index("line_no")
    parted = []
    for kind, plain in block.kinds:
        # the line is kept for the lines a check may quarantine: those that break a rule, and those
        # whose time the fast path left to DuckDB
        checked = [not (ok and timed) for ok, timed in
                   zip(plain.column("rules_ok").to_pylist(), plain.column("ts_us").is_valid().to_pylist(), strict=True)]
        raws = plain.column("raw").to_pylist()
        assert [raw is not None for raw in raws] == checked
        assert all(_strict_json_ok(raw) for raw in raws if raw is not None)
        # as ingest loads them: lines that keep the rules checked for their time, the others in full
        con.register("chunk", plain)
        kind_rows = []
        for stage, n in plain_stages(plain):
            rows = con.sql(f"SELECT {columns} FROM ({stage})").fetchall()
            assert len(rows) == n
            kind_rows += rows
        con.register("plain", plain)
        whole_chain = con.sql(f"SELECT {columns} FROM ({plain_stage_sql('plain')})").fetchall()
        assert sorted(kind_rows, key=lambda r: r[line]) == sorted(whole_chain, key=lambda r: r[line])
        assert all(r[names.index("kind")] == kind for r in kind_rows) or kind is None
        parted += kind_rows
    fast = sorted(parted + con.sql(f"SELECT {columns} FROM ({stage_sql('others')})").fetchall(),
                  key=lambda r: r[line])
    con.close()
    # a record's verbatim line is kept in source_lines, not with it: only quarantine takes ``raw``
    raw, reason = names.index("raw"), names.index("q_reason")
    reference, fast = ([(*r[:raw], r[raw] if r[reason] else None, *r[raw + 1:]) for r in rows]
                       for rows in (reference, fast))
    return reference, fast, sum(t.num_rows for _, t in block.kinds)


# --- random lines: records of every variant, their values and their writing varied ---------------

_PLAIN_TEXT = st.text(alphabet="abcXYZ019 -_./:,{}[]<>", max_size=6)
_TEXT = st.one_of(
    _PLAIN_TEXT,
    _PLAIN_TEXT,
    st.lists(
        st.sampled_from(list("abc \"\\\t\x01é\u2028ü😀") + ["nan", "inf", ":nan", ",}"]), max_size=4
    ).map("".join),
)
_INTS = st.one_of(
    st.integers(-3, 300),
    st.integers(0, 10**12),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**17, 10**18 - 1, 10**18, 2**63 - 1, 2**63, -(2**63), 999_999_999_999]),
)
# times put together from parts, each sometimes out of range: the fast path reads the usual forms
# itself and must give exactly what DuckDB's cast gives, or leave the time to it
_TIME_PARTS = st.tuples(
    st.sampled_from([1, 1970, 2000, 2024, 2026, 2100, 9999]) | st.integers(0, 9999), st.integers(0, 13),
    st.integers(0, 32), st.sampled_from("T t"), st.integers(0, 24), st.integers(0, 60), st.integers(0, 61),
    st.sampled_from(["", ".1", ".073", ".123456", ".000001", ".1234567", ".999999999", "."]),
    st.sampled_from(["Z", "z", "+00:00", "-05:30", "+23:59", "-23:59", "+24:00", "-00:60", "+14:00", "+0200", ""]),
)
_TIME_TEXT = _TIME_PARTS.map(
    lambda p: f"{p[0]:04d}-{p[1]:02d}-{p[2]:02d}{p[3]}{p[4]:02d}:{p[5]:02d}:{p[6]:02d}{p[7]}{p[8]}")
#: The forms the fast path reads itself (jsonlines.times), where DuckDB takes them.
_USUAL_TIME = re.compile(r"(?!0000)\d{4}-\d\d-\d\d[T ]\d\d:\d\d:[0-5]\d(\.\d{1,6})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)")
_TS = st.one_of(
    _TIME_TEXT,
    st.sampled_from([
        "2000-02-29T00:00:00Z", "2100-02-29T00:00:00Z", "2024-02-29T23:59:59.999999+23:59",
        "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "1969-12-31T23:59:59.999999Z",
    ]),
    st.sampled_from([
        "2026-09-14T08:00:00Z", "2026-09-14T08:00:00.073000Z", "2026-09-14t08:00:00z",
        "2026-09-14 08:00:00.1+02:00", "2026-09-14T08:00:00.123456789-05:30",
        "2026-09-14T08:00:00.1234567891Z", "2026-09-14T08:00:00", "2026-02-30T00:00:00Z",
        "2026-09-14T25:00:00Z", "2026-9-14T08:00:00Z", "2026-09-14T08:00:00.Z", "yesterday", "",
        "2026-09-14T08:00:00+0200", "2026-09-14T08:00:60Z",
    ]),
    st.integers(-(10**19), 10**19),
    st.integers(1_757_836_800_000_000_000, 1_757_836_900_000_000_000),
)
_PAGES = st.one_of(
    st.sampled_from(["1-3", "3-1", "0", "007-9", "1,2", "1,,2", "", "1-2-3", "1-", "-1", "1,", ",1",
                     "1234567890123", "123456789012", "1 -3", "a-b", "5-5,7,9-12"]),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 40)), min_size=1, max_size=4).map(
        lambda rs: ",".join(f"{a}-{a + d}" if d else str(a) for a, d in rs)
    ),
)


def _value(name: str) -> st.SearchStrategy[Any]:
    field = FIELDS[name]
    if field.choices:
        return st.one_of(st.sampled_from(field.choices), _TEXT)
    if field.type is FieldType.INT:
        return _INTS
    if field.type is FieldType.TS:
        return _TS
    if field.type is FieldType.PAGES:
        return _PAGES
    return st.one_of(st.sampled_from(["decode-0", "r-1", "tenant-07", "x"]), _TEXT)


_ODD = st.sampled_from([None, True, 1.5, -0.0, [1], {"a": 1}, "1", 7, 1e300])


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    """A record of some kind and variant, perhaps missing, adding or mistyping fields."""
    kind = draw(st.sampled_from(list(VARIANTS)))
    variant = draw(st.sampled_from(sorted(VARIANTS[kind]))) if VARIANTS[kind] else None
    required, optional = fields_of(kind, variant)
    names = list(required) + [n for n in optional if draw(st.booleans())]
    rec: dict[str, Any] = {"kind": kind}
    if variant is not None:
        rec["op" if kind == "kv" else "event"] = variant
    for name in names:
        if name not in rec:
            rec[name] = draw(_value(name))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        what = draw(st.integers(0, 3))
        name = draw(st.sampled_from(sorted(FIELDS)))
        if what == 0:
            rec.pop(name, None)
        elif what == 1:
            rec[name] = draw(_ODD)
        elif what == 2:
            rec[name] = draw(_value(name))
        else:
            rec[draw(st.sampled_from(["note", "Kind", "seq ", "ts\\u0000"]))] = draw(_ODD)
    keys = list(rec)
    order = draw(st.permutations(keys))
    return {k: rec[k] for k in order}


@st.composite
def lines(draw: st.DrawFn) -> str:
    """A record written the way some logger might: spacing, escapes, and now and then a flaw."""
    rec = draw(records())
    sep = draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,\t", " :  ")]))
    text = json.dumps(rec, separators=sep, ensure_ascii=draw(st.sampled_from([True, True, False])))
    flaw = draw(st.integers(0, 24))
    if flaw == 0:
        text = text[:-1] + ",}"
    elif flaw == 1:
        text = " " + text
    elif flaw == 2:
        text = text + " "
    elif flaw == 3:
        text = text + "\r"
    elif flaw == 4 and len(text) > 2:
        text = text[:-1] + ', "kind": "kv"}'
    elif flaw == 5:
        text = text.replace("1", "01", 1)
    elif flaw == 6:
        text = text[:-1] + ', "note": NaN}'
    elif flaw == 7:
        text = text.replace('"', "'", 2)
    return text


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(lines(), min_size=1, max_size=30))
def test_fast_path_gives_the_sql_validators_rows(batch: list[str]) -> None:
    reference, fast, _ = both_ways(batch)
    assert fast == reference


def test_fast_path_agrees_on_every_quarantine_case() -> None:
    batch = [line for _, line in QUARANTINE_CASES] + ["", "   ", "{}", '{"kind": "kv"}  ', "\ufeff{}"]
    reference, fast, _ = both_ways(batch)
    assert fast == reference


def test_plain_records_take_the_fast_path() -> None:
    """Every line of the example logs is plain: the fast path is not silently bypassed."""
    batch = [
        line for d in example_dirs() for p in sorted(d.rglob("*.jsonl"))
        for line in p.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    reference, fast, n_plain = both_ways(batch)
    assert fast == reference
    assert n_plain == len(batch) > 0


def test_a_thread_s_next_block_is_split_as_on_a_fresh_thread() -> None:
    """The scan's work arrays are kept per thread: a block split after a larger one with other
    fields gives what it gives on a thread of its own (nothing of the first block is left in them)."""
    from concurrent.futures import ThreadPoolExecutor

    def columns(lines: list[str]) -> tuple[list[bool], list[Any], list[str]]:
        data = "".join(line + "\n" for line in lines).encode()
        buf = np.frombuffer(data, np.uint8)
        starts, stops = _line_bounds(buf)
        plain, kinds = jsonlines.plain_columns(buf, starts, stops)
        return plain.tolist(), [(kind, rows.tolist(), {k: v.to_pylist() for k, v in cols.items()})
                                for kind, rows, cols in kinds], jsonlines.canonical_json(buf, starts, stops).to_pylist()

    first = [json.dumps({"kind": "request", "ts": n, "node": "router", "seq": n, "request_id": f"r{n}",
                         "event": "received", "tenant_id": "t", "prompt_tokens": n, "decode_node": "d"})
             for n in range(2_000)]
    second = [json.dumps({"seq": n, "node": "d", "kind": "kv", "ts": "2026-09-14T08:00:00Z", "op": "alloc",
                          "request_id": f"r{n}", "pages": f"{n}-{n + 2}"}) for n in range(50)]
    with ThreadPoolExecutor(max_workers=1) as one:
        alone = one.submit(columns, second).result()
    with ThreadPoolExecutor(max_workers=1) as one:
        one.submit(columns, first).result()
        after = one.submit(columns, second).result()
    assert after == alone
    assert all(alone[0]) and [kind for kind, _, _ in alone[1]] == ["kv"]


def test_canonical_json_matches_duckdbs_minified_form() -> None:
    """The canonical JSON built here is what the SQL path would hash, byte for byte."""
    rec = {"seq": 3, "node": "d/0", "kind": "kv", "ts": 1757836800000000000, "op": "read",
           "request_id": "r <1>", "pages": "1-3"}
    data = (json.dumps(rec) + "\n").encode()
    buf = np.frombuffer(data, np.uint8)
    starts, stops = _line_bounds(buf)
    plain, kinds = jsonlines.plain_columns(buf, starts, stops)
    assert plain.tolist() == [True]
    [(kind, rows, cols)] = kinds
    assert kind == "kv" and rows.tolist() == [0]
    con = duckdb.connect()
    expected = con.execute(
        "SELECT '{' || array_to_string(list_transform(list_sort(json_keys(j)), "
        "lambda k: to_json(k) || ':' || json_extract(j, '$.' || k)), ',') || '}' FROM (SELECT ?::JSON AS j)",
        [json.dumps(rec)],
    ).fetchall()[0][0]
    assert jsonlines.canonical_json(buf, starts, stops).to_pylist() == [expected]


def test_lines_that_are_not_utf8_are_kept_escaped(tmp_path: Path) -> None:
    data = b'{"kind": "kv", "node": "\xff"}\n' + json.dumps({"kind": "config"}).encode() + b"\n"
    block = _split(data, 1)
    assert [(kind, t.num_rows) for kind, t in block.kinds] == [("config", 1)]  # the second line
    raw = block.lines.column("raw").to_pylist()
    assert raw == ['\x00{"kind": "kv", "node": "\\xff"}']
    assert pa.compute.all(block.lines.column("line_no").is_valid()).as_py()


@settings(max_examples=300, deadline=None)
@given(st.lists(_TS, min_size=1, max_size=40))
def test_a_time_the_fast_path_reads_is_what_duckdb_casts(times: list[Any]) -> None:
    """The times the fast path reads itself (``ts_us``) are exactly the validator's reading of them
    (its strict RFC 3339 macro, DuckDB's cast), and it leaves every time the validator refuses, or
    finds implausible (before 1970, after 2200), to the SQL checks (which then quarantine the line)."""
    lines = [json.dumps({"kind": "config", "ts": t, "node": "n"}) for t in times]
    block = _split("".join(line + "\n" for line in lines).encode(), 1)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    prepare(con)
    early, late = (dt.datetime.fromisoformat(t) for t in PLAUSIBLE_TIMES)
    for _, rows in block.kinds:  # (an integer beyond int64 makes a line that is not plain)
        con.register("rows", rows)
        triples = con.sql(
            "SELECT line_no, ts_us, CASE WHEN ts_text IS NOT NULL THEN rfc3339_ts(ts_text) "
            "WHEN ts_int IS NOT NULL THEN TRY_CAST(make_timestamp(ts_int // 1000) AS TIMESTAMPTZ) END FROM rows"
        ).fetchall()
        for line_no, fast, cast in triples:
            t = times[line_no - 1]
            assert fast is None or fast == cast, t
            usual = (isinstance(t, int) and t >= 0) or (isinstance(t, str) and bool(_USUAL_TIME.fullmatch(t)))
            plausible = isinstance(cast, dt.datetime) and early <= cast < late  # (a year BC comes as text)
            assert fast is None or plausible, t  # an implausible time is left to the checks, line kept
            assert fast is not None or not plausible or not usual, t  # the usual forms it reads itself
    con.close()
