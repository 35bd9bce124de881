"""The lines of a decode node's logged records, a batch of them at a time, as the compiled replay
writes them (replay/decode_fast.py): each line's text before its seq and after it (the kernel numbers
the seq), made over the batch's columns by Arrow's string kernels, the same bytes as
:func:`replay.logset.record_line` writes the record one at a time.

A record's line is its fields in the schema's order, null fields left out, ``boot`` only when not 0:
here each field a column of ``,"name":value`` texts (null where the value is), joined. Texts are
quoted as ``json.dumps(ensure_ascii=False)`` quotes them: those with nothing to escape (all the
replay has ever met) by Arrow, a batch with any other by Python's :func:`replay.logset.record_line`
rule, value by value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from replay.events import EVENT_FIELDS
from replay.logset import _ESCAPED, _string, record_line, schema_order, ts_texts

#: A logged record's fields in the order its line has them: kind, ts, node and seq come first, the
#: text before the seq; the rest after it.
ORDER = schema_order(EVENT_FIELDS)
assert ORDER[:4] == ("kind", "ts", "node", "seq"), ORDER
_AFTER_SEQ = ORDER[4:]
#: What JSON escapes in a string (:data:`replay.logset._ESCAPED`), for Arrow's regular expressions.
_ESCAPED_RE2 = _ESCAPED.pattern


def quoted(values: pa.Array) -> pa.Array:
    """Each text as a JSON string (null stays null), as :func:`replay.logset._string` writes it."""
    if values.null_count == len(values):
        return pa.nulls(len(values), pa.string())
    if pc.any(pc.match_substring_regex(values, _ESCAPED_RE2)).as_py():
        return pa.array([None if v is None else _string(v) for v in values.to_pylist()], pa.string())
    return pc.binary_join_element_wise('"', values, '"', "")


def _fragment(name: str, values: pa.Array) -> pa.Array:
    """``,"name":value`` for each value (null where it is)."""
    text = values.cast(pa.string()) if pa.types.is_integer(values.type) else quoted(values)
    return pc.binary_join_element_wise(f',"{name}":', text, "")


def _joined(parts: Sequence[pa.Array | str]) -> pa.Array:
    """The texts of ``parts`` one after the other, row by row, a null part left out."""
    return pc.binary_join_element_wise(*parts, "", null_handling="replace", null_replacement="")


def _before(batch: pa.RecordBatch, quoted_node: str) -> pa.Array:
    """Each record's line up to its seq's value: ``{"kind":..,"ts":..,"node":..,"seq":``."""
    return _joined(['{"kind":', quoted(batch.column("kind")), ',"ts":"', ts_texts(batch.column("ts")),
                    f'","node":{quoted_node},"seq":'])


def _fragments(batch: pa.RecordBatch, names: Sequence[str], boot: int,
               replaced: dict[str, pa.Array | None]) -> list[pa.Array | str]:
    """The fields ``names`` of each record as :func:`_fragment` texts; ``boot`` for every record's
    (a constant, left out where 0), ``replaced`` for those fields' own (None: left out)."""
    out: list[pa.Array | str] = []
    for name in names:
        if name == "boot":
            if boot:
                out.append(f',"boot":{boot}')
            continue
        values = replaced[name] if name in replaced else batch.column(name)
        if values is not None:
            out.append(_fragment(name, values))
    return out


def flat(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's bytes and each value's offsets in them (its values' ends after the first)."""
    text = text.cast(pa.large_string())
    _, offsets, data = text.buffers()
    at = np.frombuffer(offsets, np.int64)[text.offset:text.offset + len(text) + 1]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.empty(0, np.uint8)
    return raw[at[0]:at[-1]], at - at[0]


def lines(batch: pa.RecordBatch, node: str, boot: int) -> tuple[pa.Array, pa.Array]:
    """Each record's line as it is logged on ``node`` (in ``boot``), its seq left open: its text up
    to the seq's value, and after it (the newline with it)."""
    quoted_node = record_line({"node": node})[len('{"node":'):-1]
    return _before(batch, quoted_node), _joined([*_fragments(batch, _AFTER_SEQ, boot, {}), "}\n"])


def templates(batch: pa.RecordBatch, node: str, boot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`lines` as the kernel reads them: the lines' bytes, where each starts and where its
    text after the seq starts; each ends where the next starts (the last at the bytes' end)."""
    before, after = lines(batch, node, boot)
    data, at = flat(pc.binary_join_element_wise(before, after, ""))
    return data, at[:-1], at[:-1] + pc.binary_length(before).to_numpy()


def landed(batch: pa.RecordBatch, node: str, boot: int, tokens: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The page record each transfer end of ``batch`` writes as its pages land (decode_fast: the
    record as logged with ``tokens``, its source pages left out and its destination pages open):
    its bytes, and where each line's three texts start (before the seq, before the pages, after
    them)."""
    quoted_node = record_line({"node": node})[len('{"node":'):-1]
    pages = _AFTER_SEQ.index("dst_pages")
    replaced: dict[str, pa.Array | None] = {"src_pages": None, "tokens": pa.array(tokens, pa.int64()),
                                            "dst_pages": None}
    before = _before(batch, quoted_node)
    middle = _joined([*_fragments(batch, _AFTER_SEQ[:pages], boot, replaced), ',"dst_pages":"'])
    rest = _joined(['"', *_fragments(batch, _AFTER_SEQ[pages + 1:], boot, replaced), "}\n"])
    data, at = flat(pc.binary_join_element_wise(before, middle, rest, ""))
    first = at[:-1] + pc.binary_length(before).to_numpy()
    return data, at[:-1], first, first + pc.binary_length(middle).to_numpy()
