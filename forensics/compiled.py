"""The compiled parts (numba) and whether their machine code is cached yet, so that a command can
say what it waits for before a first run compiles them, rather than stay silent."""

from __future__ import annotations

import importlib.util
from pathlib import Path

#: What a first run compiles: a part's name for the terminal, its module, the function whose
#: cached code stands for the module's, and about how long it takes on 2 cores.
PARTS = {
    "reader": ("the reader of plain JSON lines", "forensics.ingestion.fast.jsonlines", "scan", 18),
    "sweep": ("the page sweep", "forensics.exposure.kernel", "walk", 13),
}


def uncached(part: str) -> bool:
    """Whether ``part`` has no machine code cached beside its module that is newer than its source."""
    _, module, function, _ = PARTS[part]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    source = Path(spec.origin)
    index = list((source.parent / "__pycache__").glob(f"{source.stem}.{function}-*.nbi"))
    return not any(i.stat().st_mtime >= source.stat().st_mtime for i in index)


def waits(*parts: str) -> list[str]:
    """A line for each of ``parts`` that a first run will compile here."""
    return [f"compiling {PARTS[p][0]} for this machine, once per install (about {PARTS[p][3]} s)"
            for p in parts if uncached(p)]
