"""Checking one run of a conversion's samples: verify's per-task work, wherever an executor runs it.

:func:`plan_runs` cuts the samples to check into at most 64 runs; :func:`check_run` reads one
run from the output (and from the source, or the digests stored at conversion time) in batches
of 256 and returns the first sample that differs as a
:class:`~pickleshard.errors.VerifyMismatchError` *value*, or None: the caller, which may get runs
back in any order, raises the one of the earliest run (that is, the first mismatch in index
order, as a sequential check would). Each process opens the output and the source once per
verify run (:class:`VerifyJob.token`), not once per task. Planning and the report are
:mod:`pickleshard.pipelines.verify.run`'s.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import ConvertedDatasetError, VerifyMismatchError
from ...formats import open_dataset
from ...formats.base import HASHES_NAME, Sample
from ...formats.encoding import sample_digest
from ...formats.npy import map_npy
from .difference import difference

if TYPE_CHECKING:
    from ...dataset import PickleDataset

__all__ = [
    "BATCH",
    "MAX_RUNS",
    "VerifyJob",
    "check_run",
    "plan_runs",
    "release",
    "stored_hashes",
]

BATCH = 256
MAX_RUNS = 64

Run = range | list[int]


@dataclass(frozen=True)
class VerifyJob:
    """What every run of one verify shares: small, pickled with each task."""

    out: Path  # as the caller named it (errors name it so)
    where: Path  # absolute: a worker's working directory may differ
    # The source PickleDataset, pickled once by the caller (None: compare with the stored
    # digests): unpickling reopens its index, which a process does once per token, not per task.
    source: bytes | None
    token: str  # names this verify: a process opens ``out`` and ``source`` once per token


def plan_runs(indices: np.ndarray[Any, Any], *, contiguous: bool) -> list[Run]:
    """The sorted ``indices`` cut into at most :data:`MAX_RUNS` runs of at least
    :data:`BATCH`; as ``range`` objects when ``contiguous`` (every sample: small to send)."""
    size = max(BATCH, -(-len(indices) // MAX_RUNS))
    runs: list[Run] = []
    for a in range(0, len(indices), size):
        b = min(a + size, len(indices))
        runs.append(
            range(int(indices[a]), int(indices[b - 1]) + 1)
            if contiguous
            else [int(i) for i in indices[a:b]]
        )
    return runs


def stored_hashes(root: Path, n: int) -> np.ndarray[Any, Any]:
    """The digests ``convert`` stored, checked to be uint8 ``(n, 16)``."""
    path = root / HASHES_NAME
    try:
        hashes = map_npy(path)
    except (OSError, ValueError) as exc:
        raise ConvertedDatasetError(path, f"cannot read the stored digests: {exc}") from None
    if hashes.shape != (n, 16) or hashes.dtype != np.uint8:
        raise ConvertedDatasetError(
            path, f"holds {hashes.dtype} {hashes.shape}, expected uint8 ({n}, 16)"
        )
    return hashes


_opened = threading.local()  # per thread: a Dask worker may run tasks in several threads


Opened = tuple[Any, "np.ndarray[Any, Any] | None", "PickleDataset | None"]


def _open(job: VerifyJob) -> Opened:
    """(the output dataset, the stored digests or None, the source or None), opened once per
    job per thread."""
    held = getattr(_opened, "held", None)
    if held is not None and held[0] == job.token:
        opened: Opened = held[1]
        return opened
    ds_out = open_dataset(job.where, shuffle=False)
    ds_out.sample_form = ds_out.sample_form.as_tuples()  # compared with the source's fields
    stored = stored_hashes(job.where, len(ds_out)) if job.source is None else None
    source = None if job.source is None else pickle.loads(job.source)  # our own bytes
    _opened.held = (job.token, (ds_out, stored, source))
    return ds_out, stored, source


def release() -> None:
    """Drop what this thread holds open for a verify (the caller's, once it is over)."""
    _opened.held = None


def check_run(job: VerifyJob, run: Sequence[int]) -> VerifyMismatchError | None:
    """The first sample of ``run`` whose output differs from the source (or the stored digest)
    or cannot be read, as an error value; None when every sample matches."""
    ds_out, stored, source = _open(job)
    root = job.out
    for a in range(0, len(run), BATCH):
        chunk = list(run[a : a + BATCH])
        try:
            got = ds_out.__getitems__(chunk)
        except ConvertedDatasetError as exc:
            err = VerifyMismatchError(root, f"cannot read the output: {exc}", sample=exc.sample)
            err.__cause__ = exc
            return err
        want = None if source is None else source.__getitems__(chunk)
        for k, i in enumerate(chunk):
            digest = sample_digest(got[k])
            if want is not None and digest != sample_digest(want[k]):
                detail = _describe(got[k], want[k], ds_out.fields)
                return VerifyMismatchError(root, f"differs from the source: {detail}", sample=i)
            if stored is not None and digest != stored[i].tobytes():
                return VerifyMismatchError(
                    root, "differs from the digest stored at conversion time", sample=i
                )
    return None


def _describe(got: Sample, want: Sample, fields: tuple[str, ...]) -> str:
    for name, g, w in zip(fields, got, want, strict=False):
        if sample_digest((g,)) != sample_digest((w,)):
            what = difference(g, w) or f"{type(g).__name__} values whose stored bytes differ"
            return f"field {name!r} differs: {what}"
    return f"got {len(got)} fields, expected {len(want)}"
