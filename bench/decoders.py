"""Could well-kept libraries replace the fast path's hand-written parsing and hashing?

Times, on the same JSON Lines, what the fast path does per block of lines
(``forensics.ingestion.fast.jsonlines.plain_columns``: scan, rules, canonical JSON, its hash,
typed Arrow columns) against the least that a path built on msgspec and mmh3 would do:
msgspec's typed decode of every line into a Struct per kind (tagged by ``kind``, fields and types
from ``forensics.schema``, per line so that a bad line fails alone, as quarantine needs), its
canonical JSON (``msgspec.json.encode`` of the Struct, fields in name order) and mmh3's 128-bit
hash of that. It leaves out what such a path would still need (Arrow columns from the Structs,
the rules the Struct types do not state, the times), so its time is a lower bound.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from forensics.schema import FIELD_ORDER, FIELDS, KINDS, FieldType, fields_of


def _structs() -> Any:
    """One msgspec Struct per kind: every field it may have, optional, typed as the schema says."""
    import msgspec

    types: dict[FieldType, Any] = {FieldType.STR: str, FieldType.INT: int, FieldType.TS: str | int,
                                   FieldType.PAGES: str}
    out = []
    for kind in KINDS:
        names: set[str] = set()
        for variant in (None, *_variants(kind)):
            required, optional = fields_of(kind, variant)
            names |= set(required) | set(optional)
        names.discard("kind")
        fields = [(n, types[FIELDS[n].type] | None, None) for n in sorted(names, key=FIELD_ORDER.index)]
        out.append(msgspec.defstruct(kind.title(), fields, tag=kind, tag_field="kind", kw_only=True,
                                     omit_defaults=True))
    return out


def _variants(kind: str) -> list[str]:
    from forensics.schema import VARIANTS

    return list(VARIANTS.get(kind, {}))


def compare(files: list[Path]) -> dict[str, float]:
    """Seconds for the fast path's split and for the msgspec + mmh3 lower bound, on ``files``."""
    import mmh3
    import msgspec

    from forensics.ingestion.fast import jsonlines
    from forensics.ingestion.readers import _line_bounds

    decoder = msgspec.json.Decoder(_union(_structs()))
    encoder = msgspec.json.Encoder(order="sorted")
    data = [np.fromfile(f, np.uint8) for f in files]
    t = time.perf_counter()
    lines = 0
    for buf in data:
        starts, stops = _line_bounds(buf)
        lines += len(starts)
        for a in range(0, len(starts), 245_760):  # the fast path's blocks
            jsonlines.plain_columns(buf, starts[a:a + 245_760], stops[a:a + 245_760])
    fast = time.perf_counter() - t
    raw = [f.read_bytes().splitlines() for f in files]
    t = time.perf_counter()
    for file_lines in raw:
        for line in file_lines:
            record = decoder.decode(line)
            mmh3.hash128(encoder.encode(record), 0, True, signed=False)
    library = time.perf_counter() - t
    return {"lines": lines, "fast_path_split": fast, "msgspec_mmh3_lower_bound": library}


def _union(structs: list[Any]) -> Any:
    out = structs[0]
    for s in structs[1:]:
        out = out | s
    return out
