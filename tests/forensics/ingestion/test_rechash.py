"""A record's hash is MurmurHash3_x64_128 (seed 0) of its canonical JSON, by either ingest path."""

from __future__ import annotations

import duckdb
import mmh3
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics.ingestion import recordhash
from forensics.ingestion.fast import rechash


def reference(text: bytes) -> int:
    return int(mmh3.hash128(text, 0, True, signed=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=70), max_size=20))
def test_the_compiled_hash_is_murmurhash3(texts: list[bytes]) -> None:
    # every tail length (0 to 15 bytes past the 16-byte blocks) and texts side by side in one buffer
    buf = np.frombuffer(b"".join(texts), np.uint8)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in texts])]).astype(np.int64)
    hi, lo = rechash.hashes(buf, offsets)
    assert [(int(h) << 64) | int(low) for h, low in zip(hi, lo, strict=True)] == [reference(t) for t in texts]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=60)), max_size=30))
def test_the_sql_function_gives_the_same_hash(texts: list[str | None]) -> None:
    con = duckdb.connect()
    recordhash.register(con)
    rows = con.execute(
        "SELECT rec_hash(t) FROM (SELECT unnest(?::VARCHAR[]) AS t, generate_subscripts(?::VARCHAR[], 1) AS i) "
        "ORDER BY i",
        [texts, texts],
    ).fetchall()
    con.close()
    assert [r[0] for r in rows] == [None if t is None else reference(t.encode()) for t in texts]
