"""Span reads, planned then executed (see :mod:`pickleshard.read.reader`).

Modules: :mod:`~.plan` (the per-file :class:`ReadPlan` and the field strategies' names),
:mod:`~.items` (arrays read from their payloads, rows of one array), :mod:`~.ints` (small-int
columns), :mod:`~.spans` (fields unpickled from their span, externals resolved),
:mod:`~.reader` (:class:`SpanReader`, one per file, executing its plan), :mod:`~.files`
(:class:`SpanFiles`, a dataset's open readers), :mod:`~.failures` (their errors).
"""

from .files import DEFAULT_MAX_OPEN, SpanFiles
from .plan import ReaderStats, ReadPlan
from .reader import BATCH_READ_MIN, SpanReader

__all__ = [
    "BATCH_READ_MIN",
    "DEFAULT_MAX_OPEN",
    "ReadPlan",
    "ReaderStats",
    "SpanFiles",
    "SpanReader",
]
