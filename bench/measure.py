"""Wall time, and the memory of a process tree (a process and all its descendants).

Two sums over the tree, both taken from one ``memory_full_info()`` per process:

- ``pss``: PSS (proportional set size) summed. PSS divides each shared page among the processes
  that map it, so a page a forked DataLoader worker shares with its parent counts once in the
  sum, where RSS would count it once per process. But the division runs over *every* process of
  the machine: another process mapping the same libraries (any other Python that imports torch)
  lowers this tree's PSS.
- ``alone``: RSS of the root plus USS (private pages) of each descendant: what the tree would
  cost if it ran alone on the machine, whatever else runs. Pages a worker inherited and never
  wrote stay shared with the root and count once, in the root's RSS.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from types import TracebackType

import psutil

__all__ = ["MiB", "PeakTreeMemory", "Stopwatch", "TreeMemory", "tree_memory"]

MiB = 1 << 20


@dataclass(frozen=True)
class TreeMemory:
    """Bytes: PSS summed over the tree, and root RSS + descendants' USS (see module docstring)."""

    pss: int
    alone: int


def tree_memory(pid: int | None = None) -> TreeMemory:
    """Memory of process ``pid`` (default: this one) plus all its descendants."""
    root = psutil.Process(os.getpid() if pid is None else pid)
    pss = alone = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a worker that exited between the listing and the read
        pss += int(info.pss)
        alone += int(info.rss if proc.pid == root.pid else info.uss)
    return TreeMemory(pss=pss, alone=alone)


class PeakTreeMemory:
    """While entered, a daemon thread samples :func:`tree_memory` every ``interval`` seconds.

    ``start`` is the tree's memory on entry; ``peak_pss`` and ``peak_alone`` the largest samples
    (entry and exit included; each its own maximum); ``samples`` how many were taken. A peak
    shorter than ``interval`` can be missed: the figures are lower bounds of the true peaks.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self.start = TreeMemory(0, 0)
        self.peak_pss = 0
        self.peak_alone = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> TreeMemory:
        value = tree_memory()
        self.peak_pss = max(self.peak_pss, value.pss)
        self.peak_alone = max(self.peak_alone, value.alone)
        self.samples += 1
        return value

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> PeakTreeMemory:
        self.start = self.sample()
        self._thread = threading.Thread(target=self._run, name="bench-memory", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()


class Stopwatch:
    """``with Stopwatch() as t: ...`` then ``t.seconds`` (``time.perf_counter``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.seconds = time.perf_counter() - self._t0
