"""The SGLang adapters: a server's log output and its request log files, as canonical records.

``adapter.py`` holds the two adapters and the passes over a file. Each line format is a module
with a :class:`~forensics.adapters.base.LineFormat` of its own (``requests.py``, ``timestats.py``,
``mooncake.py``, ``errors.py``, ``config.py``, ``batches.py``), on what they share (``log.py``: the
line prefix, Python reprs, and what a file says, ``Facts``: of its server, its requests, its clock,
its boots and its decode batches); ``formats.py`` lists them in the order a line is offered to
them; ``eras.py`` maps format marks to releases. Both passes run in the calling process:
parallelism is not an adapter's business.
"""

from __future__ import annotations

from forensics.adapters.sglang.adapter import ADAPTERS

__all__ = ["ADAPTERS"]
