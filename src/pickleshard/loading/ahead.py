"""Read-ahead over a window of batches: each fetch asks for one chunk of the window's batches,
plus the window's later samples lying between them, so a sample costs a fraction of a request.

An object store charges per request (a round trip, and on the client tens of microseconds of
Python in fsspec and aiohttp each: the client tops out near 2,000-3,000 requests/s on one core),
so the way to thousands of samples per second is fewer requests per sample. One batch of a
shuffled epoch hits a file at scattered offsets; the samples of the next *window* of batches
together hit it densely. :class:`ReadAhead` keeps a window of the sampler's next batches drawn
(``window_bytes`` worth, counted at the largest batch seen) and plans it one *chunk* at a time,
ahead of the reads: a chunk's fetch asks the dataset's ``prefetch`` (:meth:`PickleDataset.prefetch
<pickleshard.PickleDataset.prefetch>`) for the chunk's samples not fetched yet and *pulls
forward* the window's later samples that lie between them (numbered next to them: samples are
numbered in file and offset order), so the gap between two of the chunk's ranges is bytes
the window needs anyway instead of bytes read through and thrown away. The source then merges
neighbours within its coalescing gap under its overread budget (:meth:`FsspecSource.prefetch
<pickleshard.io.remote.source.FsspecSource.prefetch>`) and stages the ranges for the batch reads,
which wait for every fetch that claimed one of their samples.

The window is kept full: each batch handed out draws the next one into it, and chunks are
planned while less than half the window is planned (chunks of ``4, 8, 16, ...`` batches up to a
quarter of the window: the first batch waits for little, later fetches overlap). A sample is
fetched by one chunk only (the first that claims it), and only samples of drawn batches are
claimed, so the stage holds ``<= window_bytes`` (plus one fetch's blocks while they are cut).
A dataset without ``prefetch`` (or ``window_bytes=0``) reads each batch on its own.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..io.remote.staging import StageOwner, staged_ranges, staging_for

__all__ = [
    "FETCH_THREADS",
    "FIRST_CHUNK",
    "MAX_GAP",
    "PULL",
    "Ahead",
    "ReadAhead",
    "after_prefetch",
    "pulled_forward",
]

FIRST_CHUNK = 4  # batches in the first chunk (the first batch waits for little)
CHUNKS_PER_WINDOW = 4  # a chunk is at most this share of the window, so fetches overlap
MAX_GAP = 32  # samples between two of a chunk's that may be pulled forward to fill the gap
PULL = 4  # a chunk pulls forward at most this many samples per sample of its own
FETCH_THREADS = 2  # chunks fetched at once (the next starts while the last one's tail arrives)

Ahead = tuple[list[int], Any, tuple["Future[None]", ...]]  # indices, state, fetches to wait on


class _Slot:
    """A drawn batch in the window: its indices, the sampler's state after it, the fetches
    that claimed its samples."""

    __slots__ = ("fetches", "indices", "state")

    def __init__(self, indices: list[int], state: Any) -> None:
        self.indices, self.state = indices, state
        self.fetches: list[Future[None]] = []


def pulled_forward(
    chunk: Sequence[int], later: Callable[[int], bool], budget: int, max_gap: int = MAX_GAP
) -> list[int]:
    """Samples between two of ``chunk``'s (sorted, distinct) that ``later`` says the window
    holds unclaimed, narrowest gaps first (fewest numbers not claimable, then fewest samples),
    at most ``budget`` of them; gaps wider than ``max_gap`` samples are left alone."""
    gaps: list[tuple[int, int, list[int]]] = []
    for a, b in itertools.pairwise(chunk):
        if 1 < b - a <= max_gap + 1:
            inside = [j for j in range(a + 1, b) if later(j)]
            if inside:
                gaps.append((b - a - 1 - len(inside), len(inside), inside))
    gaps.sort(key=lambda g: (g[0], g[1]))
    pulled: list[int] = []
    for _, n, inside in gaps:
        if n <= budget:
            pulled += inside
            budget -= n
    return pulled


class ReadAhead:
    """The batches of ``drawn`` (``(indices, state)``), each with the fetches to wait on
    before its read (empty: not read ahead); see the module. ``batch_bytes()`` says what a
    batch weighs so far (0: not known yet)."""

    def __init__(
        self,
        drawn: Iterator[tuple[list[int], Any]],
        prefetch: Callable[[list[int]], Any] | None,
        window_bytes: int,
        batch_bytes: Callable[[], int],
    ) -> None:
        self.drawn, self.prefetch = drawn, prefetch if window_bytes > 0 else None
        self.window_bytes, self.batch_bytes = window_bytes, batch_bytes
        self.window: deque[_Slot] = deque()  # drawn, not handed out; the first `planned` planned
        self.planned = 0
        self.unclaimed: dict[int, _Slot] = {}  # sample -> its batch, drawn and not fetched
        self.chunk = FIRST_CHUNK
        self.chunks = 0  # fetches planned this pass
        self.pulled = 0  # samples pulled forward into an earlier chunk's fetch
        self.exhausted = False
        self._pool: ThreadPoolExecutor | None = None
        self._owner = StageOwner()  # what the fetches stage is this pass's (released at close)

    def next(self) -> Ahead | None:
        """The next batch and the fetches of its samples, or None at the end of the pass."""
        if self.prefetch is None:
            got = next(self.drawn, None)
            return None if got is None else (got[0], got[1], ())
        self._top_up()
        if not self.window:
            return None
        slot = self.window.popleft()
        self.planned -= 1
        self._top_up()  # the window slid by one batch: refill and plan it now
        return slot.indices, slot.state, tuple(slot.fetches)

    def capacity(self) -> int:
        """The window, in batches: ``window_bytes`` at the largest batch seen so far."""
        weight = self.batch_bytes()
        if not weight:
            return 2 * FIRST_CHUNK
        return max(2 * FIRST_CHUNK, self.window_bytes // weight)

    def _top_up(self) -> None:
        cap = self.capacity()
        while not self.exhausted and len(self.window) < cap:
            got = next(self.drawn, None)
            if got is None:
                self.exhausted = True
                break
            slot = _Slot(*got)
            self.window.append(slot)
            for i in slot.indices:  # an index drawn twice in the window: fetched for the first
                self.unclaimed.setdefault(i, slot)
        if self.planned and not self.batch_bytes():
            return  # the first batch is read alone (its weight sizes the window): its fetch too
        while self.planned < len(self.window) and (self.planned < cap // 2 or not self.planned):
            size = min(self.chunk, max(FIRST_CHUNK, cap // CHUNKS_PER_WINDOW))
            self._plan(size)
            self.chunk *= 2

    def _plan(self, size: int) -> None:
        """Claim and fetch the next ``size`` unplanned batches' samples, pulling forward."""
        assert self.prefetch is not None
        slots = [
            self.window[k] for k in range(self.planned, min(self.planned + size, len(self.window)))
        ]
        self.planned += len(slots)
        unclaimed = self.unclaimed
        own = sorted({i for slot in slots for i in slot.indices if unclaimed.get(i) is slot})
        for i in own:
            del unclaimed[i]
        extra = pulled_forward(own, unclaimed.__contains__, PULL * len(own))
        owners = {id(s): s for s in slots}
        for i in extra:
            owner = unclaimed.pop(i)
            owners[id(owner)] = owner
        if not own:
            return
        fetched: Future[None] = self._pool_here().submit(self._fetch, own + extra)
        for owner in owners.values():
            owner.fetches.append(fetched)
        self.chunks += 1
        self.pulled += len(extra)

    def _fetch(self, indices: list[int]) -> None:
        """The dataset's prefetch of ``indices``, what it stages this pass's."""
        assert self.prefetch is not None
        with staging_for(self._owner):
            self.prefetch(indices)

    def _pool_here(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="pickleshard-ahead")
        return self._pool

    def close(self) -> None:
        """Drop the batches drawn and not handed out, and what was fetched for them and not
        read yet (a fetch still under way stages nothing); stop the fetching threads."""
        for slot in self.window:
            for fetched in slot.fetches:
                fetched.cancel()
        self.window.clear()
        self.unclaimed.clear()
        self.planned = 0
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            staged_ranges().release(self._owner)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def after_prefetch(
    fetched: Sequence[Future[None]], make: Callable[[list[int]], Any]
) -> Callable[[list[int]], Any]:
    """``make`` run once the ``fetched`` prefetches are done: what a reading thread runs. A
    failed prefetch is not this batch's error: its own read fetches what it misses and raises
    the error naming the sample."""
    if not fetched:
        return make

    def run(indices: list[int]) -> Any:
        for done in fetched:
            with contextlib.suppress(Exception):
                done.result()
        return make(indices)

    return run
