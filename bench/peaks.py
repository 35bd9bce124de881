"""Peak resident memory, sampled: of this process by a thread, per named part of the work (the
child processes of the memory benchmarks import it, ``sys.path`` given the bench folder), and of
a child process with its children (``tree_peak``, for the benchmarks that start them; its
samples over time, ``tree_samples``, to split a peak by the phases the child reports)."""

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


def tree_rss() -> int:
    """This process's resident memory and its children's (a replay's workers), in bytes."""
    me = psutil.Process()
    total = rss()
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total


class Peaks:
    """The peak resident memory of each part, this process's and its children's (a replay's
    workers), from a daemon thread sampling every ``every`` s; :attr:`part` names the part the
    work is in."""

    def __init__(self, first: str, every: float = 0.05) -> None:
        self.part = first
        self.peak: dict[str, int] = {}
        self._every = every
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.peak[self.part] = max(self.peak.get(self.part, 0), tree_rss())
            time.sleep(self._every)


def tree_peak(process: subprocess.Popen[bytes]) -> int:
    """The peak resident memory of ``process`` and its children, sampled every 50 ms until it ends."""
    return peak_of(tree_samples(process))


def peak_of(samples: list[tuple[float, int]]) -> int:
    """The largest of ``(time, bytes)`` samples (0 for none)."""
    return max((m for _, m in samples), default=0)


def tree_samples(process: subprocess.Popen[bytes]) -> list[tuple[float, int]]:
    """The resident memory of ``process`` and its children, sampled every 50 ms until it ends:
    ``(time.time(), bytes)`` each."""
    samples = []
    root = psutil.Process(process.pid)
    while process.poll() is None:
        try:
            samples.append((time.time(), sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])))
        except psutil.Error:
            pass
        time.sleep(0.05)
    return samples


def peaks_by_phase(samples: list[tuple[float, int]], start: float, phases: dict[str, float]) -> dict[str, int]:
    """The peak of ``samples`` in each phase, the phases taken one after another from ``start``
    (``time.time()``), each its seconds long; the last runs to the end of the samples."""
    peaks: dict[str, int] = {}
    at = start
    names = list(phases)
    for i, name in enumerate(names):
        end = at + phases[name] if i < len(names) - 1 else float("inf")
        peaks[name] = max((m for t, m in samples if at <= t < end), default=0)
        at = end
    return peaks
