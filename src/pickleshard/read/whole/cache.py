"""The whole-file cache and its byte budget: ``CacheBudget``, ``WholeFileCache``, ``estimate_nbytes``.

One :class:`CacheBudget` says how many bytes of decoded files a dataset may hold in memory, how
that total is shared among DataLoader workers, and how a decoded file is sized. The
:class:`WholeFileCache` of each process enforces its share (a
:class:`~pickleshard.io.lru.BudgetCache`, counting what it does in the
:class:`~pickleshard.io.lru.CacheStats` every cache reports);
:class:`pickleshard.BlockShuffleSampler` plans its windows with the same share, so that a
worker's window of files fits its cache and each file loads once per epoch.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...io.handles import ProcessLocal
from ...io.lru import BudgetCache, CacheStats, Eviction, LeastRecentlyUsed
from ...scan.layouts import DecodedLayout

__all__ = ["CacheBudget", "WholeFileCache", "estimate_nbytes"]

_SAMPLE = 64
_ARRAY_HEADER = 112


def estimate_nbytes(obj: object) -> int:
    """Estimate the memory an unpickled object holds, in bytes.

    Arrays count their ``nbytes`` plus the object header; containers count themselves and their
    items, extrapolating from the first 64 items when there are more, six levels deep. An
    object reached twice (a pickle's memo makes shared references) counts once, so the walk
    visits each object at most once: a few hundred bytes of pickle that nest one list 64 times
    per level cannot make it walk 64**6 paths. An estimate, not a measurement: it bounds the
    cache's accounting, not the allocator's.
    """
    return _estimate(obj, 0, set())


def _estimate(obj: object, depth: int, seen: set[int]) -> int:
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        # getsizeof leaves out data the array does not own (protocol 5 arrays view a buffer).
        return obj.nbytes + _ARRAY_HEADER
    if depth > 6:
        return sys.getsizeof(obj)
    if isinstance(obj, (list, tuple)):
        n = len(obj)
        head = obj[:_SAMPLE]
        items = sum(_estimate(v, depth + 1, seen) for v in head)
        if n > len(head):
            items = items * n // len(head)
        return sys.getsizeof(obj) + items
    if isinstance(obj, dict):
        keys = list(obj)[:_SAMPLE]
        items = sum(
            _estimate(k, depth + 1, seen) + _estimate(obj[k], depth + 1, seen) for k in keys
        )
        if len(obj) > len(keys):
            items = items * len(obj) // len(keys)
        return sys.getsizeof(obj) + items
    return sys.getsizeof(obj)


def _worker_count() -> int:
    """Number of DataLoader workers when called inside one, else 1 (torch imported only if loaded)."""
    data = sys.modules.get("torch.utils.data")
    if data is None:
        return 1
    info = data.get_worker_info()
    return 1 if info is None else int(info.num_workers)


@dataclass(frozen=True)
class CacheBudget:
    """``total_bytes`` of decoded files held in memory, in total across DataLoader workers.

    Each of ``W`` worker processes (``W = 0``: the main process alone, counted as one) gets

        ``share(W) = total_bytes // max(1, W)``

    and its :class:`WholeFileCache` holds at most that much, except that a single file larger
    than the share is still held alone while it is the most recent: resident bytes per process
    ``<= max(share(W), largest file)``, so the tree holds ``<= W * max(share(W), largest file)``.

    A decoded file's size (:meth:`size_of`) is what the index recorded for it
    (``decoded_nbytes``, itself :func:`estimate_nbytes` of the columns at index time), or
    :func:`estimate_nbytes` of its columns when nothing was recorded.
    """

    total_bytes: int

    def __post_init__(self) -> None:
        if self.total_bytes < 0:
            raise ValueError(f"cache_bytes must be >= 0, got {self.total_bytes}")

    def share(self, num_workers: int) -> int:
        """The bytes each of ``num_workers`` workers may hold (see the class docstring)."""
        return self.total_bytes // max(1, num_workers)

    def share_here(self) -> int:
        """:meth:`share` for this process: its DataLoader's worker count inside a worker, else 1."""
        return self.share(_worker_count())

    @staticmethod
    def size_of(decoded: DecodedLayout, recorded_nbytes: int = 0) -> int:
        """The bytes ``decoded`` counts against a budget: ``recorded_nbytes`` when known (> 0)."""
        return recorded_nbytes or estimate_nbytes(decoded.columns)


class WholeFileCache:
    """Decoded files bounded by ``max_bytes`` (a process's :meth:`CacheBudget.share`).

    A :class:`~pickleshard.io.lru.BudgetCache` of decoded size (:meth:`CacheBudget.size_of`),
    least recently used out first unless ``eviction`` names another policy: resident bytes
    ``<= max(max_bytes, largest file)``, a single file larger than the budget held alone while
    it is the most recent. Before loading a file whose expected size is known, entries are
    evicted first, so the budget holds during the load too. :attr:`stats` counts hits, misses,
    loads (files actually unpickled), evictions and bytes held (now and at the peak).

    One cache per process: a forked child (DataLoader worker) starts empty instead of touching
    the parent's objects, which would copy their pages. A worker's loader maps entries shared
    by all workers (:mod:`pickleshard.read.whole.mapped`), so its share bounds what it maps, not
    a copy of its own. Thread-safe: a load holds the cache's lock, so one thread loads a file.
    """

    def __init__(
        self,
        max_bytes: int,
        loader: Callable[[str], DecodedLayout],
        eviction: Callable[[], Eviction[str]] = LeastRecentlyUsed,
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._loader = loader
        self._entries: ProcessLocal[BudgetCache[str, DecodedLayout]] = ProcessLocal(
            functools.partial(BudgetCache, max_bytes, eviction=eviction)
        )

    @property
    def stats(self) -> CacheStats:
        """This process's counters."""
        return self._entries.get().stats

    def get(self, path: str, expected_nbytes: int = 0) -> DecodedLayout:
        """Return the decoded file at ``path``, loading it (and evicting LRU entries) on a miss."""
        entries = self._entries.get()
        with entries.lock:
            decoded = entries.get(path)
            if decoded is not None:
                return decoded
            entries.make_room(expected_nbytes)
            decoded = self._loader(path)
            entries.put(path, decoded, CacheBudget.size_of(decoded, expected_nbytes))
            return decoded

    def clear(self) -> None:
        entries = self._entries.get()
        with entries.lock:
            entries.clear()

    def __len__(self) -> int:
        return len(self._entries.get())
