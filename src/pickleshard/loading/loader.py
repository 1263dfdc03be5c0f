"""``pickleshard.Loader``: collated batches with the next ones' reads already in flight.

The sampler's order is known ahead (a deterministic permutation), so the loader draws the indices
of the next batches from it and keeps their reads going in a thread pool while the training loop
works on the current one: a remote batch waits on its ranges' round trips (fetched together per
file), so threads serve where worker processes were needed. ``workers=N`` runs the reads and a
Python-heavy ``transform`` in N processes instead (a torch ``DataLoader`` inside, fed the same
batches). Batches come out in the sampler's order, equal to ``DataLoader(ds, batch_size,
sampler=sampler, collate_fn=pickleshard.collate)``'s.

How it reads follows the source (``threads=None``): a dataset of remote files
(``dataset.remote``) is read by ``prefetch`` threads, ``prefetch`` batches ahead; local files
are read in the loop's own thread (``threads=0``), each batch by the dataset's batch read (one
compiled call for its files, the interpreter lock released while it copies). Measured on 2
cores with a warm page cache (``python -m bench remote``), a batch of 64 12 KB samples is read in
~0.2 ms, and handing it over from a reading thread costs more than that (the two threads trade
the interpreter lock): reading one or two batches ahead in one or two threads ran at 0.64x and
0.56x the loop's own reads, sixteen threads at ~0.3x. ``threads=N`` (N >= 1) reads N batches ahead in threads anyway: a cold disk rewards a
queue of reads.

The memory it holds is bounded (stated, enforced): at most ``prefetch`` batches are submitted and
not yet handed out, and at most ``max_bytes_in_flight`` bytes of them (counted at the largest
batch seen so far; at least one batch is always allowed, and the first is read alone to learn a
batch's size), so the loader holds ``<= max(max_bytes_in_flight, one batch) + one batch`` (the
one being handed out) beyond the dataset's own caches. Requests in flight follow: each batch read
asks for its ranges together, per file, so at most ``prefetch`` batches' ranges are outstanding.

A dataset that can fetch ahead (``dataset.prefetch(indices)``: a :class:`~pickleshard.PickleDataset`
of remote files) is also handed the next batches' indices before they are read, a window of
``max_bytes_in_flight / 2`` bytes of batches planned a chunk at a time
(:mod:`pickleshard.loading.ahead`): a remote file's ranges of many batches go out in one call,
neighbours merged into one request, so a sample costs a fraction of a request. What is fetched
ahead is held until read, ``<= max_bytes_in_flight / 2`` more (``read_ahead=False``: none).

Resume is the samplers' contract (:mod:`pickleshard.samplers.base`): :meth:`Loader.state_dict`
is the sampler's state as of the last batch *handed out* (not the ones read ahead), so a run
resumed from it sees every remaining sample exactly once; a state saved after the epoch ended
resumes at the start of the next one, as ``StatefulDataLoader`` does.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sized
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any

from ..mixing import MixedDataset, MixSampler
from ..samplers import ShuffleSampler
from .making import BatchMaker
from .passes import Drawn, InlinePass, ThreadPass, WorkerPass
from .stats import EpochStats

__all__ = ["DEFAULT_BYTES_IN_FLIGHT", "DEFAULT_PREFETCH", "Loader"]

DEFAULT_PREFETCH = 8
DEFAULT_BYTES_IN_FLIGHT = 256 << 20


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
    ``threads`` threads, within ``max_bytes_in_flight`` bytes; ``threads=0`` reads each batch
    when it is asked for, in the loop's thread (default: ``prefetch`` threads for a dataset of
    remote files, 0 for local ones; see the module).
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
        if threads is None:
            threads = prefetch if getattr(dataset, "remote", False) else 0
        if threads < 0:
            raise ValueError(f"need threads >= 0, got {threads}")
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
            return WorkerPass(self)
        if not self.threads:
            return InlinePass(self)
        return ThreadPass(self)

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
        # a resumable sampler's pass hands a batch over at once (not a Python call a sample)
        take = getattr(pass_, "take", None)

        def batches() -> Iterator[Drawn]:
            while True:
                indices = take(size) if take is not None else list(islice(pass_, size))
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
