"""One epoch of a row through the one DataLoader loop, and what is measured over it.

Time to first batch runs from creating the iterator (worker start included) to the first batch;
``seconds`` to the last. PSS is summed over this process and its workers every
``memory_interval`` seconds (``bench.measure.tree_memory``) and kept as a series for the plot.
Bytes fetched are this process's ``read_bytes`` in ``/proc/self/io`` across the epoch: a reaped
DataLoader worker's counts are added to its parent's, and the loader is shut down (workers
joined) before the second reading.
"""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.measure import tree_memory

from .loaders import Loader

__all__ = ["EpochMeasure", "read_bytes", "run_epoch"]


def read_bytes() -> int:
    """Bytes storage delivered to this process (and its reaped children) so far."""
    with open("/proc/self/io") as fh:
        for line in fh:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes line")


@dataclass(frozen=True)
class EpochMeasure:
    samples: int
    first_batch_s: float
    seconds: float
    start_pss: int
    peak_pss: int
    pss_series: list[tuple[float, int]]
    bytes_fetched: int


def keep_list(batch: list[Any]) -> list[Any]:
    """The collate for samples that do not stack (dicts of ragged lists): the list itself."""
    return batch


def _consume(batch: Any) -> int:
    if batch and isinstance(batch[0], tuple):
        # kept as a list (or a SampleBatch) of (x, y): every sample built, as a peer's list
        # holds them (a SampleBatch builds its samples only when they are asked for)
        return sum(1 for _ in batch)
    xb = batch[0]
    float(xb.float().sum())  # the same trivial touch of every element for every row
    return int(xb.shape[0])


class _Sampler(threading.Thread):
    def __init__(self, interval: float) -> None:
        super().__init__(name="suite-memory", daemon=True)
        self.interval, self.t0 = interval, time.perf_counter()
        self.series: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def take(self) -> None:
        self.series.append((time.perf_counter() - self.t0, tree_memory().pss))

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            self.take()


def run_epoch(
    loader: Loader, *, batch_size: int, workers: int, stack: bool, memory_interval: float
) -> EpochMeasure:
    from torch.utils.data import DataLoader

    gc.collect()
    dl = loader.batches or DataLoader(
        loader.dataset,
        batch_size=batch_size,
        sampler=loader.sampler,
        num_workers=workers,
        collate_fn=loader.collate or (None if stack else keep_list),
    )
    fetched0 = read_bytes()
    mem = _Sampler(memory_interval)
    mem.take()
    mem.start()
    t0 = time.perf_counter()
    first = 0.0
    samples = 0
    it = iter(dl)
    for batch in it:
        if not samples:
            first = time.perf_counter() - t0
        samples += _consume(batch)
    seconds = time.perf_counter() - t0
    mem.stop.set()
    mem.join()
    mem.take()
    del it, dl  # joins the workers, whose reads then count in this process's read_bytes
    gc.collect()
    fetched = read_bytes() - fetched0
    return EpochMeasure(
        samples=samples,
        first_batch_s=first,
        seconds=seconds,
        start_pss=mem.series[0][1],
        peak_pss=max(p for _, p in mem.series),
        pss_series=mem.series,
        bytes_fetched=fetched,
    )
