"""The samples a loader reads next, fetched ahead: each span-read file's ranges together.

:func:`prefetch_samples` is what :meth:`PickleDataset.prefetch <pickleshard.PickleDataset.prefetch>`
runs for a :class:`~pickleshard.Loader` reading ahead: the indices of its next batches grouped by
file, each file's in offset order handed to :meth:`SpanReader.prefetch
<pickleshard.read.SpanReader.prefetch>` (a remote file fetches their ranges in one concurrent
call, neighbours coalesced within its store's gap, and stages them for the batch reads that
follow; a local file does nothing). Files read whole are left to their own loads.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from .files import SpanFiles

__all__ = ["prefetch_samples"]


def prefetch_samples(
    firsts: Sequence[int], is_span: Sequence[bool], spans: SpanFiles, indices: Sequence[int]
) -> None:
    """Fetch ahead the samples ``indices`` (global, in range) of the files whose first global
    indices are ``firsts``, those ``is_span`` says are read by span (see the module)."""
    wanted = np.unique(np.asarray(indices, np.int64).reshape(-1))
    if not len(wanted):
        return
    pos = np.searchsorted(np.asarray(firsts, np.int64), wanted, "right") - 1
    cuts = [*np.flatnonzero(np.diff(pos, prepend=-1)).tolist(), len(wanted)]
    for a, b in itertools.pairwise(cuts):
        p = int(pos[a])
        if p >= 0 and is_span[p]:
            labels = wanted[a:b]
            spans.reader(p).prefetch((labels - firsts[p]).tolist(), labels.tolist())
