"""SGLang's own logging code, run on our values: what a release's servers print.

:mod:`.release` loads a wheel's source and runs pieces of it with its imports stubbed;
:mod:`.servers` holds the pieces that print a server's lines; :mod:`.run` prints a simulated
log set as a release's servers would have logged it (``kvforensics simulate --sglang-version``).
Each runs in a process of its own: it changes that process's logging and ``sys.modules``.
"""
