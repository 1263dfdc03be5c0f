"""The hooks the readers call for files other tools wrote: one place that decides, by the
file's bytes, whether a file is read by :mod:`~.joblibfile`, and turns pandas containers
into columns (:mod:`~.pandasfile`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import FileChangedError
from ..io import ByteSource, open_source
from ..io.identity import FileIdentity
from ..io.options import SourceOptions
from ..safety.policy import UnpicklePolicy
from ..scan.model import ScanResult
from .joblibfile import joblib_kind, load_joblib, scan_joblib
from .pandasfile import unwrap_tables

__all__ = ["foreign_records", "foreign_scan", "unwrap_tables"]


def foreign_scan(
    path: str | os.PathLike[str] | ByteSource, policy: UnpicklePolicy
) -> ScanResult | None:
    """The scan of a file another tool wrote that pickleshard reads in place (an uncompressed
    ``joblib.dump`` of arrays), None for any other file (the pickle scanner's business).
    Raises :class:`~pickleshard.errors.NotSpanIndexableError` for such a file read whole."""
    return scan_joblib(path, policy)


def foreign_records(
    path: str | os.PathLike[str],
    policy: UnpicklePolicy,
    identity: FileIdentity | None = None,
    options: SourceOptions | None = None,
) -> list[Any] | None:
    """The pickles of a file (opened with ``options``) that ``pickle.load`` cannot read as
    written (a ``joblib.dump`` file, compressed or not), loaded whole; None for any other file. A top-level array is
    returned as ``[array]``: one column ``x``, its rows the samples, as the scan reads it (a
    list, which ``layout="auto"`` never reads as one sample)."""
    where = os.fspath(path)
    with open_source(where, options) as source:
        kind = joblib_kind(source)
    if not kind:
        return None
    obj = load_joblib(where, policy, options)
    if identity is not None:
        with open_source(where, options) as source:
            what = source.changed_since(identity)
        if what is not None:
            raise FileChangedError(where, what)
    return [[obj] if isinstance(obj, np.ndarray) and obj.ndim else obj]
