"""What the fork server runs before it forks a replay's workers (replay/nodes.py): the machine code of
the engine's compiled kernels loaded (replay/steps.py, replay/pagetext.py, replay/ceiling.py), and
taken from a worker's first call on. Each worker forked after has it: loading it from numba's cache
cost each worker about a third of a second of a 25,000-request replay's 6 s (compiling it, where nothing is cached yet,
happens here once, while the replay plans its requests). Imported nowhere else: a replay in one
process, a small one, compiles nothing."""

from __future__ import annotations

from replay import decode_fast, engine, pagetext, schedule

engine.load_kernel()
pagetext.load_kernel()
schedule.load_kernel()
decode_fast.load_kernel()
