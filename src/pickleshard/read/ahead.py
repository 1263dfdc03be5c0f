"""The samples a loader reads next, fetched ahead: each span-read file's ranges together.

:func:`prefetch_samples` is what :meth:`PickleDataset.prefetch <pickleshard.PickleDataset.prefetch>`
runs for a :class:`~pickleshard.Loader` reading ahead: the indices of its next batches grouped by
file, each file's in offset order handed to :meth:`SpanReader.prefetch
<pickleshard.read.SpanReader.prefetch>`, up to :data:`MAX_FILES` files at once (a remote file fetches their ranges in one concurrent
call, neighbours coalesced within its store's gap, and stages them for the batch reads that
follow; a local file does nothing). Files read whole are left to their own loads.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..io.handles import ProcessLocal
from .files import SpanFiles

__all__ = ["MAX_FILES", "prefetch_samples"]

MAX_FILES = 16  # files fetched ahead at once

# this process's threads fetching files ahead (started once: a thread start waits on the GIL)
_POOL: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(MAX_FILES, thread_name_prefix="pickleshard-ahead")
)


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
    runs = [(int(pos[a]), wanted[a:b]) for a, b in itertools.pairwise(cuts)]
    runs = [(p, labels) for p, labels in runs if p >= 0 and is_span[p]]

    def fetch(run: tuple[int, np.ndarray]) -> None:
        p, labels = run
        spans.reader(p).prefetch((labels - firsts[p]).tolist(), labels.tolist())

    if len(runs) <= 1:
        for run in runs:
            fetch(run)
        return
    # the files at once: each waits on its own round trips (the GIL is free meanwhile), in the
    # caller's context (a Loader pass's stage owner: io.remote.staging.staging_for)
    pool = _POOL.get()
    for done in [pool.submit(contextvars.copy_context().run, fetch, run) for run in runs]:
        done.result()
