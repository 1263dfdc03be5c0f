"""One batch made from its indices: read, transformed, collated, pinned, each stage timed.

:class:`BatchMaker` is what a :class:`~pickleshard.loading.Loader` runs in its threads, and in its
worker processes when it has some (it pickles with the dataset it reads). The read goes through
the dataset's batch read (``read_batch(indices, pin_memory=...)`` where the dataset has one: a
:class:`~pickleshard.PickleDataset` then reads array fields straight into page-locked memory;
else ``__getitems__``; else ``ds[i]`` one by one), so what comes out equals
``default_collate([ds[i] for i in indices])`` (with the transform applied to each sample first).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..read.collate import collate
from .stats import BatchTimes

__all__ = ["BatchMaker", "TimedSamples", "tensor_bytes"]


#: the types a batch of Python objects is mostly made of: no tensor inside, nothing to walk
_LEAVES = frozenset({int, float, bool, str, bytes, complex, type(None)})


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors and arrays in a collated batch (nested lists, tuples, dicts).

    Scalars and strings are passed over by their exact type before any call: a batch kept as a
    list of samples holds one Python object per value (millions an epoch), and a call each cost
    more than reading them."""
    if type(value) in _LEAVES:
        return 0
    if isinstance(value, dict):
        return _sum_bytes(value.values())
    if isinstance(value, (list, tuple)):
        return _sum_bytes(value)
    nbytes = getattr(value, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0


def _sum_bytes(values: Iterable[Any]) -> int:
    leaves, total = _LEAVES, 0
    for v in values:
        if type(v) not in leaves:
            total += tensor_bytes(v)
    return total


class BatchMaker:
    """Makes the batch of ``indices`` of ``dataset`` (see the module): ``transform`` applied to
    each sample, then ``collate`` (default :func:`pickleshard.collate`), then, with
    ``pin_memory``, the tensors pinned. Returns the batch and its :class:`BatchTimes`."""

    def __init__(
        self,
        dataset: Any,
        transform: Callable[[Any], Any] | None = None,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
    ) -> None:
        self.dataset, self.transform = dataset, transform
        self.collate_fn = collate if collate_fn is None else collate_fn
        self.pin_memory = pin_memory

    def read(self, indices: Sequence[int]) -> Any:
        """The samples of ``indices``, by the dataset's batch read where it has one."""
        ds = self.dataset
        read_batch = getattr(ds, "read_batch", None)
        if read_batch is not None:
            return read_batch(indices, pin_memory=self.pin_memory)
        getitems = getattr(ds, "__getitems__", None)
        if getitems is not None:
            return getitems(indices)
        return [ds[i] for i in indices]

    def __call__(self, indices: Sequence[int]) -> tuple[Any, BatchTimes]:
        times = BatchTimes()
        t0 = time.perf_counter()
        batch = self.read(indices)
        t1 = time.perf_counter()
        times.read_s = t1 - t0
        if self.transform is not None:
            batch = [self.transform(sample) for sample in batch]
            t2 = time.perf_counter()
            times.transform_s, t1 = t2 - t1, t2
        out = self.collate_fn(batch)
        t2 = time.perf_counter()
        times.collate_s = t2 - t1
        if self.pin_memory:
            from torch.utils.data._utils.pin_memory import pin_memory

            out = pin_memory(out)  # type: ignore[no-untyped-call]  # tensors read into pinned buffers come back as they are
            times.pin_s = time.perf_counter() - t2
        times.nbytes = tensor_bytes(out)
        return out, times

    def collate_timed(self, got: tuple[Any, BatchTimes]) -> tuple[Any, BatchTimes]:
        """In a worker process (a DataLoader's ``collate_fn``): collate what
        :meth:`TimedSamples.__getitems__` returned, adding the collate's time."""
        batch, times = got
        t0 = time.perf_counter()
        out = self.collate_fn(batch)
        times.collate_s = time.perf_counter() - t0
        times.nbytes = tensor_bytes(out)
        return out, times


class TimedSamples:
    """A dataset for a torch ``DataLoader`` whose worker processes run ``maker``'s read and
    transform: ``__getitems__`` returns the samples with their :class:`BatchTimes` (its
    ``collate_fn`` is ``maker.collate_timed``)."""

    def __init__(self, maker: BatchMaker, size: int) -> None:
        self.maker, self.size = maker, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:  # pragma: no cover - DataLoader calls __getitems__
        return self.__getitems__([i])[0][0]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Any, BatchTimes]:
        times = BatchTimes()
        t0 = time.perf_counter()
        batch = self.maker.read(indices)
        t1 = time.perf_counter()
        times.read_s = t1 - t0
        transform = self.maker.transform
        if transform is not None:
            batch = [transform(sample) for sample in batch]
            times.transform_s = time.perf_counter() - t1
        return batch, times
