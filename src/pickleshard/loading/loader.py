"""``pickleshard.Loader``: collated batches with the next ones' reads already in flight.

The sampler's order is known ahead (a deterministic permutation), so the loader draws the indices
of the next batches from it and keeps their reads going in a thread pool while the training loop
works on the current one: a local file's batch read releases the interpreter lock (the compiled
``fill_batch``), a remote one waits on its ranges' round trips (fetched together per file), so
threads serve both where worker processes were needed. ``workers=N`` runs the reads and a
Python-heavy ``transform`` in N processes instead (a torch ``DataLoader`` inside, fed the same
batches). Batches come out in the sampler's order, equal to ``DataLoader(ds, batch_size,
sampler=sampler, collate_fn=pickleshard.collate)``'s.

The memory it holds is bounded (stated, enforced): at most ``prefetch`` batches are submitted and
not yet handed out, and at most ``max_bytes_in_flight`` bytes of them (counted at the largest
batch seen so far; at least one batch is always allowed, and the first is read alone to learn a
batch's size), so the loader holds ``<= max(max_bytes_in_flight, one batch) + one batch`` (the
one being handed out) beyond the dataset's own caches. Requests in flight follow: each batch read
asks for its ranges together, per file, so at most ``prefetch`` batches' ranges are outstanding.

A dataset that can fetch ahead (``dataset.prefetch(indices)``: a :class:`~pickleshard.PickleDataset`
of remote files) is also handed the indices of the next *group* of batches before they are read
(:mod:`pickleshard.loading.ahead`): a remote file's ranges of many batches go out in one call,
neighbours merged into one request, so a sample costs a fraction of a request. Groups are at
most ``max_bytes_in_flight / 2`` bytes of batches and at most two are staged, so such a dataset
holds ``<= max_bytes_in_flight`` more (``read_ahead=False``: none).

Resume is the samplers' contract (:mod:`pickleshard.samplers.base`): :meth:`Loader.state_dict`
is the sampler's state as of the last batch *handed out* (not the ones read ahead), so a run
resumed from it sees every remaining sample exactly once; a state saved after the epoch ended
resumes at the start of the next one, as ``StatefulDataLoader`` does.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sized
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any

from ..mixing import MixedDataset, MixSampler
from ..samplers import ShuffleSampler
from .ahead import ReadAhead, after_prefetch
from .making import BatchMaker, TimedSamples
from .stats import BatchTimes, EpochStats

__all__ = ["DEFAULT_BYTES_IN_FLIGHT", "DEFAULT_PREFETCH", "Loader"]

DEFAULT_PREFETCH = 8
DEFAULT_BYTES_IN_FLIGHT = 256 << 20

Drawn = tuple[list[int], Any]  # a batch's indices, and the sampler's state once they are drawn


def default_sampler(dataset: Sized, seed: int) -> Any:
    """An exact shuffle of ``dataset`` (a mix's own order for a :class:`MixedDataset`)."""
    if isinstance(dataset, MixedDataset):
        return MixSampler(dataset, seed=seed)
    return ShuffleSampler(dataset, seed=seed)


class Loader:
    """Batches of ``dataset`` in ``sampler``'s order, read ahead (see the module).

    ``dataset`` is any map-style dataset (a :class:`~pickleshard.PickleDataset`, what
    :func:`~pickleshard.open_dataset` opens, a :class:`~pickleshard.MixedDataset`, or any with
    ``__len__`` and ``__getitem__``). ``sampler`` yields its indices (default: a
    :class:`~pickleshard.ShuffleSampler` with ``seed``, a :class:`~pickleshard.MixSampler` for a
    mix); DDP ranks split the epoch through it. ``prefetch`` batches are kept in flight, read by
    ``threads`` threads (default ``prefetch``), within ``max_bytes_in_flight`` bytes.
    ``transform`` is applied to each sample before ``collate_fn`` (default
    :func:`pickleshard.collate`); ``workers > 0`` runs reads, transform and collate in that many
    processes. ``pin_memory`` puts the batches in page-locked memory (array fields read straight
    into it where the dataset can). ``drop_last`` drops a last short batch. ``read_ahead``
    hands a dataset that has ``prefetch`` the next groups of batches' indices ahead of their
    reads (remote files fetch them together; see the module).

    :attr:`stats` counts the current (or last) epoch: see :class:`~pickleshard.loading.EpochStats`.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 64,
        *,
        sampler: Any = None,
        prefetch: int = DEFAULT_PREFETCH,
        pin_memory: bool = False,
        drop_last: bool = False,
        transform: Callable[[Any], Any] | None = None,
        workers: int = 0,
        threads: int | None = None,
        max_bytes_in_flight: int = DEFAULT_BYTES_IN_FLIGHT,
        collate_fn: Callable[[Any], Any] | None = None,
        seed: int = 0,
        read_ahead: bool = True,
    ) -> None:
        if batch_size < 1 or prefetch < 1 or workers < 0 or max_bytes_in_flight < 1:
            raise ValueError(
                "need batch_size >= 1, prefetch >= 1, workers >= 0 and max_bytes_in_flight >= 1,"
                f" got {batch_size}, {prefetch}, {workers}, {max_bytes_in_flight}"
            )
        threads = prefetch if threads is None else threads
        if threads < 1:
            raise ValueError(f"need threads >= 1, got {threads}")
        if pin_memory and not _accelerator():
            warnings.warn(
                "pin_memory=True but no accelerator is available: batches are not pinned",
                UserWarning,
                stacklevel=2,
            )
            pin_memory = False
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.sampler = default_sampler(dataset, seed) if sampler is None else sampler
        self.prefetch, self.threads, self.workers = prefetch, threads, workers
        self.max_bytes_in_flight = max_bytes_in_flight
        self.read_ahead = read_ahead
        self.pin_memory = pin_memory
        self.maker = BatchMaker(dataset, transform, collate_fn, pin_memory)
        self.stats = EpochStats()
        self._pool: ThreadPoolExecutor | None = None
        self._handed: Any = None  # sampler state as of the last batch handed out (None: none)
        self._batches_handed = 0
        self._finished = False
        self._skip = 0  # batches to pass over at the next start (a stateless sampler's resume)

    # -- what DataLoader users expect ---------------------------------------------------------
    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The sampler's (and a mix's) epoch for the passes that do not resume a state."""
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
        elif hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        if self.workers:
            return _WorkerEpoch(self)
        return _ThreadEpoch(self)

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where the batches handed out so far leave the epoch: ``{"sampler": the sampler's
        state (None for a sampler without one), "batches": handed out this epoch, "finished":
        whether the epoch ended}``."""
        sampler = self._handed
        if sampler is None and hasattr(self.sampler, "state_dict"):
            sampler = self.sampler.state_dict()
        return {"sampler": sampler, "batches": self._batches_handed, "finished": self._finished}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (from :meth:`state_dict`): the next pass yields the rest of the
        epoch, or the next epoch when it had finished (ValueError from the sampler if the
        state is not its own)."""
        if set(state) != {"sampler", "batches", "finished"}:
            raise ValueError(f"not a Loader state: {dict(state)!r}")
        sampler_state = state["sampler"]
        stateful = sampler_state is not None and hasattr(self.sampler, "load_state_dict")
        if stateful:
            self.sampler.load_state_dict(sampler_state)
            if state["finished"]:  # spent at once: the next pass is a fresh epoch
                iter(self.sampler).load_state_dict(sampler_state)
        self._skip = 0 if stateful or state["finished"] else int(state["batches"])
        self._handed, self._batches_handed = sampler_state, int(state["batches"])
        self._finished = bool(state["finished"])

    # -- inner workings -------------------------------------------------------------------------
    def _draw(self) -> tuple[Iterator[Drawn], Any]:
        """The epoch's batches as drawn from a new pass of the sampler, and the state at its
        start (taken before the pass consumes a loaded state)."""
        pass_ = iter(self.sampler)
        get_state = getattr(pass_, "get_state", None)
        start = get_state() if get_state is not None else None
        size, drop_last = self.batch_size, self.drop_last

        def batches() -> Iterator[Drawn]:
            while True:
                indices = list(islice(pass_, size))
                if not indices or (drop_last and len(indices) < size):
                    return
                yield indices, (get_state() if get_state is not None else None)

        drawn = batches()
        skipped = 0
        for _ in range(self._skip):  # a sampler without state: its first batches were seen
            if next(drawn, None) is None:
                break
            skipped += 1
        self._skip = 0
        self._handed, self._batches_handed, self._finished = start, skipped, False
        return drawn, start

    def _pool_here(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="pickleshard-loader")
        return self._pool

    def _hand(self, state: Any) -> None:
        self._handed = state
        self._batches_handed += 1

    def close(self) -> None:
        """Stop the reading threads (a later pass starts new ones)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit the pool may be gone
            self.close()

    def __repr__(self) -> str:
        return (
            f"Loader({type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"prefetch={self.prefetch}, threads={self.threads}, workers={self.workers}, "
            f"max_bytes_in_flight={self.max_bytes_in_flight})"
        )


def _accelerator() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        return False
    return bool(torch.cuda.is_available())


class _ThreadEpoch(Iterator[Any]):
    """One pass of a :class:`Loader` read by its threads (see the module for the bounds)."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        drawn, _ = loader._draw()
        prefetch = getattr(loader.dataset, "prefetch", None) if loader.read_ahead else None
        group_bytes = loader.max_bytes_in_flight // 2 if callable(prefetch) else 0
        self.ahead = ReadAhead(drawn, prefetch, group_bytes, lambda: self.batch_bytes)
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


class _WorkerEpoch(Iterator[Any]):
    """One pass of a :class:`Loader` read by worker processes (a torch ``DataLoader`` fed the
    pass's batches: reads, ``transform`` and collate there; pinning in its pin thread)."""

    def __init__(self, loader: Loader) -> None:
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
