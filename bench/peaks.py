"""Peak resident memory of this process, sampled by a thread, per named part of the work: the
child processes of the memory benchmarks import it (``sys.path`` given the bench folder)."""

from __future__ import annotations

import threading
import time


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


class Peaks:
    """The peak resident memory of each part, from a daemon thread sampling every ``every`` s;
    :attr:`part` names the part the work is in."""

    def __init__(self, first: str, every: float = 0.05) -> None:
        self.part = first
        self.peak: dict[str, int] = {}
        self._every = every
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak[self.part] = max(self.peak.get(self.part, 0), rss())
            time.sleep(self._every)
