"""A batch's samples from files read whole: gathered field by field out of their decoded columns.

A file read whole is decoded once and kept in the whole-file cache; every epoch reads its
samples again. :class:`WholeGather` puts a batch's samples of such a file in their rows a
column at a time (a list lookup per value, one put per field), and holds each sample to the
size/depth bounds the first time it is read from that decoded copy only: the values do not
change while the copy is cached, so a later read of the same sample passes as the first did (a
copy loaded again, after the cache let it go, is checked again). A sample over the bounds is
refused when it is read, as before, never because another sample of its file is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ...scan.layouts import DecodedLayout
from ..batch import BatchColumn

__all__ = ["WholeGather"]

# sample's field values, its file's position, its global index -> the sample, once bounded
Finish = Callable[[tuple[Any, ...], int, int], Any]


class WholeGather:
    """Gathers a batch's samples of files read whole (see the module); ``finish`` holds one
    sample to the bounds (raising, naming it, past them). Per process, per file: which
    samples of its cached decoded copy passed (a weak reference to the copy, so a copy the
    cache let go is neither kept alive nor trusted)."""

    def __init__(self, finish: Finish) -> None:
        self.finish = finish
        self._passed: dict[int, tuple[weakref.ref[DecodedLayout], np.ndarray]] = {}

    def _flags(self, pos: int, got: DecodedLayout) -> np.ndarray:
        """File ``pos``'s flags of samples that passed, for its decoded copy ``got``."""
        held = self._passed.get(pos)
        if held is None or held[0]() is not got:
            held = (weakref.ref(got), np.zeros(got.num_samples, np.bool_))
            self._passed[pos] = held
        return held[1]

    def gather(
        self,
        pos: int,
        got: DecodedLayout,
        rows: np.ndarray,
        items: np.ndarray,
        labels: np.ndarray,
        columns: list[BatchColumn],
    ) -> None:
        """Put samples ``items`` of file ``pos`` (decoded: ``got``) in rows ``rows`` of
        ``columns``, each held to the bounds first (errors naming ``labels``)."""
        its = items.tolist()
        passed = self._flags(pos, got)
        new = np.flatnonzero(~passed[items]).tolist()
        for j in new:  # each sample of this copy checked once
            i = its[j]
            self.finish(tuple([col[i] for col in got.columns]), pos, int(labels[j]))
            passed[i] = True
        rows_l = rows.tolist()
        for col, source in zip(columns, got.columns, strict=True):
            col.put_values(rows_l, [source[i] for i in its])
