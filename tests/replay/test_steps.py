"""The compiled decode steps (replay/steps.py) against a step-at-a-time model written here."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from forensics import compiled
from replay import steps as kernel


def _one_at_a_time(tokens: list[int], left: list[int], page_size: int, steps: int, free: int, takeable: int,
                   released: int) -> tuple[int, list[tuple[int, int]], bool]:
    """Steps one by one: each running row takes its next slot, a new page where the slot starts one;
    stop before a step where the pool would merge (its rule for the call), run short, or pass the
    bound. The steps run, (step, row) of each new page, whether it stopped so."""
    pages: list[tuple[int, int]] = []
    for step in range(steps):
        rows = [i for i in range(len(tokens)) if left[i] > 0]
        if not rows:
            return step, pages, False
        need = sum(1 for i in rows if tokens[i] % page_size == 0)
        merges = need > free if page_size == 1 else len(rows) > free
        if (merges and released) or need > free or need > takeable:
            return step, pages, True
        for i in rows:
            if tokens[i] % page_size == 0:
                pages.append((step, i))
            tokens[i] += 1
            left[i] -= 1
        free -= need
        takeable -= need
    return steps, pages, False


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 200)), min_size=1, max_size=8),
       st.sampled_from([1, 4, 64]), st.integers(0, 400), st.integers(0, 40), st.integers(0, 40), st.integers(0, 5),
       st.booleans())
def test_the_kernel_takes_the_pages_a_step_at_a_time_would(rows: list[tuple[int, int]], page_size: int, steps: int,
                                                          free: int, bound: int, released: int, twin: bool) -> None:
    run = compiled.interpreted("replay.steps").run if twin else kernel.run
    tokens = np.array([t for t, _ in rows], np.int64)
    left = np.array([n for _, n in rows], np.int64)
    room = int((np.minimum(left, steps) // page_size + 1).sum())
    step_of, row_of = np.empty(room, np.int64), np.empty(room, np.int64)
    ran, taken, status = run(tokens, left, page_size, steps, free, min(free, bound), released, step_of, row_of)
    assert all(type(x) is int for x in (ran, taken, status)) or twin  # (the twin's may be numpy's: the engine casts)
    want_tokens, want_left = [t for t, _ in rows], [n for _, n in rows]
    want_ran, want_pages, blocked = _one_at_a_time(want_tokens, want_left, page_size, steps, free, min(free, bound),
                                                   released)
    assert (ran, status == kernel.BLOCKED) == (want_ran, blocked)  # (a stop: before the same step)
    assert tokens.tolist() == want_tokens and left.tolist() == want_left
    assert list(zip(step_of[:taken].tolist(), row_of[:taken].tolist(), strict=True)) == want_pages
