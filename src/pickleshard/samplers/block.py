"""Samplers: the order in which samples are read, split across DDP ranks and DataLoader workers.

``BlockShuffleSampler`` makes whole-file mode fast under shuffling. Each epoch, derived only from
``(seed, epoch)``:

1. the file order is shuffled and the samples laid end to end in that order;
2. rank ``r`` of ``world_size`` takes the ``r``-th contiguous part (padded by wrapping around, or
   cut, so that all ranks get the same count, like ``DistributedSampler``);
3. the rank's part is cut again into one contiguous range per DataLoader worker, sized so that
   worker ``w`` receives exactly the batches ``w, w + W, w + 2W, ...`` that the DataLoader will
   send it;
4. inside each worker's range, consecutive files are grouped into windows whose decoded size fits
   the worker's share of the cache, and samples are shuffled within each window;
5. the batches are interleaved in the DataLoader's round-robin order.

So every sample is yielded exactly once per epoch across ranks (plus padding), and each worker
walks its windows once: with a cache of the worker's budget whose eviction policy
:attr:`~pickleshard.io.lru.Eviction.keeps_recent` (the whole-file cache's LRU does, as FIFO
would), a window's files, once loaded, stay while the files of earlier windows go, so it loads
each file at most once per epoch. Samples of neighbouring windows never mix within a window,
which is the price paid for that: the shuffle is global over files and local over samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..read.whole.cache import CacheBudget
from .base import ResumableSampler

__all__ = ["BlockShuffleSampler"]


class _IndexedDataset(Protocol):
    @property
    def index(self) -> Any: ...

    @property
    def cache_bytes(self) -> int: ...


@dataclass(frozen=True)
class _Segment:
    """``count`` consecutive global sample indices starting at ``start``, all from ``file``."""

    file: int
    start: int
    count: int


def _cut(segments: Sequence[_Segment], total: int, start: int, stop: int) -> list[_Segment]:
    """Segments covering positions ``[start, stop)`` of the concatenation, wrapping modulo ``total``."""
    out: list[_Segment] = []
    ends = np.cumsum([s.count for s in segments])
    pos = start
    while pos < stop:
        p = pos % total
        k = int(np.searchsorted(ends, p, side="right"))
        seg = segments[k]
        offset = p - (int(ends[k]) - seg.count)
        take = min(seg.count - offset, stop - pos)
        out.append(_Segment(seg.file, seg.start + offset, take))
        pos += take
    return out


class BlockShuffleSampler(ResumableSampler):
    """Shuffle files, then samples within windows of files that fit the cache budget.

    Pass it as ``DataLoader(ds, sampler=..., batch_size=B, num_workers=W)`` with the same
    ``batch_size`` and ``num_workers`` given here: they only decide which worker reads what, so a
    mismatch costs speed, never correctness. ``cache_bytes`` defaults to the dataset's, and is
    the total across workers, as in :class:`pickleshard.PickleDataset`: a window holds files of
    at most :meth:`CacheBudget.share(num_workers) <pickleshard.read.whole.cache.CacheBudget.share>`
    decoded bytes, the share each worker's cache is given.

    ``rank``/``world_size`` default to ``torch.distributed``'s when initialised. With
    ``drop_last=False`` each rank gets ``ceil(N / world_size)`` samples, the last ones padded by
    wrapping around the epoch's order; with ``drop_last=True``, ``N // world_size``. Call
    :meth:`set_epoch` before each epoch for a new order.

    Resume (see :class:`~pickleshard.samplers.base.ResumableSampler`): the state is
    ``{"seed", "epoch", "samples_seen"}`` plus the settings that shape the order (``world_size``,
    ``batch_size``, ``num_workers``, ``cache_bytes``, ``shuffle``, ``drop_last``,
    ``num_samples``); ``samples_seen`` counts the samples this rank's pass has yielded. A state
    saved with other settings is refused with ValueError (for another world size or worker count
    use :class:`pickleshard.ShuffleSampler`). ``StatefulDataLoader`` resumes it mid-epoch.
    """

    def __init__(
        self,
        dataset: _IndexedDataset,
        *,
        batch_size: int = 1,
        num_workers: int = 0,
        cache_bytes: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
    ) -> None:
        if batch_size < 1 or num_workers < 0:
            raise ValueError(
                f"need batch_size >= 1 and num_workers >= 0, got {batch_size}, {num_workers}"
            )
        index = dataset.index
        self._counts = np.array([f.num_samples for f in index.files], dtype=np.int64)
        self._nbytes = np.array([f.decoded_nbytes for f in index.files], dtype=np.int64)
        self._starts = np.asarray(index.file_starts[:-1], dtype=np.int64)
        super().__init__(
            int(self._counts.sum()),
            shuffle=shuffle,
            seed=seed,
            rank=rank,
            world_size=world_size,
            drop_last=drop_last,
        )
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.budget = CacheBudget(dataset.cache_bytes if cache_bytes is None else cache_bytes)

    @property
    def cache_bytes(self) -> int:
        """The cache budget in total across workers (:attr:`budget`'s ``total_bytes``)."""
        return self.budget.total_bytes

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples_total // self.world_size
        return math.ceil(self.num_samples_total / self.world_size)

    def _settings(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "cache_bytes": self.cache_bytes,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "num_samples": self.num_samples_total,
        }

    def _max_samples_seen(self) -> int:
        return len(self)

    def _stream(self, state: dict[str, Any]) -> Iterator[int]:
        order = self._order(state["seed"], state["epoch"])
        return itertools.islice(order, state["samples_seen"], None)

    def _state_after(self, state: dict[str, Any], taken: int) -> dict[str, Any]:
        return {**state, "samples_seen": state["samples_seen"] + taken}

    def _rank_segments(self, rng: np.random.Generator) -> list[_Segment]:
        files = rng.permutation(len(self._counts)) if self.shuffle else np.arange(len(self._counts))
        segments = [
            _Segment(int(f), int(self._starts[f]), int(self._counts[f]))
            for f in files
            if self._counts[f] > 0
        ]
        n = len(self)
        if n == 0 or not segments:
            return []
        part = _cut(segments, self.num_samples_total, self.rank * n, (self.rank + 1) * n)
        # Padding wraps around to the start of the order and can bring back a file this part
        # already holds: keep a file's pieces next to each other so a worker visits it once.
        first: dict[int, int] = {}
        for k, seg in enumerate(part):
            first.setdefault(seg.file, k)
        return sorted(part, key=lambda seg: first[seg.file])

    def _worker_sizes(self, n: int) -> list[int]:
        workers = max(1, self.num_workers)
        batches = math.ceil(n / self.batch_size)
        sizes = [len(range(w, batches, workers)) * self.batch_size for w in range(workers)]
        if batches:
            sizes[(batches - 1) % workers] -= batches * self.batch_size - n
        return sizes

    def _windows(
        self, segments: Sequence[_Segment], rng: np.random.Generator
    ) -> Iterator[np.ndarray]:
        budget = self.budget.share(self.num_workers)
        window: list[_Segment] = []
        used = 0
        for seg in [*segments, None]:
            if seg is not None and window and window[-1].file == seg.file:
                window.append(seg)  # another piece of a file the window holds: no new bytes
                continue
            size = 0 if seg is None else int(self._nbytes[seg.file])
            if window and (seg is None or used + size > budget):
                idx = np.concatenate(
                    [np.arange(s.start, s.start + s.count, dtype=np.int64) for s in window]
                )
                if self.shuffle:
                    rng.shuffle(idx)
                yield idx
                window, used = [], 0
            if seg is not None:
                window.append(seg)
                used += size

    def _order(self, seed: int, epoch: int) -> Iterator[int]:
        """This rank's samples for ``epoch``, batches interleaved as the DataLoader deals them."""
        rng = np.random.default_rng([seed, epoch])
        segments = self._rank_segments(rng)
        n = sum(s.count for s in segments)
        sizes = self._worker_sizes(n)
        streams: list[Iterator[np.ndarray]] = []
        offset = 0
        for w, size in enumerate(sizes):
            part = _cut(segments, n, offset, offset + size) if size else []
            worker_rng = np.random.default_rng([seed, epoch, self.rank, w])
            streams.append(self._windows(part, worker_rng))
            offset += size
        pending = [np.empty(0, dtype=np.int64) for _ in streams]
        remaining = list(sizes)
        k = 0
        while any(remaining):
            w = k % len(streams)
            take = min(self.batch_size, remaining[w])
            while len(pending[w]) < take:
                pending[w] = np.concatenate([pending[w], next(streams[w])])
            yield from pending[w][:take].tolist()
            pending[w] = pending[w][take:]
            remaining[w] -= take
            k += 1
