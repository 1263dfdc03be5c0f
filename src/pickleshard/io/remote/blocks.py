"""A process-wide LRU of fixed-size blocks of remote objects, bounded by a byte budget.

fsspec's :class:`fsspec.caching.BlockCache` bounds one file's blocks; a dataset has thousands of
files, so the budget here is shared by every remote source of the process: at most
``budget // block_size`` blocks (each ``block_size`` bytes, the last of an object shorter) are
held at once, whatever file they come from. A forked DataLoader worker starts with an empty
cache (its own budget), so memory is at most ``budget`` per process.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["DEFAULT_BLOCK_SIZE", "BlockCache"]

DEFAULT_BLOCK_SIZE = 1 << 20

Key = tuple[str, int]  # (the object's URL and version, the block's number)


@dataclass
class CacheCounters:
    """What the cache did: blocks served from memory, blocks fetched, bytes those held."""

    hits: int = 0
    misses: int = 0
    bytes_fetched: int = 0


class BlockCache:
    """Blocks of remote objects, least recently used out first, ``budget`` bytes in all.

    ``block_size`` is the unit fetched: a read of ``n`` bytes fetches the blocks it touches
    (at most ``n + 2 * block_size`` bytes) that are not held yet, all at once.
    """

    def __init__(self, budget: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1 or budget < block_size:
            raise ValueError(
                f"a block cache needs block_size >= 1 and budget >= block_size, "
                f"got budget={budget}, block_size={block_size}"
            )
        self.budget, self.block_size = budget, block_size
        self.counters = CacheCounters()
        self._blocks: OrderedDict[Key, bytes] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def held(self) -> int:
        """Bytes held now (at most :attr:`budget`)."""
        return self._held

    def read(
        self,
        key: str,
        size: int,
        offset: int,
        n: int,
        fetch: Callable[[Sequence[tuple[int, int]]], list[bytes]],
    ) -> bytes:
        """Bytes ``[offset, offset + n)`` of the ``size``-byte object ``key``, the blocks not
        held fetched by one ``fetch([(lo, hi), ...])`` call (concurrently where it can)."""
        self._forked()
        end = min(offset + n, size)
        if end <= offset:
            return b""
        bs = self.block_size
        numbers = range(offset // bs, (end - 1) // bs + 1)
        with self._lock:
            got = {b: self._blocks.get((key, b)) for b in numbers}
            for b, data in got.items():
                if data is not None:
                    self._blocks.move_to_end((key, b))
        missing = [b for b, data in got.items() if data is None]
        self.counters.hits += len(numbers) - len(missing)
        if missing:
            fetched = fetch([(b * bs, min((b + 1) * bs, size)) for b in missing])
            for b, data in zip(missing, fetched, strict=True):
                got[b] = data
                self._keep((key, b), data)
        joined = b"".join(got[b] or b"" for b in numbers)
        start = offset - numbers[0] * bs
        return joined[start : start + end - offset]

    def _keep(self, key: Key, data: bytes) -> None:
        with self._lock:
            self.counters.misses += 1
            self.counters.bytes_fetched += len(data)
            old = self._blocks.pop(key, None)
            self._held -= len(old) if old is not None else 0
            self._blocks[key] = data
            self._held += len(data)
            while self._held > self.budget:
                _, dropped = self._blocks.popitem(last=False)
                self._held -= len(dropped)

    def clear(self) -> None:
        """Drop every block (counters stay)."""
        with self._lock:
            self._blocks.clear()
            self._held = 0

    def _forked(self) -> None:
        # a forked child starts empty: the parent's blocks would count against its budget twice
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._blocks, self._held, self._pid = OrderedDict(), 0, os.getpid()
            self.counters = CacheCounters()
