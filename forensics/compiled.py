"""The compiled parts (numba): whether their machine code is cached yet, so that a command can say
what it waits for before a first run compiles them; and their interpreted twins, the same source
run as plain Python, for inputs too small to be worth compiling."""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, cast

log = logging.getLogger(__name__)

#: What a first run compiles: a part's name for the terminal, its module, the function whose
#: cached code stands for the module's, and about how long it takes on 2 cores.
PARTS = {
    "reader": ("the reader of plain JSON lines", "forensics.ingestion.fast.jsonlines", "scan", 18),
    "sweep": ("the page sweep", "forensics.exposure.kernel", "walk", 13),
    # the replay's, each where a process first takes it (in a replay's fork server, which no one waits on)
    "steps": ("the replay's decode steps", "replay.steps", "run", 1),
    "page strings": ("the replay's page strings", "replay.pagetext", "runs", 2),
    "ceiling": ("the replay's step-count bound", "replay.ceiling", "ceiling", 7),
    "decode nodes": ("the replay's decode nodes", "replay.decode_kernel", "run", 100),
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


def announce(part: str) -> None:
    """Say (log ``forensics.compiled``, INFO) that ``part`` is about to be compiled, where it will
    be: the command line prints it, so that a first run never waits in silence."""
    for line in waits(part):
        log.info(line)


def taken(calls: Iterator[int], after: int, part: str) -> bool:
    """Whether the call that ``calls`` numbers next takes ``part``'s machine code: a process's first
    ``after`` calls do without it (a small input compiles nothing), the rest take it, and the first
    of those says so where it is still to compile (:func:`announce`)."""
    n = next(calls)
    if n == after + 1:
        announce(part)
    return n > after


#: The name a compiled module's interpreted twin is loaded under (``module`` + this).
TWIN = "__interpreted"


def jit_for(module: str) -> Callable[..., Any]:
    """numba's ``njit`` for ``module``; for its interpreted twin, a decorator that leaves each
    function as it is written, so the same source runs as plain Python with nothing to compile."""
    if not module.endswith(TWIN):
        from numba import njit

        return cast(Callable[..., Any], njit)

    def plain(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda function: function

    return plain


def interpreted(module: str) -> ModuleType:
    """``module``'s interpreted twin: its source loaded again, every compiled function plain Python.
    Cheaper than compiling or even loading the machine code, for inputs too small to gain from it."""
    name = module + TWIN
    if name not in sys.modules:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None
        twin_spec = importlib.util.spec_from_file_location(name, spec.origin)
        assert twin_spec is not None and twin_spec.loader is not None
        twin = importlib.util.module_from_spec(twin_spec)
        sys.modules[name] = twin
        twin_spec.loader.exec_module(twin)
    return sys.modules[name]
