"""Measure memory as the kernel accounts shared pages: PSS summed over a process tree.

RSS counts a page shared by the main process and its forked DataLoader workers once per process;
PSS divides it among them, so the sum over the tree is what the tree really costs.
"""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Any

__all__ = ["PeakPSS", "tree_pss"]


def _psutil() -> Any:
    try:
        import psutil
    except ImportError:
        raise ImportError(
            "measuring memory needs psutil: pip install 'pickleshard[bench]' (or pip install psutil)"
        ) from None
    return psutil


def tree_pss(pid: int | None = None) -> int:
    """PSS in bytes of process ``pid`` (default: this one) plus all its descendants."""
    psutil = _psutil()
    root = psutil.Process(pid or os.getpid())
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            total += int(proc.memory_full_info().pss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


class PeakPSS:
    """Context manager that samples :func:`tree_pss` every ``interval`` s in a background thread.

    ``start_bytes`` is the tree's PSS on entry, ``peak_bytes`` the largest sample seen.
    """

    def __init__(self, interval: float = 0.05, pid: int | None = None) -> None:
        self.interval = interval
        self.pid = pid or os.getpid()
        self.start_bytes = 0
        self.peak_bytes = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> int:
        value = tree_pss(self.pid)
        self.peak_bytes = max(self.peak_bytes, value)
        self.samples += 1
        return value

    def __enter__(self) -> PeakPSS:
        self.start_bytes = self.sample()
        self._thread = threading.Thread(target=self._run, name="pickleshard-pss", daemon=True)
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
