"""What a remote object's fetches cost in this process: requests, bytes and seconds.

:class:`RemoteCounters` is kept by each :class:`~pickleshard.io.remote.source.FsspecSource`;
:func:`remote_fetch_counts` reads it from any source (``{}`` where there is none: a local file's
bytes are ``/proc/self/io``'s to count).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["RemoteCounters", "remote_fetch_counts"]


class RemoteCounters:
    """Requests this source made in this process, the bytes they returned and the seconds
    spent waiting for them (concurrent requests counted once: the wall time of each fetch)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.seconds = 0.0
        self._lock = threading.Lock()  # a prefetch in another thread counts too

    def add(self, requests: int, nbytes: int, seconds: float) -> None:
        """Count one fetch: ``requests`` requests made together, returning ``nbytes``."""
        with self._lock:
            self.requests += requests
            self.bytes += nbytes
            self.seconds += seconds

    def as_json(self) -> dict[str, int | float]:
        """``{"requests", "bytes_fetched", "fetch_seconds"}`` (an index keeps the counts)."""
        return {
            "requests": self.requests,
            "bytes_fetched": self.bytes,
            "fetch_seconds": round(self.seconds, 4),
        }


def remote_fetch_counts(source: Any) -> dict[str, int | float]:
    """What ``source`` fetched in this process (:meth:`RemoteCounters.as_json`) when it is a
    remote object; ``{}`` for any other source."""
    counters = getattr(source, "counters", None)
    return counters.as_json() if isinstance(counters, RemoteCounters) else {}
