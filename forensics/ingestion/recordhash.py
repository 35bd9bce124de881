"""A record's identity: the 128-bit MurmurHash3 (x64, seed 0) of its canonical JSON.

Two lines are the same record when their canonical JSON is the same (log-schema.md section 4),
and ``rec_hash`` is how the case finds them. The SQL validator computes it through the DuckDB
function :func:`register` adds, with the ``mmh3`` library (C, nothing to compile); the compiled
fast path computes the same hash in its own pass (:mod:`forensics.ingestion.fast.rechash`), and
tests hold the two to each other, so a record gets the same hash whichever path read its line.
"""

from __future__ import annotations

from collections.abc import Sequence

import duckdb
import mmh3
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from duckdb import func

_WORDS = pa.struct([("hi", pa.uint64()), ("lo", pa.uint64())])
_LOW = (1 << 64) - 1


def hashes(texts: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The hash of each text, as high and low 64-bit words."""
    whole = [mmh3.hash128(t, 0, True, signed=False) for t in texts]
    return (np.fromiter((h >> 64 for h in whole), np.uint64, len(whole)),
            np.fromiter((h & _LOW for h in whole), np.uint64, len(whole)))


def _hash_words(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The DuckDB function ``kvf_hash_words``: each text's hash as ``{hi, lo}`` (NULL for NULL)."""
    arr = pc.cast(texts, pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    _, offsets_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(offsets_buf, np.int64)[arr.offset : arr.offset + len(arr) + 1].tolist()
    data = data_buf.to_pybytes() if data_buf is not None else b""
    hi, lo = hashes([data[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)])
    mask = arr.is_null() if arr.null_count else None
    return pa.StructArray.from_arrays([pa.array(hi), pa.array(lo)], fields=list(_WORDS), mask=mask)


def register(con: duckdb.DuckDBPyConnection) -> None:
    """Give ``con`` the SQL functions ``rec_hash(text)``, the hash of each text, and
    ``rec_hash_of(hi, lo)``, the hash from its two words: UHUGEINT."""
    con.create_function(
        "kvf_hash_words", _hash_words, [duckdb.sqltype("VARCHAR")],
        duckdb.sqltype("STRUCT(hi UBIGINT, lo UBIGINT)"),
        type=func.PythonUDFType.ARROW, null_handling=func.FunctionNullHandling.SPECIAL,
    )
    con.execute("CREATE OR REPLACE TEMP MACRO rec_hash_of(hi, lo) AS (hi::UHUGEINT << 64) | lo::UHUGEINT")
    con.execute(
        "CREATE OR REPLACE TEMP MACRO rec_hash(t) AS rec_hash_of(kvf_hash_words(t).hi, kvf_hash_words(t).lo)"
    )
