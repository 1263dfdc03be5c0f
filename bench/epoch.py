"""The one DataLoader loop every row goes through: same loader arguments, same consumption."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.utils.data import DataLoader

from .measure import PeakTreeMemory, Stopwatch

__all__ = ["EpochResult", "run_epoch"]


@dataclass(frozen=True)
class EpochResult:
    """One pass over a DataLoader: samples seen, wall time, PSS of the process tree."""

    samples: int
    seconds: float
    start_pss: int
    peak_pss: int
    start_alone: int
    peak_alone: int
    memory_samples: int
    checksum: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


def run_epoch(
    dataset: Any,
    sampler: Iterable[int],
    *,
    batch_size: int,
    workers: int,
    memory_interval: float = 0.05,
) -> EpochResult:
    """Iterate ``DataLoader(dataset, batch_size, sampler, num_workers=workers)`` once.

    Each batch is consumed trivially (``xb.float().sum()``, read back as a Python float) so the
    loop does the same work for every dataset. The time runs from creating the iterator (worker
    start included) to the last batch; memory is sampled over the same span.
    """
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers)
    samples = 0
    checksum = 0.0
    with PeakTreeMemory(memory_interval) as mem, Stopwatch() as clock:
        for xb, _ in loader:
            checksum += float(xb.float().sum())
            samples += int(xb.shape[0])
    return EpochResult(
        samples=samples,
        seconds=clock.seconds,
        start_pss=mem.start.pss,
        peak_pss=mem.peak_pss,
        start_alone=mem.start.alone,
        peak_alone=mem.peak_alone,
        memory_samples=mem.samples,
        checksum=checksum,
    )
