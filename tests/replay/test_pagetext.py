"""The replay's compiled page strings (replay/pagetext.py) against forensics.emit.page_string, the
schema's writer of page ids as ranges, and against a set of ids read back from the text."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics import compiled
from forensics.emit import page_string
from replay import pagetext

#: page ids: runs of a free list merged and sorted (the engine's), or any order with repeats
_RUNS = st.lists(st.tuples(st.integers(0, 5_000), st.integers(1, 80)), min_size=1, max_size=12)


def _ids(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@settings(max_examples=300, deadline=None)
@given(_RUNS, st.sampled_from(["sorted", "shuffled", "repeated"]), st.randoms(use_true_random=False),
       st.booleans())
def test_the_kernel_finds_the_runs_page_string_writes(runs: list[tuple[int, int]], order: str, rnd, twin: bool) -> None:
    """Compiled and interpreted, ``runs`` gives the ranges of page_string's text, whatever the
    order of the ids, and page_text writes that text (past the short arrays left to page_string)."""
    ids = sorted({p for start, n in runs for p in range(start, start + n)})
    if order == "shuffled":
        rnd.shuffle(ids)
    elif order == "repeated":
        ids = ids + ids[: len(ids) // 2]
        rnd.shuffle(ids)
    pages = np.array(ids, np.int64)
    kernel = compiled.interpreted(pagetext.__name__).runs if twin else pagetext.runs
    out = np.empty(2 * len(pages), np.int64)
    k = kernel(pages, out)
    ends = out[: 2 * k].tolist()
    text = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in zip(ends[::2], ends[1::2], strict=True))
    assert text == page_string(pages)
    assert _ids(text) == set(ids)
    assert pagetext.page_text(pages) == text


def test_page_text_compiles_only_after_enough_long_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short array, or a long one before COMPILED_FROM of them, is page_string's; after, the
    kernel's: the same text either way, and errors as page_string gives them."""
    calls: list[int] = []
    real = pagetext.runs

    def counted(pages: np.ndarray, out: np.ndarray) -> int:
        calls.append(len(pages))
        return int(real(pages, out))

    monkeypatch.setattr(pagetext, "runs", counted)
    monkeypatch.setattr(pagetext, "_CALLS", iter(range(1, 10)))
    monkeypatch.setattr(pagetext, "COMPILED_FROM", 1)
    long = np.concatenate([np.arange(10, 50), np.arange(60, 100)])
    assert pagetext.page_text(long) == "10-49,60-99" and calls == []  # (the first long array)
    assert pagetext.page_text(long[:5]) == "10-14" and calls == []  # (short: never the kernel)
    assert pagetext.page_text(long[::-1].copy()) == "10-49,60-99" and calls == [80]
    with pytest.raises(ValueError, match="page ids are >= 0"):
        pagetext.page_text(np.concatenate([long, [-3]]))
    assert calls == [80, 81]
