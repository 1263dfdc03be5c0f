"""Decoded units (a bz2 block, an xz block, a zstd frame) kept for the reads that follow.

A compressed file read at random is decoded a unit at a time: the smallest piece its format can
start decoding at. Span reads come in small ranges (a sample's framing, then its payload, then
the next sample, often in the same unit), and decoding a 900 KB bz2 block costs ~100 ms, so
every read of a unit after the first must come from memory. :class:`UnitCache` is one LRU per
process, shared by its compressed sources, bounded by ``budget`` bytes (the sum of the units it
holds; a unit over half the budget is never kept, so it is read straight from the decoder each
time). Keys carry the compressed file's identity, so a rewritten file never meets its old units.
``hits`` and ``misses`` count unit lookups.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["UNIT_CACHE_BYTES", "UnitCache", "unit_cache"]

UNIT_CACHE_BYTES = 64 << 20


class UnitCache:
    """At most ``budget`` bytes of decoded units, least recently used dropped first."""

    def __init__(self, budget: int = UNIT_CACHE_BYTES) -> None:
        self.budget = budget
        self.held = 0
        self.hits = 0
        self.misses = 0
        self._units: OrderedDict[Hashable, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, decode: Callable[[], bytes]) -> bytes:
        """The unit ``key``, decoded by ``decode()`` when it is not held."""
        with self._lock:
            data = self._units.get(key)
            if data is not None:
                self._units.move_to_end(key)
                self.hits += 1
                return data
            self.misses += 1
        data = decode()
        if len(data) * 2 <= self.budget:
            with self._lock:
                if key not in self._units:
                    self._units[key] = data
                    self.held += len(data)
                while self.held > self.budget:
                    _, old = self._units.popitem(last=False)
                    self.held -= len(old)
        return data

    def clear(self) -> None:
        with self._lock:
            self._units.clear()
            self.held = 0


_CACHE = UnitCache()


def unit_cache() -> UnitCache:
    """This process's cache of decoded units."""
    return _CACHE
