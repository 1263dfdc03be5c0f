"""Check a conversion against its source, sample by sample, by content hash.

A sample's content hash is :func:`pickleshard.formats.encoding.sample_digest`: SHA-256 (first 16
bytes) of its safe encoding, which covers every value's type, dtype, shape and bytes. :func:`verify`
reads samples from the output (:func:`pickleshard.formats.open_dataset`) and from the source
(:class:`pickleshard.PickleDataset`), or, when no source is given, compares the output with the
digests ``convert`` stored in ``hashes.npy`` as it read the source.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from .errors import ConvertedDatasetError, VerifyMismatchError
from .formats import open_dataset
from .formats.base import HASHES_NAME, Sample
from .formats.encoding import sample_digest
from .formats.npy import map_npy
from .scan.layouts import LayoutChoice
from .sources import Source

if TYPE_CHECKING:
    from .dataset import PickleDataset

__all__ = ["VerifyReport", "verify"]

_BATCH = 256


@dataclass(frozen=True)
class VerifyReport:
    """``checked`` samples of ``total`` matched ``against`` ("source" or "stored hashes")."""

    out: Path
    checked: int
    total: int
    against: str
    seconds: float


def _describe(got: Sample, want: Sample, fields: tuple[str, ...]) -> str:
    for name, g, w in zip(fields, got, want, strict=False):
        if sample_digest((g,)) != sample_digest((w,)):
            return f"field {name!r} differs: got {_summary(g)}, expected {_summary(w)}"
    return f"got {len(got)} fields, expected {len(want)}"


def _summary(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray {value.dtype} {value.shape}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _stored_hashes(root: Path, n: int) -> np.ndarray[Any, Any]:
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


def verify(
    source: Source | PickleDataset | None,
    out: str | os.PathLike[str],
    *,
    sample: int | None = None,
    seed: int = 0,
    trusted: bool = False,
    allow_globals: Iterable[str] = (),
    encoding: str = "ASCII",
    progress: bool = False,
    layout: LayoutChoice = "auto",
) -> VerifyReport:
    """Compare every sample of conversion ``out`` (or ``sample`` random ones) with ``source``.

    ``source`` is what :func:`pickleshard.conversion` took (``trusted``, ``allow_globals`` and
    ``encoding`` and ``layout`` as there); ``None`` compares with the digests stored at conversion time
    instead (no source needed; catches corruption since). With ``sample=K`` only K samples,
    drawn without replacement from ``seed``, are checked.
    Raises :class:`~pickleshard.errors.VerifyMismatchError` naming the first sample (in index
    order) whose content differs or cannot be read, or a sample count that differs.
    """
    t0 = time.perf_counter()
    root = Path(out)
    ds_out = open_dataset(root, shuffle=False)
    n = len(ds_out)
    src = None
    if source is not None:
        from .conversion import source_dataset

        src = source_dataset(
            source, trusted=trusted, allow_globals=allow_globals, encoding=encoding, layout=layout
        )
        if len(src) != n:
            raise VerifyMismatchError(root, f"has {n} samples, the source has {len(src)}")
    stored = _stored_hashes(root, n) if src is None else None
    if sample is not None and sample < 0:
        raise ValueError(f"sample must be >= 0, got {sample}")
    if sample is None or sample >= n:
        indices = np.arange(n, dtype=np.int64)
    else:
        indices = np.sort(np.random.default_rng(seed).choice(n, size=sample, replace=False))
    with tqdm(total=len(indices), unit="sample", desc="verify", disable=not progress) as bar:
        for a in range(0, len(indices), _BATCH):
            chunk = indices[a : a + _BATCH].tolist()
            try:
                got = ds_out.__getitems__(chunk)
            except ConvertedDatasetError as exc:
                raise VerifyMismatchError(
                    root, f"cannot read the output: {exc}", sample=exc.sample
                ) from exc
            want = None if src is None else src.__getitems__(chunk)
            for k, i in enumerate(chunk):
                digest = sample_digest(got[k])
                if want is not None and digest != sample_digest(want[k]):
                    detail = _describe(got[k], want[k], ds_out.fields)
                    raise VerifyMismatchError(root, f"differs from the source: {detail}", sample=i)
                if stored is not None and digest != stored[i].tobytes():
                    raise VerifyMismatchError(
                        root, "differs from the digest stored at conversion time", sample=i
                    )
            bar.update(len(chunk))
    against = "source" if src is not None else "stored hashes"
    return VerifyReport(root, len(indices), n, against, time.perf_counter() - t0)
