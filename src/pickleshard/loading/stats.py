"""Where a :class:`~pickleshard.loading.Loader` epoch's time goes, and the one setting most
likely to help.

:class:`EpochStats` counts, for one epoch (or the part of it run so far): seconds the training
loop waited for a batch (``wait_s``), seconds spent reading and decoding (``read_s``: in the
dataset's batch read, which decodes into the batch's buffers), in the user's ``transform``
(``transform_s``), collating (``collate_s``) and pinning (``pin_s``), summed over the threads or
worker processes that did them, and seconds the training loop kept each batch before asking for
the next (``loop_s``). Reads in flight and bytes held are sampled each time a batch is handed out:
``max_in_flight``/``mean_in_flight`` batches submitted and not yet handed out, ``max_bytes_held``
the bytes they hold or will (the loader's budget bounds it). :func:`advice` reads them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchTimes", "EpochStats", "advice", "stats_table"]


@dataclass
class BatchTimes:
    """The seconds one batch spent in each stage where it was made (a thread or a worker)."""

    read_s: float = 0.0
    transform_s: float = 0.0
    collate_s: float = 0.0
    pin_s: float = 0.0
    nbytes: int = 0  # the collated batch's tensors


@dataclass
class EpochStats:
    """One epoch's counters (see the module). ``depth`` is the most batches the loader keeps in
    flight, ``threads``/``workers`` how it reads them."""

    depth: int = 0
    threads: int = 0
    workers: int = 0
    batches: int = 0
    samples: int = 0
    bytes: int = 0
    seconds: float = 0.0
    wait_s: float = 0.0
    read_s: float = 0.0
    transform_s: float = 0.0
    collate_s: float = 0.0
    pin_s: float = 0.0
    loop_s: float = 0.0
    max_in_flight: int = 0
    max_bytes_held: int = 0
    in_flight_sum: int = field(default=0, repr=False)
    budget_limited: int = 0  # hand-outs where the byte budget, not depth, held the reads back
    cpu_s: float = 0.0  # this process's CPU time over the epoch (all its threads)
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))

    def add(self, times: BatchTimes, samples: int) -> None:
        self.batches += 1
        self.samples += samples
        self.bytes += times.nbytes
        self.read_s += times.read_s
        self.transform_s += times.transform_s
        self.collate_s += times.collate_s
        self.pin_s += times.pin_s

    def sample_flight(self, in_flight: int, bytes_held: int, limited: bool) -> None:
        self.max_in_flight = max(self.max_in_flight, in_flight)
        self.in_flight_sum += in_flight
        self.max_bytes_held = max(self.max_bytes_held, bytes_held)
        self.budget_limited += int(limited)

    @property
    def mean_in_flight(self) -> float:
        return self.in_flight_sum / self.batches if self.batches else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.pop("in_flight_sum")
        out["mean_in_flight"] = round(self.mean_in_flight, 2)
        out["samples_per_s"] = round(self.samples_per_s, 1)
        for k, v in out.items():
            if isinstance(v, float):
                out[k] = round(v, 4)
        return out


def stats_table(stats: EpochStats) -> list[str]:
    """The stats as a Markdown table: each stage's seconds, per batch and as a share of the
    epoch's wall time (stages done in parallel threads can add to more than 100%)."""
    wall = stats.seconds or 1e-9
    per = max(stats.batches, 1)
    rows = [
        ("waiting for a batch (training loop blocked)", stats.wait_s),
        ("in the training loop", stats.loop_s),
        ("reading + decoding (all threads)", stats.read_s),
        ("transform (all threads/workers)", stats.transform_s),
        ("collating (all threads/workers)", stats.collate_s),
        ("pinning", stats.pin_s),
    ]
    lines = ["| stage | seconds | ms per batch | share of wall time |", "|---|---|---|---|"]
    for name, s in rows:
        lines.append(f"| {name} | {s:.3f} | {1000 * s / per:.2f} | {100 * s / wall:.0f}% |")
    lines += [
        "",
        f"{stats.batches} batches, {stats.samples} samples in {stats.seconds:.2f} s: "
        f"{stats.samples_per_s:,.0f} samples/s, {stats.bytes / 1e6:.1f} MB of tensors",
        f"reads in flight: max {stats.max_in_flight}, mean {stats.mean_in_flight:.1f} "
        f"(depth {stats.depth}, {stats.threads} threads, {stats.workers} worker processes); "
        f"bytes held at most {stats.max_bytes_held / 1e6:.1f} MB; "
        f"CPU {stats.cpu_s:.2f} s ({stats.cpu_s / wall:.1f} of {stats.cpus} CPUs)",
    ]
    return lines


def advice(stats: EpochStats, *, remote: bool = False, whole_files: int = 0) -> str:
    """The one setting most likely to make this epoch faster, as a sentence."""
    wall = stats.seconds or 1e-9
    busy = stats.read_s + stats.transform_s + stats.collate_s + stats.pin_s
    if stats.wait_s < 0.1 * wall:
        return (
            f"the loader keeps up: the training loop waits {100 * stats.wait_s / wall:.0f}% of "
            "the time for data; nothing in the loader will make it faster"
        )
    if whole_files:
        return (
            f"{whole_files} file(s) are read whole: `pickleshard convert` them (or use "
            "BlockShuffleSampler) so that batches are read by span"
        )
    # all CPUs busy, or one busy while storage is local (the interpreter lock is the limit)
    cpu_bound = stats.cpu_s >= 0.8 * (stats.cpus if remote else 1) * wall
    if stats.transform_s > 0.5 * busy and stats.workers == 0:
        return (
            "the transform takes most of the batch time under the interpreter lock: "
            "pass workers=N to run it in N processes"
        )
    if stats.budget_limited > stats.batches // 4:
        return "the byte budget held reads back: raise max_bytes_in_flight"
    if cpu_bound:
        return (
            f"reading is CPU-bound ({stats.cpu_s / wall:.1f} of {stats.cpus} CPUs busy): "
            "`pickleshard convert DATA OUT --to memmap` reads fastest (workers=N for Python-heavy "
            "samples); more threads will not help"
        )
    if remote or stats.mean_in_flight >= 0.75 * max(stats.depth, 1):
        return (
            f"reads are waited on with {stats.mean_in_flight:.1f} batches in flight: raise "
            f"prefetch (now {stats.depth}) to hide the storage's latency"
        )
    return (
        f"reads wait on storage with {stats.mean_in_flight:.1f} of {stats.depth} batches in "
        "flight: raise threads (or workers=N for Python-heavy samples)"
    )
