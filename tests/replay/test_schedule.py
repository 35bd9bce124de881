"""Where a decode node's steps fall among its logged events (replay/schedule.py): the bounds that
the starts still to come set (held to a brute force over every chain), and the counts an
ambiguous event takes under each schedule the evidence allows."""

from __future__ import annotations

import bisect
import itertools
import random

import numpy as np
import pytest

from forensics import compiled
from replay import ceiling as kernel
from replay import schedule as clock_module
from replay.schedule import ALTERNATIVES, LOGGED, Cadence, Horizon, Schedule, StepClock


def _longest_chain(starts: list[tuple[int, int, int]], after: int, finish_at: int, at: int) -> int:
    """The most steps of requests that start at ``at`` or later (inside (after, finish_at)), one
    after another's finish, and finish before ``finish_at``: every subset tried."""
    inside = [x for x in starts if after < x[0] and x[0] >= at and x[1] < finish_at]
    best = 0
    for n in range(1, len(inside) + 1):
        for chain in itertools.combinations(sorted(inside), n):
            if all(b[0] > a[1] for a, b in itertools.pairwise(chain)):
                best = max(best, sum(a for _, _, a in chain))
    return best


@pytest.mark.parametrize("seed", range(30))
def test_the_longest_chain_of_starts_to_come_is_every_chains_longest(seed: int) -> None:
    rng = random.Random(seed)
    positions = rng.sample(range(1, 60), 2 * rng.randint(1, 7))
    starts = []
    for s, f in zip(positions[::2], positions[1::2], strict=True):
        starts.append((min(s, f), max(s, f), rng.randint(0, 40)))
    after, finish_at = sorted(rng.sample(range(0, 61), 2))
    at_list, best = Horizon(starts).chains(after, finish_at)
    for at in range(after, finish_at + 1):
        got = best[bisect.bisect_left(at_list, at)]
        assert got == _longest_chain(starts, after, finish_at, at), (starts, after, finish_at, at)


def _most_steps(n: int, at: int, fixed: list[tuple[int, int]], starts: list[tuple[int, int, int]]) -> int | None:
    """The most steps by position ``at`` of ``n`` positions: Bellman-Ford over the difference
    constraints written out one by one (x never falls along the order; a request's finish is its
    start plus its steps; a fixed finish is its value, against a zero node), every start from
    ``at`` on taken. None where they admit no schedule."""
    zero = n
    edges = [(p + 1, p, 0) for p in range(at, n - 1)]  # x[p] <= x[p + 1]
    for s, f, a in starts:
        if s >= at:
            edges += [(s, f, a), (f, s, -a)]
    for f, value in fixed:
        edges += [(zero, f, value), (f, zero, -value)]
    inf = float("inf")
    dist = [inf] * (n + 1)
    dist[zero] = 0
    for _ in range(n + 1):
        for u, v, w in edges:
            if dist[u] + w < dist[v]:
                dist[v] = dist[u] + w
    if any(dist[u] + w < dist[v] for u, v, w in edges):
        return None
    return int(dist[at])


def _ceiling(how: str, starts: list[tuple[int, int, int]], at: int, fixed: list[tuple[int, int]]) -> int | None:
    """:meth:`Horizon.ceiling` as written in Python, by the compiled kernel (replay/ceiling.py), or by
    the kernel's interpreted twin (its source run as Python)."""
    horizon = Horizon(starts)
    if how == "python":
        return horizon.ceiling_interpreted(at, fixed)
    run = kernel.ceiling if how == "compiled" else compiled.interpreted(kernel.__name__).ceiling
    fits, value = run(at, np.array([f for f, _ in fixed], np.int64), np.array([v for _, v in fixed], np.int64),
                      *horizon.arrays)
    return int(value) if fits else None


@pytest.mark.parametrize("how", ["python", "compiled", "twin"])
@pytest.mark.parametrize("seed", range(300))
def test_the_ceiling_the_starts_to_come_set_is_the_constraints_shortest_path(seed: int, how: str) -> None:
    rng = random.Random(seed)
    n = rng.randint(4, 14)
    at = rng.randint(0, n - 3)
    places = list(range(at + 1, n))
    rng.shuffle(places)
    fixed = [(places.pop(), rng.randint(0, 30)) for _ in range(min(rng.randint(1, 3), len(places) - 1))]
    if rng.random() < 0.7:  # (finishes fixed by a past that fits the order, as a clock's are)
        fixed = list(zip(sorted(f for f, _ in fixed), sorted(v for _, v in fixed), strict=True))
    starts = []
    if rng.random() < 0.4:  # the event itself a start (one being placed)
        starts.append((at, places.pop(), rng.randint(0, 12)))
    while len(places) >= 2 and rng.random() < 0.8:
        s, f = sorted((places.pop(), places.pop()))
        starts.append((s, f, rng.randint(0, 12)))
    last = max(f for f, _ in fixed)
    got = _ceiling(how, starts, at, fixed)
    assert got == _ceiling("python", starts, at, fixed)  # (the kernel the same answer as the Python, always)
    want = _most_steps(n, at, fixed, starts)
    if got is None:  # (a negative cycle among the constraints it takes is one among all of them)
        assert want is None, (n, at, fixed, starts)
    if want is not None:  # the logs fit a schedule: the most steps by ``at`` of every schedule
        assert got is not None
        if all(s < last for s, _, _ in starts):
            assert got == want, (n, at, fixed, starts)
        else:  # (starts after the last fixed finish left out: looser, never below)
            assert got >= want, (n, at, fixed, starts)


