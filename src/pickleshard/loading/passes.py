"""One pass of a :class:`~pickleshard.loading.Loader`, three ways: read ahead by threads
(:class:`ThreadPass`), read when asked in the loop's thread (:class:`InlinePass`), or read by
worker processes through a torch ``DataLoader`` (:class:`WorkerPass`). Each counts its epoch
into the loader's :class:`~pickleshard.loading.EpochStats` and tells the loader each batch it
hands out (its resume state). See :mod:`pickleshard.loading.loader` for the bounds.

A pass takes its loader untyped (``Any``): ``loader.py`` imports this module, not the reverse.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from .ahead import ReadAhead, after_prefetch
from .making import BatchMaker, TimedSamples
from .stats import BatchTimes, EpochStats

__all__ = ["Drawn", "InlinePass", "ThreadPass", "WorkerPass"]

Drawn = tuple[list[int], Any]  # a batch's indices, and the sampler's state once they are drawn


class _TimedPass(Iterator[Any]):
    """What every pass counts the same way: the loop's time between batches, the pass's wall time
    (and this process's CPU time where the reading happens in it), and each batch handed out."""

    counts_cpu = True  # False where worker processes read: this process's CPU time says nothing

    def __init__(self, loader: Any, stats: EpochStats) -> None:
        self.loader, self.stats = loader, stats
        loader.stats = stats
        self.started, self.cpu = time.perf_counter(), time.process_time()
        self.returned: float | None = None  # when the last batch was handed out

    def _asked(self) -> float:
        """The loop asks for a batch: the time since the last one was the loop's."""
        now = time.perf_counter()
        if self.returned is not None:
            self.stats.loop_s += now - self.returned
        return now

    def _clock(self, now: float) -> None:
        self.stats.seconds = now - self.started
        if self.counts_cpu:
            self.stats.cpu_s = time.process_time() - self.cpu

    def _finish(self, now: float) -> None:
        """The pass ran out of batches."""
        self._clock(now)
        self.loader._finished = True

    def _hand(self, state: Any) -> None:
        """A batch goes out: the loader records its state (resume), the clock stops here."""
        self.loader._hand(state)
        self.returned = time.perf_counter()
        self._clock(self.returned)


class ThreadPass(_TimedPass):
    """One pass of a :class:`~pickleshard.loading.Loader` read by its threads (see the module for the bounds)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(
            loader, EpochStats(depth=loader.prefetch, threads=loader.threads, workers=0)
        )
        drawn, _ = loader._draw()
        prefetch = getattr(loader.dataset, "prefetch", None) if loader.read_ahead else None
        window_bytes = loader.max_bytes_in_flight // 2 if callable(prefetch) else 0
        self.ahead = ReadAhead(drawn, prefetch, window_bytes, lambda: self.batch_bytes)
        self.pending: deque[tuple[Future[tuple[Any, BatchTimes]], int, Any]] = deque()
        self.batch_bytes = 0  # the largest batch seen: what a batch in flight is counted at
        self.exhausted = False
        self.limited = False

    def _fill(self) -> None:
        """Submit batches while depth and the byte budget allow."""
        loader, pending = self.loader, self.pending
        self.limited = False
        while not self.exhausted and len(pending) < loader.prefetch:
            if pending and not self.batch_bytes:
                return  # the first batch, read alone, tells what a batch weighs
            if pending and (len(pending) + 1) * self.batch_bytes > loader.max_bytes_in_flight:
                self.limited = True
                return
            drawn = self.ahead.next()
            if drawn is None:
                self.exhausted = True
                return
            indices, state, fetched = drawn
            make = after_prefetch(fetched, loader.maker)
            future = loader._pool_here().submit(make, indices)
            pending.append((future, len(indices), state))

    def __next__(self) -> Any:
        now, stats = self._asked(), self.stats
        self._fill()
        if not self.pending:
            self._finish(now)
            raise StopIteration
        future, n, state = self.pending.popleft()
        try:
            batch, times = future.result()
        except BaseException:
            self.close()
            raise
        got = time.perf_counter()
        stats.wait_s += got - now
        stats.add(times, n)
        self.batch_bytes = max(self.batch_bytes, times.nbytes, 1)
        self._fill()
        in_flight = len(self.pending)
        stats.sample_flight(in_flight, in_flight * self.batch_bytes, self.limited)
        self._hand(state)
        return batch

    def close(self) -> None:
        """Drop the batches read ahead (a pass left before its end)."""
        while self.pending:
            self.pending.popleft()[0].cancel()
        self.ahead.close()
        self.exhausted = True

    def __del__(self) -> None:
        self.close()


class InlinePass(_TimedPass):
    """One pass of a :class:`~pickleshard.loading.Loader` with ``threads=0``: each batch read when it is asked for,
    in the caller's thread (nothing in flight; ``wait_s`` is the time reading)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader, EpochStats(depth=0, threads=0, workers=0))
        self.drawn, _ = loader._draw()

    def __next__(self) -> Any:
        now, stats = self._asked(), self.stats
        got = next(self.drawn, None)
        if got is None:
            self._finish(now)
            raise StopIteration
        indices, state = got
        batch, times = self.loader.maker(indices)
        stats.wait_s += time.perf_counter() - now
        stats.add(times, len(indices))
        stats.sample_flight(0, 0, False)
        self._hand(state)
        return batch


class _DrawnBatches:
    """The batches a pass draws, as a torch ``DataLoader``'s ``batch_sampler``: each batch's
    indices go to the workers, its state to :attr:`states` (in order: the DataLoader hands
    batches out in the order it drew them)."""

    def __init__(self, drawn: Iterator[Drawn], count: int) -> None:
        self.drawn, self.count = drawn, count
        self.states: deque[tuple[int, Any]] = deque()

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[list[int]]:
        for indices, state in self.drawn:
            self.states.append((len(indices), state))
            yield indices


class WorkerPass(_TimedPass):
    """One pass of a :class:`~pickleshard.loading.Loader` read by worker processes (a torch
    ``DataLoader`` fed the pass's batches: reads, ``transform`` and collate there; pinning in
    its pin thread)."""

    counts_cpu = False

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import DataLoader

        per_worker = max(1, math.ceil(loader.prefetch / loader.workers))
        stats = EpochStats(depth=per_worker * loader.workers, threads=0, workers=loader.workers)
        super().__init__(loader, stats)
        drawn, _ = loader._draw()
        maker = loader.maker
        here = BatchMaker(maker.dataset, maker.transform, maker.collate_fn, pin_memory=False)
        self.batches = _DrawnBatches(drawn, len(loader))
        samples: Any = TimedSamples(here, len(loader.dataset))  # a map-style dataset
        timed: Any = here.collate_timed  # what TimedSamples.__getitems__ returns, collated
        self.inner = iter(
            DataLoader(
                samples,
                batch_sampler=self.batches,
                num_workers=loader.workers,
                collate_fn=timed,
                pin_memory=loader.pin_memory,
                prefetch_factor=per_worker,
            )
        )

    def __next__(self) -> Any:
        now, stats = self._asked(), self.stats
        try:
            batch, times = next(self.inner)
        except StopIteration:
            self._finish(time.perf_counter())
            raise
        got = time.perf_counter()
        stats.wait_s += got - now
        n, state = self.batches.states.popleft()
        stats.add(times, n)
        in_flight = len(self.batches.states)
        stats.sample_flight(in_flight, 0, False)
        self._hand(state)
        return batch
