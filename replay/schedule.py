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
  :attr:`Cadence.step_ns` a step, bounded by what every running request still has to take.

The cadence of a (node, boot) is fitted by least squares to its requests' decode spans: a request
that takes part in A steps spans ``(A - 1) * step_ns + finish_ns`` from its start to its finish.

A count taken from a time is certain only as far as the times are exact and the pace steady: an
event within :attr:`Cadence.tolerance_ns` (the times' resolution and twice the fit's residual) of
a step's launch may fall on either side of it. Such an event is **ambiguous**; a clock counts them
and, under a :class:`Schedule` other than the logged one, takes the other admissible counts (the
earliest, the latest, or a seeded choice per event), which is how the replay finds the victims that
the evidence does not decide (``replay.replay``: certain and possible victims).
"""

from __future__ import annotations

import bisect
import math
import random
import zlib
from dataclasses import dataclass, field

import numpy as np

#: A step count from a time is taken this close to a whole number as that number (times are whole
#: nanoseconds, kept as integers: as floats, epoch nanoseconds lose hundreds of them).
_EPS = 1e-6


@dataclass(frozen=True)
class Cadence:
    """A decode node's pace: nanoseconds a step, and from a request's last step to its finish."""

    step_ns: float
    finish_ns: float
    #: how far from a step's launch an event's time may lie and still fall on either side of it:
    #: the times' resolution plus twice the fit's root-mean-square residual
    tolerance_ns: float = 0.0

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
        return cls(step_ns, finish_ns, resolution_ns + 2 * rms)


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
        room = min(remaining, default=0)
        for rid, (steps_i, _) in self._ends.items():  # no step runs past a finish still to come,
            later = 0  # nor past what the chains of requests to start before it leave room for
            if at is not None and rid in self._chains:
                starts, best = self._chains[rid]
                later = best[bisect.bisect_left(starts, at)]
            room = min(room, self._first[rid] + steps_i - later - self.steps)
        room = max(room, 0)
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
        slack = self.cadence.tolerance_ns / self.cadence.step_ns
        counts = [self._count(p, starting) for p in (position - slack, position, position + slack)]
        counts = [min(max(index + c - self.steps, least), room) for c in counts]
        run = counts[1]
        if counts[0] != counts[2]:
            self.ambiguous += 1
            run = self._pick(counts[0], counts[1], counts[2])
        self.steps += run
        return run, True

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

    def started(self, rid: str, ts_ns: int, joining: tuple[int, int] | None = None, at: int | None = None) -> None:
        """``rid`` joined the running batch at ``ts_ns``, as the next step was launched; ``joining``:
        its steps in all and where its delivered finish comes, where known."""
        self._first[rid] = self.steps
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
        if first is None or total < 1 or self.cadence is None:
            return
        self._anchor = (ts_ns - round(self.cadence.finish_ns), first + total - 1)

    def forget(self, rid: str) -> None:
        """``rid`` left the batch without a logged finish."""
        self._first.pop(rid, None)
        self._ends.pop(rid, None)
        self._chains.pop(rid, None)
