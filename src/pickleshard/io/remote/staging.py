"""Bytes of remote objects fetched ahead of their reads, held until a read takes them.

A :class:`~pickleshard.io.remote.source.FsspecSource` prefetch (a batch's ranges, or the ranges
of the next several batches a :class:`~pickleshard.Loader` reads ahead) stages each range here;
the first read that falls inside a staged range takes its bytes and unstages it (a staged range
serves one read: a shuffled epoch reads each sample once). The stage is shared by every thread
and every object of this process (a Loader's reading threads take what its read-ahead thread
fetched), and bounded: at most ``budget`` bytes are held, the oldest dropped first when a new
range would pass it (a dropped range is fetched again by its read). :attr:`StagedRanges.stats`
counts ranges staged, taken (hits), dropped, and bytes held. A forked worker starts empty.

Ranges staged inside :func:`staging_for` (a :class:`~pickleshard.Loader` pass's read-ahead) are
its owner's: :meth:`StagedRanges.release` drops the ones no read took, so a pass left before
its end does not leave its window staged until later fetches push it out.
"""

from __future__ import annotations

import threading
from bisect import bisect_right, insort
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from ..handles import ProcessLocal

__all__ = [
    "STAGE_BYTES",
    "StageOwner",
    "StageStats",
    "StagedRanges",
    "staged_ranges",
    "staging_for",
]

STAGE_BYTES = 512 << 20  # this process's stage holds at most this many bytes


class StageOwner:
    """Who staged a range (a Loader pass's read-ahead); once released, what it stages later (a
    fetch that was under way) is not kept."""

    __slots__ = ("released",)

    def __init__(self) -> None:
        self.released = False


_OWNER: ContextVar[StageOwner | None] = ContextVar("pickleshard_stage_owner", default=None)


@contextmanager
def staging_for(owner: StageOwner) -> Iterator[None]:
    """Ranges staged in this block (this thread or task) are ``owner``'s, for
    :meth:`StagedRanges.release`."""
    token = _OWNER.set(owner)
    try:
        yield
    finally:
        _OWNER.reset(token)


class StageStats:
    """What the stage did in this process: ranges staged, taken by a read, dropped unread
    (the budget, or a newer version of the object), and bytes held now."""

    def __init__(self) -> None:
        self.staged = self.taken = self.dropped = self.held = 0

    def __repr__(self) -> str:
        return (
            f"StageStats(staged={self.staged}, taken={self.taken}, dropped={self.dropped}, "
            f"held={self.held})"
        )


class StagedRanges:
    """Staged ``(key, offset) -> bytes``, ``budget`` bytes at most (see the module).

    ``key`` names one version of one object (its URL and ETag): a rewritten object's staged
    bytes never serve its new version."""

    def __init__(self, budget: int = STAGE_BYTES) -> None:
        self.budget = budget
        self.stats = StageStats()
        self._lock = threading.Lock()
        self._data: dict[tuple[str, int], bytes] = {}  # insertion order: oldest first
        self._starts: dict[str, list[int]] = {}  # per key, the staged offsets, sorted
        self._owners: dict[tuple[str, int], StageOwner] = {}  # a range staged by an owner

    def holds(self, key: str, offset: int, n: int) -> bool:
        """Whether ``[offset, offset + n)`` lies in one staged range of ``key``."""
        with self._lock:
            return self._find(key, offset, offset + n) is not None

    def put(self, key: str, staged: Iterable[tuple[int, bytes]]) -> None:
        """Stage each ``(offset, bytes)`` of ``key``, dropping the oldest past the budget; in
        :func:`staging_for`, as its owner's."""
        owner = _OWNER.get()
        with self._lock:
            if owner is not None and owner.released:
                return  # its reads are over
            for offset, data in staged:
                old = self._data.pop((key, offset), None)
                if old is not None:
                    self.stats.held -= len(old)
                    self._owners.pop((key, offset), None)
                else:
                    insort(self._starts.setdefault(key, []), offset)
                self._data[(key, offset)] = data
                if owner is not None:
                    self._owners[(key, offset)] = owner
                self.stats.held += len(data)
                self.stats.staged += 1
            while self.stats.held > self.budget and self._data:
                self._drop(next(iter(self._data)))

    def take(self, key: str, lo: int, hi: int) -> bytes | None:
        """Bytes ``[lo, hi)`` of ``key`` from the staged range holding them (then unstaged),
        or None where none does."""
        with self._lock:
            start = self._find(key, lo, hi)
            if start is None:
                return None
            data = self._data[(key, start)]
            self._drop((key, start))
            self.stats.dropped -= 1  # taken, not dropped
            self.stats.taken += 1
        return data if (lo, hi) == (start, start + len(data)) else data[lo - start : hi - start]

    def release(self, owner: StageOwner) -> int:
        """Drop the ranges ``owner`` staged that no read took, and keep none it stages later;
        how many were dropped."""
        with self._lock:
            owner.released = True
            mine = [where for where, who in self._owners.items() if who is owner]
            for where in mine:
                self._drop(where)
            return len(mine)

    def clear(self) -> None:
        """Drop everything staged (the counters stay)."""
        with self._lock:
            for where in list(self._data):
                self._drop(where)

    def _find(self, key: str, lo: int, hi: int) -> int | None:
        starts = self._starts.get(key)
        if not starts:
            return None
        k = bisect_right(starts, lo) - 1
        if k < 0:
            return None
        start = starts[k]
        return start if hi <= start + len(self._data[(key, start)]) else None

    def _drop(self, where: tuple[str, int]) -> None:
        data = self._data.pop(where)
        self._owners.pop(where, None)
        self.stats.held -= len(data)
        self.stats.dropped += 1
        starts = self._starts[where[0]]
        del starts[bisect_right(starts, where[1]) - 1]
        if not starts:
            del self._starts[where[0]]


# this process's stage; a forked worker starts with an empty one
_STAGE: ProcessLocal[StagedRanges] = ProcessLocal(StagedRanges)


def staged_ranges() -> StagedRanges:
    """This process's stage (one for every remote object it reads)."""
    return _STAGE.get()
