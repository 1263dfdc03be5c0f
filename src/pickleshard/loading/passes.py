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


class ThreadPass(Iterator[Any]):
    """One pass of a :class:`~pickleshard.loading.Loader` read by its threads (see the module for the bounds)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        drawn, _ = loader._draw()
        prefetch = getattr(loader.dataset, "prefetch", None) if loader.read_ahead else None
        window_bytes = loader.max_bytes_in_flight // 2 if callable(prefetch) else 0
        self.ahead = ReadAhead(drawn, prefetch, window_bytes, lambda: self.batch_bytes)
        self.pending: deque[tuple[Future[tuple[Any, BatchTimes]], int, Any]] = deque()
        self.batch_bytes = 0  # the largest batch seen: what a batch in flight is counted at
        self.exhausted = False
        self.limited = False
        self.stats = loader.stats = EpochStats(
            depth=loader.prefetch, threads=loader.threads, workers=0
        )
        self.started, self.cpu = time.perf_counter(), time.process_time()
        self.returned: float | None = None  # when the last batch was handed out

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
        now = time.perf_counter()
        stats = self.stats
        if self.returned is not None:
            stats.loop_s += now - self.returned
        self._fill()
        if not self.pending:
            stats.seconds, stats.cpu_s = now - self.started, time.process_time() - self.cpu
            self.loader._finished = True
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
        self.loader._hand(state)
        self.returned = time.perf_counter()
        stats.seconds, stats.cpu_s = self.returned - self.started, time.process_time() - self.cpu
        return batch

    def close(self) -> None:
        """Drop the batches read ahead (a pass left before its end)."""
        while self.pending:
            self.pending.popleft()[0].cancel()
        self.ahead.close()
        self.exhausted = True

    def __del__(self) -> None:
        self.close()


class InlinePass(Iterator[Any]):
    """One pass of a :class:`~pickleshard.loading.Loader` with ``threads=0``: each batch read when it is asked for,
    in the caller's thread (nothing in flight; ``wait_s`` is the time reading)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.drawn, _ = loader._draw()
        self.stats = loader.stats = EpochStats(depth=0, threads=0, workers=0)
        self.started, self.cpu = time.perf_counter(), time.process_time()
        self.returned: float | None = None

    def __next__(self) -> Any:
        now = time.perf_counter()
        stats = self.stats
        if self.returned is not None:
            stats.loop_s += now - self.returned
        got = next(self.drawn, None)
        if got is None:
            stats.seconds, stats.cpu_s = now - self.started, time.process_time() - self.cpu
            self.loader._finished = True
            raise StopIteration
        indices, state = got
        batch, times = self.loader.maker(indices)
        stats.wait_s += time.perf_counter() - now
        stats.add(times, len(indices))
        stats.sample_flight(0, 0, False)
        self.loader._hand(state)
        self.returned = time.perf_counter()
        stats.seconds, stats.cpu_s = self.returned - self.started, time.process_time() - self.cpu
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


class WorkerPass(Iterator[Any]):
    """One pass of a :class:`~pickleshard.loading.Loader` read by worker processes (a torch
    ``DataLoader`` fed the pass's batches: reads, ``transform`` and collate there; pinning in
    its pin thread)."""

    def __init__(self, loader: Any) -> None:
        from torch.utils.data import DataLoader

        self.loader = loader
        drawn, _ = loader._draw()
        maker = loader.maker
        here = BatchMaker(maker.dataset, maker.transform, maker.collate_fn, pin_memory=False)
        self.batches = _DrawnBatches(drawn, len(loader))
        per_worker = max(1, math.ceil(loader.prefetch / loader.workers))
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
        self.stats = loader.stats = EpochStats(
            depth=per_worker * loader.workers, threads=0, workers=loader.workers
        )
        self.started = time.perf_counter()
        self.returned: float | None = None

    def __next__(self) -> Any:
        now = time.perf_counter()
        stats = self.stats
        if self.returned is not None:
            stats.loop_s += now - self.returned
        try:
            batch, times = next(self.inner)
        except StopIteration:
            stats.seconds = time.perf_counter() - self.started
            self.loader._finished = True
            raise
        got = time.perf_counter()
        stats.wait_s += got - now
        n, state = self.batches.states.popleft()
        stats.add(times, n)
        in_flight = len(self.batches.states)
        stats.sample_flight(in_flight, 0, False)
        self.loader._hand(state)
        self.returned = time.perf_counter()
        stats.seconds = self.returned - self.started
        return batch
