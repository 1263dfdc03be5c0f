"""What a request to one store costs, as this process has measured it: first-byte latency and
bandwidth, and from them the gap worth reading through rather than making a second request.

Object stores charge per round trip: S3's first byte takes tens of milliseconds, in which one
stream delivers megabytes. Two ranges ``g`` bytes apart are cheaper fetched as one when
``g / bandwidth`` is less than a round trip, i.e. ``g < latency * bandwidth``
(:meth:`LinkEstimate.gap`). The estimate learns from every fetch a
:class:`~pickleshard.io.remote.source.FsspecSource` makes (:meth:`LinkEstimate.observe`): the
fastest recent small fetch is the latency (queueing only ever adds), the fastest recent large
one, less that latency, the bandwidth. Until they are measured, the latency is taken as
:data:`ASSUMED_LATENCY` and the bandwidth as :data:`ASSUMED_BANDWIDTH` (an S3 stream's order).

The gap is capped at :data:`MAX_GAP`: over a fast link ``latency * bandwidth`` is megabytes, and
a scan that read through gaps that wide would fetch every byte of a file of 150 KB samples to
save requests it can make concurrently anyway. Below the cap (and above :data:`MIN_GAP`, a
page) the measured link decides. One estimate is kept per store (scheme and host) per process:
the files of a dataset share it, a forked worker measures its own.
"""

from __future__ import annotations

import threading
from collections import deque
from urllib.parse import urlsplit

from ..handles import ProcessLocal

__all__ = [
    "ASSUMED_BANDWIDTH",
    "ASSUMED_LATENCY",
    "MAX_GAP",
    "MIN_GAP",
    "LinkEstimate",
    "link_for",
]

ASSUMED_LATENCY = 0.02  # seconds to the first byte, until measured (object stores: 10-100 ms)
ASSUMED_BANDWIDTH = 100e6  # bytes/s, until measured (one S3 stream's order)
MIN_GAP = 4096  # the gap is at least a page (reading a page through costs nothing extra)
MAX_GAP = 64 << 10  # and at most this: a file of 150 KB samples stays sparse
SMALL = 64 << 10  # a fetch of at most this per request measures latency
LARGE = 1 << 20  # a fetch of at least this measures bandwidth
RECENT = 32  # observations kept of each kind (the link may change: old ones age out)


class LinkEstimate:
    """Latency and bandwidth of one store, learnt from fetches (see the module docstring)."""

    def __init__(self) -> None:
        self._latencies: deque[float] = deque(maxlen=RECENT)
        self._rates: deque[float] = deque(maxlen=RECENT)
        self._lock = threading.Lock()

    def observe(self, requests: int, nbytes: int, seconds: float) -> None:
        """One fetch: ``requests`` concurrent requests returned ``nbytes`` in ``seconds``."""
        if requests <= 0 or seconds <= 0:
            return
        with self._lock:
            if nbytes <= SMALL * requests:  # the transfer is noise: the wait was the latency
                self._latencies.append(seconds)
            elif nbytes >= LARGE:
                wait = min(self._latencies, default=0.0)
                self._rates.append(nbytes / max(seconds - wait, seconds / 10))

    @property
    def latency(self) -> float:
        """Seconds to a small response (the fastest recent one), or :data:`ASSUMED_LATENCY`."""
        with self._lock:
            return min(self._latencies, default=ASSUMED_LATENCY)

    @property
    def bandwidth(self) -> float:
        """Bytes per second of a large fetch (the fastest recent), or
        :data:`ASSUMED_BANDWIDTH`."""
        with self._lock:
            return max(self._rates, default=ASSUMED_BANDWIDTH)

    def gap(self) -> int:
        """Bytes worth one round trip, ``latency * bandwidth``, within
        ``[MIN_GAP, MAX_GAP]``."""
        return max(MIN_GAP, min(MAX_GAP, int(self.latency * self.bandwidth)))

    def __repr__(self) -> str:
        return f"LinkEstimate(latency={self.latency:.4f} s, bandwidth={self.bandwidth:.3g} B/s)"


# this process's estimates, by store ("s3://bucket", "http://host:port"); a forked child starts anew
_LINKS: ProcessLocal[dict[str, LinkEstimate]] = ProcessLocal(dict)
_LINKS_LOCK = threading.Lock()


def link_for(url: str) -> LinkEstimate:
    """This process's estimate for the store ``url`` lives in (its scheme and host)."""
    parts = urlsplit(url)
    key = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
    with _LINKS_LOCK:
        held = _LINKS.get()
        if key not in held:
            if len(held) > 256:  # stores no source uses any more
                held.clear()
            held[key] = LinkEstimate()
        return held[key]
