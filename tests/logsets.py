"""Log-set transforms the tests use to check that the analysis's answers do not depend on layout."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def scale_pages(records: Iterable[dict[str, Any]], factor: int) -> list[dict[str, Any]]:
    """The same log with every page split into ``factor`` pages (page_size divided by it)."""
    out = []
    for r in records:
        r = dict(r)
        if r["kind"] == "config":
            r["pool_pages"] *= factor
            r["page_size"] = max(1, r["page_size"] // factor)
        if r["kind"] == "kv":
            parts = []
            for part in r["pages"].split(","):
                lo, _, hi = part.partition("-")
                parts.append(f"{int(lo) * factor}-{(int(hi or lo) + 1) * factor - 1}")
            r["pages"] = ",".join(parts)
        out.append(r)
    return out
