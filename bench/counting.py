"""Count file loads across DataLoader workers, each process reporting its own counter.

A worker is a separate process, so a counter incremented there is invisible to the main
process. :class:`LoadCountingDataset` wraps the measured dataset and, after every fetch, stores
the loads made *in this process* into this process's slot of a shared-memory array (slot 0: the
main process; ``1 + worker id``: a worker). The counts themselves are the datasets' own:
``cache_stats.loads`` of a :class:`~pickleshard.PickleDataset`, ``file_loads`` of a baseline.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from typing import Any

from torch.utils.data import Dataset, get_worker_info

from pickleshard import PickleDataset

__all__ = ["FileLoadCounter", "LoadCountingDataset", "file_loads"]


def file_loads(dataset: object) -> int:
    """Files this process has unpickled for ``dataset`` so far (its own counter)."""
    if isinstance(dataset, PickleDataset):
        return dataset.cache_stats.loads
    count = getattr(dataset, "file_loads", None)
    if not isinstance(count, int):
        raise TypeError(f"{type(dataset).__name__} has no file_loads counter")
    return count


class FileLoadCounter:
    """One int64 slot per process in shared memory, inherited by forked and spawned workers."""

    def __init__(self, workers: int) -> None:
        self._slots: Any = multiprocessing.RawArray("q", workers + 1)

    def store(self, slot: int, value: int) -> None:
        self._slots[slot] = value

    def total(self) -> int:
        return int(sum(self._slots))


class LoadCountingDataset(Dataset[Any]):
    """``dataset`` unchanged, plus: after each fetch, this process's loads go to ``counter``.

    Loads are counted from this process's first fetch (a forked worker starts with a copy of the
    parent's counter, which it must not count again), so files unpickled before the epoch, in the
    main process, are not counted here.
    """

    def __init__(self, dataset: Any, counter: FileLoadCounter) -> None:
        self.dataset = dataset
        self.counter = counter
        self._pid = os.getpid()
        self._base = file_loads(dataset)

    def _report(self) -> None:
        info = get_worker_info()
        slot = 0 if info is None else info.id + 1
        self.counter.store(slot, file_loads(self.dataset) - self._base)

    def _begin(self) -> None:
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._base = file_loads(self.dataset)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        self._begin()
        sample = self.dataset[i]
        self._report()
        return sample

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        # What DataLoader's fetcher does itself: the dataset's own batch method if it has one.
        self._begin()
        fetch = getattr(self.dataset, "__getitems__", None)
        batch: list[Any] = fetch(indices) if fetch else [self.dataset[i] for i in indices]
        self._report()
        return batch
