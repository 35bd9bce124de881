"""Static charts for the report: matplotlib SVG, made deterministic, embedded as data URIs."""

from __future__ import annotations

import base64
import datetime as dt
import io
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

_STYLE: Any = {
    "svg.hashsalt": "kvforensics",  # stable element ids
    "svg.fonttype": "path",  # no font lookups when the file is viewed
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


def _data_uri(fig: Figure) -> str:
    buf = io.BytesIO()
    with plt.rc_context(_STYLE):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


#: Points a chart draws as vector marks; past it, a point layer is a raster image inside the
#: SVG, so that the report's size does not grow with the case.
VECTOR_POINTS = 2_000


def _time_format(times: list[dt.datetime]) -> mdates.DateFormatter:
    """Hours and minutes, with seconds when the span is short."""
    span = (max(times) - min(times)).total_seconds() if times else 0
    return mdates.DateFormatter("%H:%M" if span > 3600 else "%H:%M:%S", tz=dt.UTC)


def exposures_over_time(points: list[tuple[dt.datetime, int]]) -> str | None:
    """Cumulative exposed responses against the time each first saw another request's content."""
    if not points:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 2.6))
        total = 0
        xs, ys = [], []
        for t, n in points:
            total += n
            xs.append(t)
            ys.append(total)
        when = mdates.date2num(xs)
        many = len(ys) > VECTOR_POINTS
        ax.step(when, ys, where="post", color="#b3261e", rasterized=many)
        ax.plot(when, ys, "o", ms=3, color="#b3261e", rasterized=many)
        ax.set_ylabel("exposed responses (cumulative)")
        xs_all = xs
        ax.xaxis.set_major_formatter(_time_format(xs_all))
        ax.set_xlabel("first exposure (UTC)")
        ax.grid(axis="y", alpha=0.3)
        return _data_uri(fig)


def prompts_against_limit(points: list[tuple[dt.datetime, int, bool]], limit: int | None,
                          context: int | None, every: int = 1) -> str | None:
    """Prompt lengths over time, the prefill admission limit and the context window (``every``:
    the points hold 1 in that many of the prompts of unexposed responses within the limit)."""
    if not points:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = plt.subplots(figsize=(7.5, 2.8))
        plain = [(t, n) for t, n, exposed in points if not exposed]
        hit = [(t, n) for t, n, exposed in points if exposed]
        if plain:
            ax.scatter(mdates.date2num([t for t, _ in plain]), [n for _, n in plain], s=4, color="#7a869a",
                       label="prompts" if every == 1 else f"prompts (1 in {every:,} within the limit)",
                       rasterized=len(plain) > VECTOR_POINTS)
        if hit:
            ax.scatter(mdates.date2num([t for t, _ in hit]), [n for _, n in hit], s=14, color="#b3261e",
                       label="prompts of exposed responses", rasterized=len(hit) > VECTOR_POINTS)
        if limit is not None:
            ax.axhline(limit, color="#e8a33d", lw=1.2, label=f"prefill rejects {limit:,} tokens or more")
        if context is not None:
            ax.axhline(context, color="#333333", lw=1, ls="--", label=f"context window {context:,}")
        ax.set_yscale("log")
        ax.set_ylabel("prompt tokens")
        xs_all = [t for t, _, _ in points]
        ax.xaxis.set_major_formatter(_time_format(xs_all))
        ax.set_xlabel("arrival (UTC)")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        return _data_uri(fig)
