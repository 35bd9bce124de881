"""Request streams for the simulator: synthetic, or read from a public trace file.

Trace formats (../shared/traces/README.md):
- Mooncake JSON Lines: ``timestamp`` (ms from the start), ``input_length``, ``output_length``.
- Azure LLM inference CSV: ``TIMESTAMP`` (wall clock, no zone), ``ContextTokens``,
  ``GeneratedTokens``.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from forensics.errors import InputNotFound, UnreadableFile


@dataclass(frozen=True)
class Arrival:
    """One request as it reaches the router, relative to the stream's start."""

    offset_ns: int
    prompt_tokens: int
    output_tokens: int


def synthetic(n: int, rng: random.Random, *, rate: float = 4.0) -> list[Arrival]:
    """``n`` requests with Poisson arrivals at ``rate`` per second and conversation-like lengths
    (log-normal, medians near the Mooncake conversation trace's: 7k prompt, 350 output)."""
    out = []
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        prompt = min(int(rng.lognormvariate(math.log(7_000), 1.0)) + 1, 400_000)
        output = min(int(rng.lognormvariate(math.log(350), 0.8)) + 1, 2_000)
        out.append(Arrival(round(t * 1e9), prompt, output))
    return out


def read_trace(path: Path, *, limit: int | None = None) -> list[Arrival]:
    """The requests of a Mooncake (``.jsonl``) or Azure (``.csv``) trace file, in file order."""
    if not path.is_file():
        raise InputNotFound(f"{path}: no such trace file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableFile(f"{path}: cannot read the trace ({exc})") from exc
    out: list[Arrival] = []
    if text.lstrip().startswith("{"):
        for line_no, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out.append(Arrival(int(row["timestamp"]) * 1_000_000, int(row["input_length"]),
                                   int(row["output_length"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise UnreadableFile(f"{path}:{line_no}: not a Mooncake trace row ({exc})") from exc
            if limit is not None and len(out) >= limit:
                break
    else:
        reader = csv.DictReader(text.splitlines())
        start: dt.datetime | None = None
        for line_no, row in enumerate(reader, 2):
            try:
                when = _azure_time(row["TIMESTAMP"])
                start = start or when
                offset = (when - start) // dt.timedelta(microseconds=1) * 1000
                out.append(Arrival(offset, int(row["ContextTokens"]), int(row["GeneratedTokens"])))
            except (ValueError, KeyError, TypeError) as exc:
                raise UnreadableFile(f"{path}:{line_no}: not an Azure trace row ({exc})") from exc
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise UnreadableFile(f"{path}: the trace has no requests")
    return out


def _azure_time(text: str) -> dt.datetime:
    """``2023-11-16 18:17:03.9799600`` (7 fractional digits) as a naive datetime."""
    whole, _, frac = text.strip().partition(".")
    base = dt.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return base + dt.timedelta(microseconds=int((frac + "000000")[:6]))
