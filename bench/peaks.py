"""Peak resident memory, sampled: of this process by a thread, per named part of the work (the
child processes of the memory benchmarks import it, ``sys.path`` given the bench folder), and of
a child process with its children (``tree_peak``, for the benchmarks that start them)."""

from __future__ import annotations

import subprocess
import threading
import time

import psutil


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


def tree_peak(process: subprocess.Popen[bytes]) -> int:
    """The peak resident memory of ``process`` and its children, sampled every 50 ms until it ends."""
    peak = 0
    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            peak = max(peak, sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return peak
