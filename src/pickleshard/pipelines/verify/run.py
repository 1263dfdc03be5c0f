"""Check a conversion against its source, sample by sample, by content hash.

A sample's content hash is :func:`pickleshard.formats.encoding.sample_digest`: SHA-256 (first 16
bytes) of its safe encoding, which covers every value's type, dtype, shape and bytes. :func:`verify`
reads samples from the output (:func:`pickleshard.formats.open_dataset`) and from the source
(:class:`pickleshard.PickleDataset`), or, when no source is given, compares the output with the
digests ``convert`` stored in ``hashes.npy`` as it read the source.
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ...errors import VerifyMismatchError
from ...executors import ExecutorLike, resolve_executor
from ...formats import open_dataset
from ...io.listing import Source
from ...mixing import MixedDataset
from ...scan.layouts import LayoutChoice
from ..mixed import MixInput, verify_input
from .parts import VerifyJob, check_run, plan_runs, release, stored_hashes

if TYPE_CHECKING:
    from ...dataset import PickleDataset

__all__ = ["VerifyReport", "verify"]


@dataclass(frozen=True)
class VerifyReport:
    """``checked`` samples of ``total`` matched ``against`` ("source" or "stored hashes")."""

    out: Path
    checked: int
    total: int
    against: str
    seconds: float


def verify(
    source: Source | PickleDataset | MixedDataset | Sequence[Any] | None,
    out: str | os.PathLike[str],
    *,
    sample: int | None = None,
    seed: int = 0,
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    encoding: str = "ASCII",
    progress: bool = False,
    jobs: int | None = None,
    executor: ExecutorLike = None,
    layout: LayoutChoice = "auto",
    storage_options: Mapping[str, Any] | None = None,
) -> VerifyReport:
    """Compare every sample of conversion ``out`` (or ``sample`` random ones) with ``source``.

    ``source`` is what :func:`pickleshard.pipelines.convert.run` took (for a conversion of a
    mix: its sources in order, or the MixedDataset, see
    :func:`~pickleshard.pipelines.mixed.verify_input`; ``trusted``, ``allow_globals`` and
    ``encoding``, ``layout`` and ``storage_options`` as there); ``None`` compares with the digests stored at conversion time
    instead (no source needed; catches corruption since). With ``sample=K`` only K samples,
    drawn without replacement from ``seed``, are checked.
    The samples are checked in up to 64 runs by ``executor`` (see
    :func:`~pickleshard.executors.choose.resolve_executor`; default: this process, or ``jobs``
    local processes; ``jobs`` also sizes a local Dask cluster), with the same report.
    Raises :class:`~pickleshard.errors.VerifyMismatchError` naming the first sample (in index
    order) whose content differs or cannot be read, or a sample count that differs.
    """
    t0 = time.perf_counter()
    root = Path(out)
    ds_out = open_dataset(root, shuffle=False)
    n = len(ds_out)
    src: PickleDataset | MixInput | None = None
    if source is not None:
        opening = {
            "trusted": trusted,
            "allow_globals": allow_globals,
            "encoding": encoding,
            "layout": layout,
            "storage_options": storage_options,
        }
        src = verify_input(source, root, opening)  # a mix's output: the mix it records
        if len(src) != n:
            raise VerifyMismatchError(root, f"has {n} samples, the source has {len(src)}")
    if src is None:
        stored_hashes(root, n)  # a missing or malformed file is named before any task starts
    if sample is not None and sample < 0:
        raise ValueError(f"sample must be >= 0, got {sample}")
    if sample is None or sample >= n:
        indices = np.arange(n, dtype=np.int64)
    else:
        indices = np.sort(np.random.default_rng(seed).choice(n, size=sample, replace=False))
    runs = plan_runs(indices, contiguous=len(indices) == n)
    job = VerifyJob(root, root.absolute(), None if src is None else pickle.dumps(src), token_hex(8))
    runner = resolve_executor(executor, jobs, len(runs))
    with tqdm(total=len(indices), unit="sample", desc="verify", disable=not progress) as bar:
        try:
            _raise_first_mismatch(runner.run(check_run, [(job, r) for r in runs]), runs, bar)
        finally:
            release()
    against = "source" if src is not None else "stored hashes"
    return VerifyReport(root, len(indices), n, against, time.perf_counter() - t0)


def _raise_first_mismatch(
    results: Generator[tuple[int, VerifyMismatchError | None], None, None],
    runs: Sequence[Sequence[int]],
    bar: Any,
) -> None:
    """Take the runs' results in any order; raise the mismatch of the earliest failing run as
    soon as every run before it has passed (so that it is the first in index order)."""
    pending = set(range(len(runs)))
    failed: dict[int, VerifyMismatchError] = {}
    try:
        for k, got in results:
            pending.discard(k)
            if got is None:
                bar.update(len(runs[k]))
            else:
                failed[k] = got
            if failed and min(failed) < min(pending, default=len(runs)):
                raise failed[min(failed)]
    finally:  # stopped at a mismatch: the executor cancels the runs not started
        results.close()
