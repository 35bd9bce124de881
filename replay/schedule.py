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
"""

from __future__ import annotations

import math
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

    @classmethod
    def fit(cls, spans: list[tuple[int, int]]) -> Cadence | None:
        """The cadence of ``(steps, span_ns)`` pairs (a request's steps and the time from its start
        to its finish); None where nothing decoded for more than one step."""
        usable = [(a, t) for a, t in spans if a >= 1 and t >= 0]
        if not usable:
            return None
        steps = np.array([a for a, _ in usable], dtype=np.float64)
        span = np.array([t for _, t in usable], dtype=np.float64)
        if len(set(steps.tolist())) < 2:  # one length only: half a step from the last to the finish
            step = float(np.median(span / (steps - 0.5)))
            return cls(step, step / 2) if step > 0 else None
        slope, intercept = np.polyfit(steps - 1, span, 1)
        if slope <= 0:
            return None
        return cls(float(slope), float(max(intercept, 0.0)))


@dataclass
class StepClock:
    """The steps before each of one (node, boot)'s events, walked in the node's order."""

    cadence: Cadence | None
    steps: int = 0  # steps run so far
    _anchor: tuple[int, int] | None = None  # (a time in ns, the index of the step launched then)
    _first: dict[str, int] = field(default_factory=dict)  # a running request's first step

    def before(self, ts_ns: int, remaining: list[int], finishing: tuple[str, int] | None,
               starting: bool = False) -> tuple[int, bool]:
        """How many steps run before an event at ``ts_ns``, with ``remaining`` the steps each running
        request still has to take; ``finishing``: (request, its steps in all) where the event is a
        running request's finish; ``starting`` where it is a request's decode start, which comes as
        a step is launched (its time is taken to the nearest step: a logged start may be off by a
        rounding of its clock). Also whether the count fits the logs (False: a disagreement)."""
        room = min(remaining, default=0)
        if finishing is not None and finishing[0] in self._first:
            rid, total = finishing
            due = self._first[rid] + total - self.steps
            self.steps += max(due, 0)
            return max(due, 0), 0 <= due <= room
        if not room or self.cadence is None or self._anchor is None:
            return 0, True
        at, index = self._anchor
        position = (ts_ns - at) / self.cadence.step_ns
        due = index + (math.floor(position + 0.5) if starting else math.ceil(position - _EPS)) - self.steps
        run = min(max(due, 0), room)
        self.steps += run
        return run, True

    def time_of(self, step: int) -> int | None:
        """When the step of index ``step`` was launched, by the node's pace from the last event
        whose step is known (None where no cadence or anchor says)."""
        if self.cadence is None or self._anchor is None:
            return None
        at, index = self._anchor
        return at + round((step - index) * self.cadence.step_ns)

    def started(self, rid: str, ts_ns: int) -> None:
        """``rid`` joined the running batch at ``ts_ns``, as the next step was launched."""
        self._first[rid] = self.steps
        self._anchor = (ts_ns, self.steps)

    def finished(self, rid: str, ts_ns: int, total: int) -> None:
        """``rid`` left the batch at ``ts_ns`` after ``total`` steps: its last step was launched
        a finish's time before."""
        first = self._first.pop(rid, None)
        if first is None or total < 1 or self.cadence is None:
            return
        self._anchor = (ts_ns - round(self.cadence.finish_ns), first + total - 1)

    def forget(self, rid: str) -> None:
        """``rid`` left the batch without a logged finish."""
        self._first.pop(rid, None)
