"""Bytes this process has asked its stores for and not yet received, bounded.

A download (a dense file's scan, a whole-file load) requests several large windows at once;
an index build downloads several files at once (one thread each). Each batch of windows holds
its bytes here (:meth:`InFlightBytes.hold`) from its request until it is copied into place, and
waits while the others hold the budget: memory in flight stays under :data:`IN_FLIGHT_BYTES`
however many files are fetched together (a batch larger than the budget goes out alone).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..handles import ProcessLocal

__all__ = ["IN_FLIGHT_BYTES", "InFlightBytes", "in_flight_bytes"]

IN_FLIGHT_BYTES = 128 << 20  # this process's downloads hold at most this much in flight


class InFlightBytes:
    """A byte budget shared by threads: :meth:`hold` waits until ``n`` more bytes fit
    (or nothing else is held), holds them for the ``with`` block; :attr:`held` and
    :attr:`peak` count them."""

    def __init__(self, budget: int = IN_FLIGHT_BYTES) -> None:
        self.budget = budget
        self.held = self.peak = 0
        self._free = threading.Condition()

    @contextmanager
    def hold(self, n: int) -> Iterator[None]:
        with self._free:
            self._free.wait_for(lambda: self.held == 0 or self.held + n <= self.budget)
            self.held += n
            self.peak = max(self.peak, self.held)
        try:
            yield
        finally:
            with self._free:
                self.held -= n
                self._free.notify_all()


# this process's budget; a forked child starts with its own
_IN_FLIGHT: ProcessLocal[InFlightBytes] = ProcessLocal(InFlightBytes)
_LOCK = threading.Lock()


def in_flight_bytes() -> InFlightBytes:
    """This process's budget of bytes in flight (one for every download it makes)."""
    with _LOCK:
        return _IN_FLIGHT.get()
