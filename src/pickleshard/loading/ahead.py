"""Read-ahead across batches: the next batches' samples fetched together, before their reads.

An object store charges per request (a round trip, and on the client tens of microseconds of
Python in fsspec and aiohttp each: the client tops out near 2,000-3,000 requests/s on one core),
so the way to thousands of samples per second is fewer requests per sample. One batch of a
shuffled epoch hits a file at scattered offsets; the next several batches together hit it
densely enough that many of their samples lie next to one another. :class:`ReadAhead` draws the
sampler's batches in *groups* and, before any batch of a group is read, hands the whole group's
indices to the dataset's ``prefetch`` (:meth:`PickleDataset.prefetch
<pickleshard.PickleDataset.prefetch>`): each remote file's ranges of the group go out in one
concurrent call, neighbours merged within the store's coalescing gap (reading through at most a
set share of extra bytes), and are staged; the batch reads then find their bytes there.

Groups grow ``4, 16, 64, ...`` batches (the first batch waits for little) up to ``group_bytes``
worth of batches (counted at the largest batch seen). While one group is read, the next is
fetched, by one thread of its own, so at most two groups are staged: ``<= 2 * group_bytes``.
A dataset without ``prefetch`` (or ``group_bytes=0``) reads each batch on its own.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["FIRST_GROUP", "GROWTH", "Ahead", "ReadAhead", "after_prefetch"]

FIRST_GROUP = 4  # batches in the first group (the first batch waits for little)
GROWTH = 4  # each next group this many times the last, up to the cap

Ahead = tuple[list[int], Any, "Future[None] | None"]  # indices, sampler state, group fetched


class ReadAhead:
    """The batches of ``drawn`` (``(indices, state)``), each with the future of its group's
    prefetch (None: not read ahead); see the module. ``batch_bytes()`` says what a batch
    weighs so far (0: not known yet)."""

    def __init__(
        self,
        drawn: Iterator[tuple[list[int], Any]],
        prefetch: Callable[[list[int]], Any] | None,
        group_bytes: int,
        batch_bytes: Callable[[], int],
    ) -> None:
        self.drawn, self.prefetch = drawn, prefetch if group_bytes > 0 else None
        self.group_bytes, self.batch_bytes = group_bytes, batch_bytes
        self.queue: deque[tuple[list[int], Any, Future[None] | None, bool]] = deque()
        self.size = FIRST_GROUP
        self.groups = 0  # groups fetched ahead this pass
        self._pool: ThreadPoolExecutor | None = None

    def next(self) -> Ahead | None:
        """The next batch and its group's prefetch, or None at the end of the pass; the first
        batch of a group starts the next group's prefetch."""
        if not self.queue:
            self._draw_group()
        if not self.queue:
            return None
        indices, state, fetched, first = self.queue.popleft()
        if first:
            self._draw_group()
        return indices, state, fetched

    def _draw_group(self) -> None:
        size = self.size if self.prefetch is not None else 1
        group = [d for _, d in zip(range(size), self.drawn, strict=False)]
        if not group:
            return
        fetched = None
        if self.prefetch is not None:
            weight = self.batch_bytes()
            cap = max(1, self.group_bytes // weight) if weight else FIRST_GROUP
            self.size = min(GROWTH * self.size, max(cap, FIRST_GROUP))
            wanted = [i for indices, _ in group for i in indices]
            fetched = self._pool_here().submit(self.prefetch, wanted)
            self.groups += 1
        for k, (indices, state) in enumerate(group):
            self.queue.append((indices, state, fetched, k == 0))

    def _pool_here(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="pickleshard-ahead")
        return self._pool

    def close(self) -> None:
        """Drop the groups drawn and not handed out; stop the prefetch thread."""
        for _, _, fetched, _ in self.queue:
            if fetched is not None:
                fetched.cancel()
        self.queue.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def after_prefetch(fetched: Future[None] | None, make: Callable[[list[int]], Any]) -> Any:
    """``make`` run once ``fetched`` (a group's prefetch) is done: what a reading thread runs.
    A failed prefetch is not this batch's error: its own read fetches what it misses and
    raises the error naming the sample."""

    def run(indices: list[int]) -> Any:
        if fetched is not None:
            with contextlib.suppress(Exception):
                fetched.result()
        return make(indices)

    return run