def test_a_horizon_takes_the_compiled_ceiling_after_its_first_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python answers a process's first :data:`replay.schedule.COMPILED_FROM` ceilings, the
    kernel the rest: the same answers either way (a small replay compiles nothing)."""
    starts = [(2, 6, 3), (3, 9, 5), (5, 8, 1)]
    fixed = [(7, 10), (10, 14)]
    asked: list[str] = []
    kernel_ceiling = kernel.ceiling
    monkeypatch.setattr(kernel, "ceiling", lambda *a: asked.append("kernel") or kernel_ceiling(*a))
    monkeypatch.setattr(clock_module, "_CALLS", itertools.count(clock_module.COMPILED_FROM))
    first, second = Horizon(starts).ceiling(1, fixed), Horizon(starts).ceiling(1, fixed)
    assert asked == ["kernel"]
    assert first == second == Horizon(starts).ceiling_interpreted(1, fixed) == 7
    assert Horizon([]).ceiling(0, [(3, 4)]) == 4  # (no start to come: the least fixed value)


def _clock(schedule: Schedule) -> StepClock:
    # 10 ms a step; times known to 1 ms, the fit exact: an event within 1 ms of a launch is ambiguous
    clock = StepClock(Cadence(10_000_000, 5_000_000, 1_000_000), schedule, "decode-0")
    clock.started("a", 0)
    return clock


@pytest.mark.parametrize(("schedule", "steps"), [(LOGGED, 3), (Schedule("early"), 2), (Schedule("late"), 3)])
def test_an_event_near_a_launch_is_ambiguous_and_each_schedule_takes_its_count(schedule: Schedule, steps: int) -> None:
    clock = _clock(schedule)
    # 20.5 ms after the anchor: after the launch at 20 ms by its time, before it within 1 ms
    run, fits = clock.before(20_500_000, [100], None)
    assert (run, fits, clock.ambiguous) == (steps, True, 1)


def test_an_event_far_from_any_launch_is_certain_under_every_schedule() -> None:
    for schedule in (LOGGED, *ALTERNATIVES):
        clock = _clock(schedule)
        assert clock.before(25_000_000, [100], None) == (3, True)
        assert clock.ambiguous == 0


def test_a_steady_pace_has_no_drift_and_a_wandering_one_its_spread_a_step() -> None:
    steady = Cadence.fit([(a, (a - 1) * 10_000_000 + 5_000_000) for a in (2, 7, 30, 120)], 1_000)
    assert steady is not None and steady.drift_ns == pytest.approx(0, abs=1e-3)
    # each step 10 ms give or take up to 3 ms (uniformly): a step's spread is 3 / sqrt(3) ms
    rng = random.Random(5)
    spans = []
    for _ in range(3_000):
        a = rng.randint(2, 200)
        spans.append((a, sum(10_000_000 + rng.randint(-3_000_000, 3_000_000) for _ in range(a - 1)) + 5_000_000))
    wandering = Cadence.fit(spans, 1_000)
    assert wandering is not None
    assert wandering.drift_ns == pytest.approx(3_000_000 / 3 ** 0.5, rel=0.1)


@pytest.mark.parametrize(("drift_ns", "counts"), [(0, {101}), (1_000_000, {98, 101, 104})])
def test_the_further_an_event_is_from_its_anchor_the_wider_the_steps_a_drifting_pace_allows(
        drift_ns: int, counts: set[int]) -> None:
    # 10 ms a step, times to 1 ms, 1 ms of drift a step: 100.3 steps on, the time leaves 98 to 104
    # (3 drifts of sqrt(100.3) steps' wandering each side); on a steady pace only 101
    got = set()
    for schedule in (LOGGED, Schedule("early"), Schedule("late")):
        clock = StepClock(Cadence(10_000_000, 5_000_000, 1_000_000, drift_ns), schedule, "decode-0")
        clock.started("a", 0)
        run, fits = clock.before(1_003_000_000, [10_000], None)
        assert fits and clock.ambiguous == (len(counts) > 1)
        got.add(run)
    assert got == counts


def test_a_mixed_schedule_chooses_the_same_on_every_run_and_within_the_bounds() -> None:
    def counts(seed: int) -> list[int]:
        clock = _clock(Schedule("mixed", seed))
        out = []
        for k in range(1, 40):
            out.append(clock.before(k * 10_000_000 + 500_000, [10_000], None)[0])
        return out

    assert counts(1) == counts(1)
    assert counts(1) != counts(2)  # (39 ambiguous events: two seeds choosing alike is 2^-39)
    assert all(c in (0, 1, 2) for c in counts(1))


def test_no_event_runs_past_a_running_request_s_finish_or_the_starts_that_must_come_before_it() -> None:
    # request a: starts at step 0, 100 steps, finishes at position 9; b and c (30 steps each) start
    # at positions 3 and 6, one after the other's finish (positions 5 and 8): before position 3 no
    # more than 100 - 60 = 40 steps may run, however late the event's time says it is
    clock = StepClock(Cadence(10_000_000, 5_000_000, 0), LOGGED, "decode-0",
                      horizon=Horizon([(0, 9, 100), (3, 5, 30), (6, 8, 30)]))
    clock.before(0, [], None, starting=True, joining=(100, 9), at=0)
    clock.started("a", 0, (100, 9), 0)
    run, fits = clock.before(900_000_000, [100], None, at=2)  # (90 steps by its time)
    assert (run, fits) == (40, True)
