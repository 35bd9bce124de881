"""Which SGLang releases print what: a file's format marks as a range of releases.

SGLang does not log its version. What a file shows of its formats narrows it down: each mark
below holds for the releases listed, read from the source of every release wheel from 0.5.5
to 0.5.23 (``scripts/make_sglang_fixtures.py`` prints the fixtures of ten of them; the table in
``docs/adapters.md`` has each cell's fixture). A file's era is the releases every mark it shows
holds for: ``0.5.12-0.5.15``; the upper end is the newest release checked, not a promise about
later ones.
"""

from __future__ import annotations

from collections.abc import Iterable

#: The releases checked, oldest first (post releases print as their release).
RELEASES = tuple(f"0.5.{n}" for n in range(5, 24))


def _span(first: str, last: str = RELEASES[-1]) -> frozenset[str]:
    i, j = RELEASES.index(first), RELEASES.index(last)
    return frozenset(RELEASES[i:j + 1])


#: Format mark -> the releases that print it.
MARKS: dict[str, frozenset[str]] = {
    "time_stats.old_head": _span("0.5.5", "0.5.11"),  # Req Time Stats(... input len=...)
    "time_stats.new_head": _span("0.5.12"),  # ReqTimeStats(... input_len=..., cached_input_len=...)
    "time_stats.no_attempts": _span("0.5.12", "0.5.15"),
    "time_stats.attempts": _span("0.5.16"),
    "time_stats.retries": _span("0.5.8", "0.5.15"),  # #retries= on prefill
    "time_stats.no_transfer_speed": _span("0.5.5", "0.5.6"),  # prefill stats without transfer_speed
    "time_stats.transfer_speed": _span("0.5.7"),
    "server_args.repr": _span("0.5.5", "0.5.18"),  # server_args=ServerArgs(...)
    "server_args.dict": _span("0.5.19"),  # server_args={...}
    "request.text.bare": _span("0.5.8", "0.5.11"),  # Receive: obj=... with no time
    "request.text.prefixed": _span("0.5.5", "0.5.7") | _span("0.5.12"),
    "request.json.bare": _span("0.5.7", "0.5.11"),  # {"timestamp": ..., "event": "request.received"}
    "request.json.prefixed": _span("0.5.12"),  # [time] {"timestamp": ...}
    "integrity.bootstrap_room_mismatch": _span("0.5.9"),
    "integrity.kv_checksum_mismatch": _span("0.5.21"),
    "pool_warning": _span("0.5.23"),
}

#: From this release a prompt rejected by ``validate_input_length`` is retired at the prefill
#: bootstrap queue (``PrefillBootstrapQueue.add`` -> ``retire_unadmitted_request``) and never
#: sent. The 0.5.21 wheel already does (``disaggregation/prefill.py``); reference-engine.md
#: says 0.5.22. docs/adapters.md lists the disagreement.
RETIRES_FROM = "0.5.21"


def era(marks: Iterable[str]) -> str | None:
    """The releases whose formats all the marks are: ``0.5.12-0.5.15``, a list where they are not
    contiguous, ``none of 0.5.5-0.5.23`` where they contradict; None where no mark is known."""
    known = [MARKS[m] for m in marks if m in MARKS]
    if not known:
        return None
    releases = frozenset.intersection(*known)
    if not releases:
        return f"none of {RELEASES[0]}-{RELEASES[-1]}"
    return span_text(releases)


def span_text(releases: Iterable[str]) -> str:
    """Releases as ranges: ``0.5.5-0.5.7,0.5.12-0.5.23``."""
    indexes = sorted(RELEASES.index(r) for r in releases)
    runs: list[list[int]] = []
    for i in indexes:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(RELEASES[r[0]] if len(r) == 1 else f"{RELEASES[r[0]]}-{RELEASES[r[-1]]}" for r in runs)


def releases_of(text: str) -> frozenset[str] | None:
    """The releases an ``engine_version`` names (``0.5.21``, ``0.5.12-0.5.15``, a list of those);
    None for anything else."""
    out: set[str] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        if first not in RELEASES or (last and last not in RELEASES):
            return None
        out |= _span(first, last or first)
    return frozenset(out)
