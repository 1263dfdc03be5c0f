"""A process-wide LRU of fixed-size blocks of remote objects, bounded by a byte budget.

fsspec's :class:`fsspec.caching.BlockCache` bounds one file's blocks; a dataset has thousands of
files, so the budget here is shared by every remote source that holds this cache: at most
``budget // block_size`` blocks (each ``block_size`` bytes, the last of an object shorter) are
held at once, whatever file they come from. The blocks live in a
:class:`~pickleshard.io.lru.BudgetCache` of this process: a forked DataLoader worker starts with
an empty one (its own budget, counters from zero), so memory is at most ``budget`` per process.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ..handles import ProcessLocal
from ..lru import BudgetCache, CacheStats

__all__ = ["DEFAULT_BLOCK_SIZE", "BlockCache"]

DEFAULT_BLOCK_SIZE = 1 << 20

Key = tuple[str, int]  # (the object's URL and version, the block's number)


class BlockCache:
    """Blocks of remote objects, least recently used out first, ``budget`` bytes in all.

    ``block_size`` is the unit fetched: a read of ``n`` bytes fetches the blocks it touches
    (at most ``n + 2 * block_size`` bytes) that are not held yet, all at once. :attr:`stats`
    counts blocks found (hits) and not (misses), blocks fetched (loads) and their bytes
    (``bytes_loaded``), evictions, and bytes held.
    """

    def __init__(self, budget: int, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size < 1 or budget < block_size:
            raise ValueError(
                f"a block cache needs block_size >= 1 and budget >= block_size, "
                f"got budget={budget}, block_size={block_size}"
            )
        self.budget, self.block_size = budget, block_size
        self._blocks: ProcessLocal[BudgetCache[Key, bytes]] = ProcessLocal(
            functools.partial(BudgetCache, budget)
        )

    @property
    def stats(self) -> CacheStats:
        """This process's counters."""
        return self._blocks.get().stats

    @property
    def held(self) -> int:
        """Bytes held now (at most :attr:`budget`)."""
        return self._blocks.get().stats.bytes_used

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
        end = min(offset + n, size)
        if end <= offset:
            return b""
        bs = self.block_size
        numbers = range(offset // bs, (end - 1) // bs + 1)
        blocks = self._blocks.get()
        with blocks.lock:  # not across the fetch: other threads read held blocks meanwhile
            got = {b: blocks.get((key, b)) for b in numbers}
        missing = [b for b, data in got.items() if data is None]
        if missing:
            fetched = fetch([(b * bs, min((b + 1) * bs, size)) for b in missing])
            with blocks.lock:
                for b, data in zip(missing, fetched, strict=True):
                    got[b] = data
                    if data:  # an object cut short since its size was read: nothing to keep
                        blocks.put((key, b), data, len(data))
        joined = b"".join(got[b] or b"" for b in numbers)
        start = offset - numbers[0] * bs
        return joined[start : start + end - offset]

    def clear(self) -> None:
        """Drop every block (counters stay)."""
        blocks = self._blocks.get()
        with blocks.lock:
            blocks.clear()
