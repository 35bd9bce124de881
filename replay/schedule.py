"""Where a decode node's steps fall among its logged events (reference-engine.md, "What
request-level logs say about the steps"; docs/schema-v1.1.md, "the schedule from the evidence").

A decode node's log orders its events but says nothing of the steps between them, and the pages a
request gets depend on them: every step gives each running request the slot of its next token. The
evidence that places them: a request that joins the running batch at its ``decode_started`` and
outputs N tokens takes part in exactly :func:`replay.engine.decode_steps` steps before its
``finished`` (the steps run in lockstep for the whole batch), and the times between events say how
many steps fit, at the node's pace. :class:`StepClock` walks a node's events in order and says, for
each, how many steps ran before it:

- before a running request's ``finished``: exactly the steps it still had to take (the count is
  certain; where another running request would then have taken more steps than its own output
  allows, or the steps already run exceed the count, the logs fit no lockstep schedule: a
  disagreement, listed);
- before any other event: the steps its time says, from the last event whose step is known
  (a request's start, or a finish: its last step ran :attr:`Cadence.finish_ns` before it), at
  :attr:`Cadence.step_ns` a step, bounded by what every running request still has to take and,
  where the time leaves the count open, by what the starts still to come allow
  (:meth:`Horizon.ceiling`: a greedy walk that did not look ahead could reach a finish with no
  schedule left, and list a disagreement on logs that fit).

The cadence of a (node, boot) is fitted by least squares to its requests' decode spans: a request
that takes part in A steps spans ``(A - 1) * step_ns + finish_ns`` from its start to its finish.

A count taken from a time is certain only as far as the times are exact and the pace steady: an
event within :attr:`Cadence.tolerance_ns` (the times' resolution and twice the fit's residual) of
a step's launch may fall on either side of it, and further from the event its count is taken
from, further still: step durations that wander add up like a random walk, so ``n`` steps on the
window grows by :data:`DRIFT_SIGMAS` times :attr:`Cadence.drift_ns` times the square root of ``n``.
Such an event is **ambiguous**; a clock counts them and, under a :class:`Schedule` other than the
logged one, takes the other admissible counts (the earliest, the latest, or a seeded choice per
event), which is how the replay finds the victims that the evidence does not decide
(``replay.replay``: certain and possible victims).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import zlib
from dataclasses import dataclass, field

import numpy as np

from forensics import compiled
from replay import ceiling as kernel

#: A step record's running batch is checked where the steps it may report are at most this many
#: (the records before it have placed it; the first of a boot may fall anywhere between two events).
_ROWS_CHECKED = 64
#: How many of a step's drift (:attr:`Cadence.drift_ns`, grown with the square root of the steps from
#: the event a count is taken from) an event's time may be off and still fall on either side of a
#: step's launch. Measured on the independent generator (steps 1 ms, each up to 30% or 45% off,
#: times to the millisecond; 8 seeds, with and without step records): without it 7 (reader, victim)
#: pairs in 3 of 32 runs were named certain and were wrong; with 3, none (certain ones 96.6% of the
#: true pairs against 97.2%, before :meth:`Horizon.ceiling` took them to 97.7%).
DRIFT_SIGMAS = 3
#: A value no path has reached (:meth:`Horizon.ceiling`): above any step count.
_UNREACHED = kernel.UNREACHED
#: Ceilings a process asks (:meth:`Horizon.ceiling`) before it takes the compiled kernel
#: (replay/ceiling.py): a small replay compiles nothing; both give the same answer.
COMPILED_FROM = 2_000
_CALLS = itertools.count(1)
#: The name a record read again after it did not fit carries (:meth:`StepClock.pinned`).
RESTART = "(read again)"
#: A step count from a time is taken this close to a whole number as that number (times are whole
#: nanoseconds, kept as integers: as floats, epoch nanoseconds lose hundreds of them).
_EPS = 1e-6


def load_kernel() -> None:
    """Load the compiled ceiling now and take it from the next call on: a replay's fork server
    does, before it forks the workers (replay/preload.py)."""
    global _CALLS
    one = np.zeros(1, np.int64)
    kernel.ceiling(0, one, one.copy(), one.copy(), one.copy(), one.copy())
    _CALLS = itertools.count(COMPILED_FROM + 1)


@dataclass(frozen=True)
class Cadence:
    """A decode node's pace: nanoseconds a step, and from a request's last step to its finish."""

    step_ns: float
    finish_ns: float
    #: how far from a step's launch an event's time may lie and still fall on either side of it:
    #: the times' resolution plus twice the fit's root-mean-square residual
    tolerance_ns: float = 0.0
    #: how much a step's duration wanders, as a random walk: an event ``n`` steps from the event its
    #: count is taken from may be off by about ``drift_ns * sqrt(n)`` (the clock allows
    #: :data:`DRIFT_SIGMAS` of them); 0 where the spans fit the pace exactly
    drift_ns: float = 0.0

    @classmethod
    def fit(cls, spans: list[tuple[int, int]], resolution_ns: int = 0) -> Cadence | None:
        """The cadence of ``(steps, span_ns)`` pairs (a request's steps and the time from its start
        to its finish), with times logged to ``resolution_ns``; None where nothing decoded for more
        than one step."""
        usable = [(a, t) for a, t in spans if a >= 1 and t >= 0]
        if not usable:
            return None
        steps = np.array([a for a, _ in usable], dtype=np.float64)
        span = np.array([t for _, t in usable], dtype=np.float64)
        if len(set(steps.tolist())) < 2:  # one length only: half a step from the last to the finish
            step = float(np.median(span / (steps - 0.5)))
            if step <= 0:
                return None
            step_ns, finish_ns = step, step / 2
        else:
            slope, intercept = np.polyfit(steps - 1, span, 1)
            if slope <= 0:
                return None
            step_ns, finish_ns = float(slope), float(max(intercept, 0.0))
        residual = span - ((steps - 1) * step_ns + finish_ns)
        rms = float(np.sqrt(np.mean(residual * residual)))
        # a span of A steps adds up A - 1 steps' durations: its residual's variance, A - 1 steps' drift
        drift = float(np.sqrt(np.mean(residual * residual / np.maximum(steps - 1, 1))))
        return cls(step_ns, finish_ns, resolution_ns + 2 * rms, drift)


@dataclass(frozen=True)
class Schedule:
    """Which of the step counts the evidence admits a replay takes at an ambiguous event: the
    logged one (the count nearest the event's time, at the fitted pace), the earliest, the latest,
    or a choice per event seeded by ``seed`` (and the node: the same on every run)."""

    pick: str = "logged"  # "logged" | "early" | "late" | "mixed"
    seed: int = 0

    @property
    def name(self) -> str:
        """How the schedule is named in a replay's results."""
        return f"{self.pick}-{self.seed}" if self.pick == "mixed" else self.pick


#: The schedule the replay takes unless asked for another.
LOGGED = Schedule()
#: The other schedules tried where the logged one met an ambiguous event: the earliest and the
#: latest admissible counts everywhere, and two seeded mixtures of them.
ALTERNATIVES = (Schedule("early"), Schedule("late"), Schedule("mixed", 1), Schedule("mixed", 2))


class Horizon:
    """The decode starts of a (node, boot), for the bound that those still to come set on steps now.

    Finishes come in lockstep: a request j that starts at step ``s_j`` and takes ``A_j`` steps
    finishes after exactly ``s_j + A_j`` of them. So while a request i runs (its finish, after
    ``s_i + A_i`` steps, still to come), each chain of requests that start after now, one after
    another's finish, and finish before i does, takes its steps in all before i's finish: no event
    now may have more than ``s_i + A_i`` minus the longest such chain before it. (A clock that
    placed an event by its time alone could run past that, leaving the logs with no schedule.)
    Each start: ``(where it comes, where its request's delivered finish comes, its steps)``,
    positions in the node's order."""

    def __init__(self, starts: list[tuple[int, int, int]]) -> None:
        self._starts = sorted(starts)
        self._at = [s for s, _, _ in self._starts]
        # (the same starts as arrays, for the compiled ceiling and the compiled decode node)
        self.arrays = tuple(np.array([row[k] for row in self._starts], np.int64) for k in range(3))

    def chains(self, after: int, finish_at: int) -> tuple[list[int], list[int]]:
        """For a request that starts at ``after`` and finishes at ``finish_at``: the starts inside
        it, each with the longest chain of the requests that start there or later and finish before
        it (two lists, in the node's order; :meth:`StepClock.before` reads them)."""
        lo, hi = bisect.bisect_right(self._at, after), bisect.bisect_left(self._at, finish_at)
        inside = [(s, f, a) for s, f, a in self._starts[lo:hi] if f < finish_at]
        at = [s for s, _, _ in inside]
        best = [0] * (len(inside) + 1)
        for k in range(len(inside) - 1, -1, -1):
            _, f, a = inside[k]
            best[k] = max(best[k + 1], a + best[bisect.bisect_right(at, f, lo=k)])
        return at, best

    def ceiling(self, at: int, fixed: list[tuple[int, int]]) -> int | None:
        """The most steps that may have run by the event at ``at`` in the node's order, given the
        finishes already fixed (``fixed``: each running request's ``(where its finish comes, the
        step count there)``), by every constraint of order and lockstep among the starts still to
        come: the shortest path, in the system of difference constraints, from a fixed finish to
        ``at`` (back along the order for nothing, forward over a request from its start to its
        finish for its steps, back from its finish to its start for minus them). None where no
        finish is fixed, or the constraints admit no schedule.

        :meth:`chains` is the part of it where the requests to come nest inside one running
        request; this adds chains that cross, such as a start whose own finish comes after a
        longer request's, both before a fixed finish. Only the starts before the last fixed finish
        are taken (a bound from fewer constraints is looser, never wrong)."""
        if not fixed:
            return None
        if compiled.taken(_CALLS, COMPILED_FROM, "ceiling"):  # (the same answer, compiled: replay/ceiling.py)
            fits, value = kernel.ceiling(at, np.array([f for f, _ in fixed], np.int64),
                                         np.array([v for _, v in fixed], np.int64), *self.arrays)
            return int(value) if fits else None
        return self.ceiling_interpreted(at, fixed)

    def ceiling_interpreted(self, at: int, fixed: list[tuple[int, int]]) -> int | None:
        """:meth:`ceiling` in Python, as it was written first (the kernel is held to it)."""
        if not fixed:
            return None
        last = max(f for f, _ in fixed)
        lo, hi = bisect.bisect_left(self._at, at), bisect.bisect_left(self._at, last)
        future = self._starts[lo:hi]
        # every position a path may stop at (each at or after ``at``), highest first, and the least
        # value a path has reached there
        places = sorted({f for f, _ in fixed}.union(*((s, f) for s, f, _ in future)), reverse=True)
        rank = {p: k for k, p in enumerate(places)}
        best = [_UNREACHED] * len(places)
        for f, value in fixed:
            best[rank[f]] = min(best[rank[f]], value)
        jumps = [(rank[s], rank[f], a) for s, f, a in future]
        suffix = [_UNREACHED] * len(places)  # the least value at a position or after it
        for _ in range(2 * len(future) + 2):  # (a sweep takes each path one jump further; a shortest
            least = _UNREACHED                # path makes each request's two jumps at most once)
            for k, v in enumerate(best):
                least = min(least, v)
                suffix[k] = least
            changed = False
            for ks, kf, a in jumps:
                if suffix[ks] < _UNREACHED and suffix[ks] + a < best[kf]:  # from any position at or after
                    best[kf] = suffix[ks] + a  # the start, on to its finish
                    changed = True
                if suffix[kf] < _UNREACHED and suffix[kf] - a < best[ks]:  # from any position at or after
                    best[ks] = suffix[kf] - a  # the finish, back to its start
                    changed = True
            if not changed:
                return min(best)
        return None  # (still falling: a negative cycle, the logs fit no lockstep schedule)


@dataclass
class StepClock:
    """The steps before each of one (node, boot)'s events, walked in the node's order."""

    cadence: Cadence | None
    schedule: Schedule = LOGGED
    node: str = ""  # (seeds a mixed schedule's choices)
    steps: int = 0  # steps run so far
    ambiguous: int = 0  # events whose step count the evidence does not decide
    _rng: random.Random | None = None
    horizon: Horizon | None = None  # the starts still to come (None: not known)
    _anchor: tuple[int, int] | None = None  # (a time in ns, the index of the step launched then)
    _first: dict[str, int] = field(default_factory=dict)  # a running request's first step
    #: a running request's steps in all and where its delivered finish comes in the node's order,
    #: where both are known (they bound where a request that joins later may start)
    _ends: dict[str, tuple[int, int]] = field(default_factory=dict)
    _chains: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)  # (Horizon.chains)
    _joining: tuple[list[int], list[int]] | None = None  # the chains of the start just placed
    #: step records (:meth:`reported`): each running request's first step and steps in all, and
    #: those of the requests that left, while a record may still ask for a step they ran in
    _rows: dict[str, tuple[int, int]] = field(default_factory=dict)
    _left: list[tuple[int, int]] = field(default_factory=list)
    #: the step records read and not yet settled (:meth:`settle`): each (steps reported since the
    #: boot's first record, steps run before it, its running batch, its name, the time from which
    #: an event surely came after it: None where its place in the node's order is exact)
    _records: list[tuple[int, int, int, str, int | None]] = field(default_factory=list)
    _reported: int | None = None  # steps reported from the boot's first record to its last
    #: the last record settled: its count since the boot's first, and the steps of the replay's
    #: count it may report (the node's first count is unknown: the warmup's steps count too)
    _chain: tuple[int, int, int] | None = None
    overlap: bool = True  # the node runs the overlap scheduler (a record then reports the step before)
    step_records: int = 0  # step records that fit the replay's steps (nothing in them contradicts it)
    #: step records that do not fit the replay's steps where the times had left some step counts
    #: undecided before them: the replay's pick among the schedules they allow may be the one the
    #: record rules out (the job replays the others: victims that vary are possible)
    step_records_undecided: int = 0
    #: step records not checked: a request decoded on the boot that the replay does not run step by
    #: step (no plan: the router never logged it; or past the replay's bounds), so its batch is not the node's
    step_records_unchecked: int = 0
    blind: bool = False
    #: where the replay's steps and the node's step records disagree: (the record, as its seq or
    #: time names it; what)
    step_disagreements: list[tuple[str, str]] = field(default_factory=list)

    def before(self, ts_ns: int, remaining: list[int], finishing: tuple[str, int] | None,
               starting: bool = False, joining: tuple[int, int] | None = None,
               at: int | None = None) -> tuple[int, bool]:
        """How many steps run before an event at ``ts_ns``, with ``remaining`` the steps each running
        request still has to take; ``finishing``: (request, its steps in all) where the event is a
        running request's finish; ``starting`` where it is a request's decode start, which comes as
        a step is launched (its time is taken to the nearest step: a logged start may be off by a
        rounding of its clock), with ``joining``: (its steps in all, where its delivered finish comes
        in the node's order) where both are known; ``at``: where the event comes in the node's
        order (the starts after it bound it: :class:`Horizon`). Also whether the count fits the
        logs (False: a disagreement)."""
        room = self.room(remaining, at)
        least = 0
        if joining is not None:  # finishes in lockstep: one that comes before its own ends no later,
            total, finish_at = joining  # nor before the chains of requests that start after it
            self._joining = (self.horizon.chains(at, finish_at) if self.horizon is not None and at is not None
                             else ([], [0]))
            starts, best = self._joining
            for rid, (steps_i, finish_i) in self._ends.items():
                bound = self._first[rid] + steps_i - total - self.steps
                if finish_i > finish_at:
                    room = min(room, bound)
                else:
                    least = max(least, bound + best[bisect.bisect_left(starts, finish_i)])
            room = max(room, least)  # (where the bounds cross, the logs fit no schedule: a finish says so)
        if finishing is not None and finishing[0] in self._first:
            rid, total = finishing
            due = self._first[rid] + total - self.steps
            self.steps += max(due, 0)
            return max(due, 0), 0 <= due <= room
        if not room or self.cadence is None or self._anchor is None:
            self.steps += least
            return least, True
        anchor_ns, index = self._anchor
        position = (ts_ns - anchor_ns) / self.cadence.step_ns
        slack = (self.cadence.tolerance_ns + DRIFT_SIGMAS * self.cadence.drift_ns * math.sqrt(abs(position))
                 ) / self.cadence.step_ns
        counts = [self._count(p, starting) for p in (position - slack, position, position + slack)]
        counts = [min(max(index + c - self.steps, least), room) for c in counts]
        if counts[0] != counts[2] and self.horizon is not None and at is not None:
            # a count the times leave open: none past what the starts to come allow (Horizon.ceiling)
            ceiling = self.horizon.ceiling(at, [(f, self._first[rid] + steps_i)
                                                for rid, (steps_i, f) in self._ends.items()])
            if ceiling is not None and ceiling - self.steps >= least:
                counts = [min(c, ceiling - self.steps) for c in counts]
        run = counts[1]
        if counts[0] != counts[2]:
            self.ambiguous += 1
            run = self._pick(counts[0], counts[1], counts[2])
        self.steps += run
        return run, True

    def room(self, remaining: list[int], at: int | None = None) -> int:
        """The most steps that may run now, before an event at ``at`` in the node's order, with
        ``remaining`` the steps each running request still has to take: no step runs past a finish
        still to come, nor past what the chains of requests to start before it leave room for."""
        room = min(remaining, default=0)
        for rid, (steps_i, _) in self._ends.items():
            later = 0
            if at is not None and rid in self._chains:
                starts, best = self._chains[rid]
                later = best[bisect.bisect_left(starts, at)]
            room = min(room, self._first[rid] + steps_i - later - self.steps)
        return max(room, 0)

    @staticmethod
    def _count(position: float, starting: bool) -> int:
        """Steps launched before an event ``position`` steps after the anchor: a start comes with a
        step's launch (the nearest one), any other event after every step launched before it."""
        return math.floor(position + 0.5) if starting else math.ceil(position - _EPS)

    def _pick(self, early: int, logged: int, late: int) -> int:
        """The count an ambiguous event takes under the clock's schedule."""
        pick = self.schedule.pick
        if pick == "early":
            return early
        if pick == "late":
            return late
        if pick == "mixed":
            if self._rng is None:
                self._rng = random.Random(self.schedule.seed * 1_000_003 + zlib.crc32(self.node.encode()))
            return self._rng.randint(early, late)
        return logged

    def time_of(self, step: int) -> int | None:
        """When the step of index ``step`` was launched, by the node's pace from the last event
        whose step is known (None where no cadence or anchor says)."""
        if self.cadence is None or self._anchor is None:
            return None
        at, index = self._anchor
        return at + round((step - index) * self.cadence.step_ns)

    def started(self, rid: str, ts_ns: int, joining: tuple[int, int] | None = None, at: int | None = None,
                allocs: int = 0) -> None:
        """``rid`` joined the running batch at ``ts_ns``, as the next step was launched; ``joining``:
        its steps in all and where its delivered finish comes, where known; ``allocs``: the steps
        the engine gives it."""
        self._first[rid] = self.steps
        self._rows[rid] = (self.steps, allocs)
        if joining is not None:
            self._ends[rid] = joining
            if self._joining is not None:
                self._chains[rid] = self._joining
        self._joining = None
        self._anchor = (ts_ns, self.steps)

    def finished(self, rid: str, ts_ns: int, total: int) -> None:
        """``rid`` left the batch at ``ts_ns`` after ``total`` steps: its last step was launched
        a finish's time before."""
        first = self._first.pop(rid, None)
        self._ends.pop(rid, None)
        self._chains.pop(rid, None)
        self._leave(rid)
        if first is None or total < 1 or self.cadence is None:
            return
        self._anchor = (ts_ns - round(self.cadence.finish_ns), first + total - 1)

    def forget(self, rid: str) -> None:
        """``rid`` left the batch without a logged finish."""
        self._leave(rid)
        self._first.pop(rid, None)
        self._ends.pop(rid, None)
        self._chains.pop(rid, None)

    # -- the node's step records (docs/schema-v1.1.md, "What SGLang's Decode batch line pins") ----

    def _leave(self, rid: str) -> None:
        """``rid`` left the batch: its steps kept while a step record read or to come may report one
        of them (a record comes after the steps run before the event before it, less one)."""
        row = self._rows.pop(rid, None)
        floor = min([self.steps, *(r[1] for r in self._records)]) - 1
        if row is not None and row[0] + row[1] >= floor:
            self._left = [r for r in self._left if r[0] + r[1] >= floor]
            self._left.append(row)

    def reported(self, steps: int | None, running: int, seq: int | None, ts_ns: int, label: str = "") -> int | None:
        """A step record at ``ts_ns``: the node had processed the results of ``steps`` more decode
        steps since its previous record (None: not known, the chain starts again), ``running``
        requests in the batch of the last; ``label`` names it where it may be listed.

        The node's count runs a fixed offset from the replay's (its first record's count is unknown:
        the warmup's steps count too), so a record says where its step falls from the last one
        settled. Where its place in the node's order is exact (it has a seq) and the last record
        fixed its step, this one's: the caller runs the replay's steps up to it and calls
        :meth:`pinned`. Else None: it places no step, and the steps run before it and before an
        event surely after it bound where its step falls (:meth:`settle`).

        Without a seq (an SGLang log: the order is the records' times) the line was printed within
        its time's resolution (a second, as SGLang prints it, unless ``SGLANG_LOG_MS``), and only
        an event after that, other than a finish, surely came after it: SGLang's finish line comes
        from another process, so it may be printed after the batch line its last step preceded."""
        if self._reported is None or steps is None:
            self._reported, self._chain = 0, None
        else:
            self._reported += steps
        chain = self._chain
        if seq is not None and not self._records and not self.blind and chain is not None and chain[1] == chain[2]:
            return chain[1] + self._reported - chain[0]
        ready = None if seq is not None else ts_ns + _resolution(ts_ns)
        self._records.append((self._reported, self.steps, running, label, ready))
        return None

    def placed(self, exact: bool) -> None:
        """The record just read (its place exact, not pinned) had the steps its time says run before
        it: they are the least it may report; with ``exact`` (its time left no doubt) the most too,
        and it is settled now."""
        reported, _, running, label, ready = self._records.pop()
        if exact and not self._records:
            self._settle_one(reported, self.steps, running, label, self.steps)
        else:
            self._records.append((reported, self.steps, running, label, ready))

    def flushed(self) -> None:
        """The node's caches were flushed after the steps run so far: SGLang flushes only an idle
        node (every step it launched processed), so the records before it are settled, and its
        count of decode steps starts again from 0 there (``reset_metrics``): the next record
        reports the steps after the flush, the flush's place in the replay's count exact."""
        self.settle()
        self._reported = 0
        self._chain = None if self.blind else (0, self.steps, self.steps)

    def ran(self, steps: int) -> None:
        """``steps`` more steps ran, up to a pinned record's."""
        self.steps += steps

    def pinned(self, step: int, running: int, label: str = "") -> bool:
        """The replay ran its steps up to the one a record reports (``step``, from
        :meth:`reported`; under the overlap scheduler one more where a request still decodes), where
        the finishes to come let it: the record is held to the count it reached and to its batch at
        ``step``. Where they did not (False), the record is read again as the first of a new chain:
        the caller places it by its time (:meth:`placed`)."""
        assert self._reported is not None
        reports = self._reports(self.steps, self._batches(self.steps + 1, self.steps + 1)[0] > 0)
        if step in reports:
            self._judge(self._batches(step, step)[0], running, label)
            self._chain = (self._reported, step, step)
            return True
        since = self._reported - (self._chain[0] if self._chain is not None else 0)
        self._differs(label, pinned_differs(since, step, self.steps))
        self._chain = None
        self._records.append((self._reported, self.steps, running, RESTART, None))
        return False

    def settle(self, ts_ns: int | None = None, finish: bool = False, beyond: int = 0) -> None:
        """At an event at ``ts_ns`` (a ``finish``, or None: the boot's end, after which ``beyond``
        more steps may have run), after the steps before it: the step records it surely comes after
        are bounded by the steps run so far. Each reports the result of a step P that the replay
        launched, as its C-th, between the steps run before the record and those run now
        (:meth:`_reports`), and P lies as many steps after the last record's as the node reports.
        Where it cannot, or the replay's batch at every step the record may report had other than
        ``running`` rows, the replay and the node's own step log disagree (:meth:`_differs`)."""
        after = self.steps + beyond
        done = 0
        for reported, before, running, label, ready in self._records:
            if ready is not None and ts_ns is not None and (finish or ts_ns < ready):
                break  # (the records after it wait too: their steps chain)
            done += 1
            self._settle_one(reported, before, running, label, after)
        del self._records[:done]

    def _settle_one(self, reported: int, before: int, running: int, label: str, after: int) -> None:
        """A record that reports ``reported`` steps since the boot's first, with ``before`` to ``after``
        steps launched by the replay when it was printed (:meth:`settle`)."""
        if self.blind:
            self.step_records_unchecked += 1
            return
        counted = label is not RESTART  # (a record that did not fit, read again: its chain only)
        wide = after - before > _ROWS_CHECKED
        nexts = self._batches(before + 1, after + 1) if not wide else []  # (the rows of each next step)
        reports = [before - 1, after] if wide else sorted(set().union(*(
            self._reports(c, nexts[c - before] > 0) for c in range(before, after + 1))))
        chain = self._chain
        if chain is None:
            fits = reports
        else:
            lo, hi = chain[1] + reported - chain[0], chain[2] + reported - chain[0]
            fits = [p for p in reports if lo <= p <= hi] if not wide else \
                ([max(lo, reports[0]), min(hi, reports[1])] if max(lo, reports[0]) <= min(hi, reports[1]) else [])
            if not fits:
                self._differs(label, placed_differs(reported - chain[0], lo, hi, reports[0], reports[-1]))
                self._chain = (reported, reports[0], reports[-1])
                return
        self._chain = (reported, fits[0], fits[-1])
        steps = fits if not wide else list(range(fits[0], fits[-1] + 1))
        if not counted:
            return
        if len(steps) > _ROWS_CHECKED:
            self.step_records += 1  # (its count fits; its batch is not checked: too many steps it may report)
            return
        span = self._batches(steps[0], steps[-1])
        rows = sorted({span[p - steps[0]] for p in steps})
        if running in rows:
            self.step_records += 1
        else:
            self._judge(rows[0], running, label, rows)

    def _judge(self, rows: int, running: int, label: str, every: list[int] | None = None) -> None:
        """A record's ``running`` against the replay's batch at its step (``every``: at each step it may report)."""
        if running == rows:
            self.step_records += 1
            return
        self._differs(label, running_differs(running, every or [rows]))

    def _differs(self, label: str, detail: str) -> None:
        """A record the replay's steps do not fit: a disagreement where every step count before it was
        decided by the evidence; where the times had left some undecided, the replay's pick may be
        the one the record rules out, and it is counted undecided (the job replays the other
        schedules the times allow: victims that differ there are possible)."""
        if self.ambiguous:
            self.step_records_undecided += 1
        else:
            self.step_disagreements.append((label, detail))

    def _reports(self, launched: int, going_on: bool) -> set[int]:
        """The steps a record may report where the replay had launched ``launched``: that one
        without the overlap scheduler; with it, the one before where a request takes part in the
        next step (``going_on``: the scheduler launches it before it reports), else either (a batch
        that empties is reported after its last step, or after the launch of an overlap slot that
        was the last)."""
        if not self.overlap:
            return {launched}
        return {launched - 1} if going_on else {launched - 1, launched}

    def _batches(self, lo: int, hi: int) -> list[int]:
        """The rows of each step from ``lo`` to ``hi``, in one pass (a request takes part in the steps
        ``first + 1`` to ``first + allocs``)."""
        diff = [0] * (hi - lo + 2)
        for rows in (self._rows.values(), self._left):
            for f, a in rows:
                first, last = max(f + 1, lo), min(f + a, hi)
                if first <= last:
                    diff[first - lo] += 1
                    diff[last - lo + 1] -= 1
        out, running = [], 0
        for d in diff[:-1]:
            running += d
            out.append(running)
        return out


def steps_differ(steps: int) -> str:
    """``steps_differ``: a running request's finish that no lockstep schedule of the node's order fits."""
    return f"its {steps} decode steps fit no lockstep schedule of the node's logged order"


def step_record_differs(boot: int, label: str, detail: str) -> str:
    """``step_record_differs``: where a node's step record and the replay's steps disagree."""
    return f"boot {boot}, step record {label}: {detail}"


def pinned_differs(since: int, step: int, launched: int) -> str:
    """What a step record says that no step the finishes around it let the replay reach fits."""
    return (f"the node's step records place it {since:,} steps after the last one, at step {step:,} of the "
            f"replay's count; the replay had launched {launched:,} there and the finishes logged around it let it "
            "reach no other")


def placed_differs(since: int, lo: int, hi: int, first: int, last: int) -> str:
    """What a step record says that none of the replay's steps where it was printed fits."""
    return (f"the node's step records place it {since:,} steps after the last one, at step {lo:,} to {hi:,} of "
            f"the replay's count; the replay's steps there were {first:,} to {last:,}")


def running_differs(running: int, rows: list[int]) -> str:
    """What a step record says of its batch that the replay's batch at each step it may report does not."""
    shown = " or ".join(str(r) for r in rows)
    return f"the step record says {running:,} requests running; the replay's batch at the step it reports had {shown}"


def _resolution(ts_ns: int) -> int:
    """The resolution a time was logged to, as far as one time tells: a second, a millisecond or a microsecond."""
    return 1_000_000_000 if ts_ns % 1_000_000_000 == 0 else 1_000_000 if ts_ns % 1_000_000 == 0 else 1_000
