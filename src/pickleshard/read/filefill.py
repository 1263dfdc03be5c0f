"""One span-read file's part of a batch read: :class:`FileFill`, built once per file and process.

It decides, from the file's settled :class:`~pickleshard.read.plan.ReadPlan`, how the file's
samples reach a batch's columns: arrays read from their payloads and small ints by the compiled
batch call (its :class:`~pickleshard._cscan.FileBatch` record: the file's descriptor, mapping,
framings, span columns and int values), or anything else through :meth:`SpanReader.many
<pickleshard.read.SpanReader.many>`, the reference. :mod:`pickleshard.read.batchread` plans the
batch and calls it.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from math import prod
from typing import Any

import numpy as np

from ..io.local import map_readonly
from ..picklekit.compiled import require
from ..safety.bounds import check_sample
from .batch import BatchColumn
from .ints import IntColumn
from .items import ArrayItems, compiled_framing
from .objectcolumns import ObjectFill
from .plan import INT, ITEM, ReadPlan
from .reader import Opened, SpanReader

__all__ = ["FILL_GAP", "FileFill", "Plan", "span_plan"]

# spans of one file closer than this are read by one preadv, the bytes between them included
# (a pickled list's memo and framing opcodes between its items; never a sample's worth)
FILL_GAP = 4096

Plan = tuple[Any, ...]  # ("arrays", shape, dtype) | ("ints",) | () (a list of values)


def span_plan(plan: ReadPlan, f: int) -> Plan:
    """What a span-read file's ``plan`` holds in field ``f`` for the batch's column."""
    how, reader = plan.hows[f], plan.readers[f]
    if how == ITEM and isinstance(reader, ArrayItems) and not reader.spec.readonly:
        return ("arrays", tuple(reader.spec.shape), np.dtype(reader.spec.dtype))
    if how == INT and isinstance(reader, IntColumn) and reader.values is not None:
        return ("ints",)
    return ()


def _columns(columns: list[np.ndarray], n: int) -> np.ndarray:
    """``columns`` (each ``n`` int64 values) side by side, ``(n, len(columns))``: one column
    as a view of itself (no copy per process of what the plan decoded)."""
    if len(columns) == 1:
        return columns[0].reshape(n, 1)
    if not columns:
        return np.zeros((n, 0), np.int64)
    return np.ascontiguousarray(np.stack(columns, 1), np.int64)


class FileFill:
    """How one span-read file's samples are put in a batch's rows, decided once per reader and
    process from its settled plan: a file whose fields are all arrays read from their payloads
    and small ints has a compiled record (:attr:`batch`) that ``_cscan.fill_batch`` reads, then
    :meth:`filled` finishes; any other file is read by :meth:`fill`, the reference."""

    def __init__(self, reader: SpanReader, here: Opened, plan: ReadPlan) -> None:
        fd, loader = here.fd, here.loader
        # the reader held weakly: this is kept in its Opened (here.batch), and a cycle would keep
        # a dropped reader's descriptor and maps until a collection
        self.reader = weakref.proxy(reader)
        self.here = weakref.ref(here)  # (it holds this: here.batch)
        self.fd, self.loader = fd, loader
        self.stats = reader.stats
        self.plans = [span_plan(plan, f) for f in range(len(plan.hows))]
        self.arrays: list[tuple[int, ArrayItems, Any]] = []
        self.ints: list[tuple[int, np.ndarray]] = []
        compiled = loader is not None and fd >= 0
        for f, field in enumerate(plan.readers):
            if self.plans[f][:1] == ("arrays",) and compiled:
                assert isinstance(field, ArrayItems)
                self.arrays.append((f, field, compiled_framing(field.spec)))
            elif self.plans[f][:1] == ("ints",) and compiled:
                assert isinstance(field, IntColumn)
                self.ints.append((f, np.asarray(field.values, np.int64)))
        self.compiled = len(self.arrays) + len(self.ints) == len(plan.hows)
        self.row_bytes = sum(f.spec.dtype.itemsize * prod(f.spec.shape) for _, f, _ in self.arrays)
        # the file mapped whole, read by memcpy (see _cscan.fill_batch); None: by preadv
        self.mapped = map_readonly(fd, reader.identity.size) if self.arrays else None
        # per array field, which samples are read from their payloads (not an exception, no
        # span defining a shared value) as uint8 flags; empty where all are
        self.direct = [self._direct(field) for _, field, _ in self.arrays]
        # these samples (fixed arrays, int64 ints) all decode to one size and depth: held to
        # the bounds once, by the first one read
        self.bounded = reader.bounds is None
        # array fields stored byte-swapped: their rows are swapped once read
        self.swapped = [f for f, field, _ in self.arrays if field.spec.swap]
        # the whole file's part of a batch in C (SpanLoader's reads, the ints, the identity)
        self.batch: Any = None
        # a file with object fields: decoded into the batch's columns where it can be
        # (read.objectcolumns.decode_objects, for all such files of a batch at once)
        objects = ObjectFill(reader, here, plan) if not self.compiled else None
        self.objects = objects if objects is not None and objects.usable else None
        if self.compiled:
            arrays, ints = self.arrays, self.ints
            n = len(reader.scan.starts)
            direct = np.zeros((0, 0), np.uint8)
            if any(len(d) for d in self.direct):
                direct = np.ones((n, len(arrays)), np.uint8)
                for k, d in enumerate(self.direct):
                    if len(d):
                        direct[:, k] = d
            scan = reader.scan  # its span arrays as they are (memory-mapped): never copied
            self.batch = require().FileBatch(
                fd,
                loader,
                self.mapped,
                np.asarray([f for f, _, _ in arrays], np.int64),
                [fr for _, _, fr in arrays],
                scan.starts,
                scan.ends,
                direct,
                np.asarray([f for f, _ in ints], np.int64),
                _columns([v for _, v in ints], n),
            )
            # what fill_spans needs to count a file's samples and to know it is done with them
            self.batch.stats, self.batch.row_bytes = self.stats, self.row_bytes
            self.batch.plain = self.bounded and not self.swapped

    def current(self) -> bool:
        """Whether this is still what its reader's open file keeps (not closed, not reopened)."""
        here = self.here()
        return here is not None and here.batch is self

    def filled(
        self,
        count: int,
        slow: np.ndarray,
        items: np.ndarray,
        labels: np.ndarray,
        rows: np.ndarray,
        columns: list[BatchColumn],
    ) -> None:
        """After :func:`fill_batch` put ``count`` of samples ``items`` in their rows: their
        bytes in native order, their counts, the bounds (once), and the samples it left
        (``slow``) read by the reference."""
        m = len(items)
        for f in self.swapped:
            mine = rows[slow == 0]
            columns[f].data[mine] = columns[f].data[mine].byteswap()
        for _, field, _ in self.arrays:
            field.stats.array_items += count
            field.stats.bytes_read += count * field.spec.dtype.itemsize * prod(field.spec.shape)
        slow_at = np.flatnonzero(slow).tolist() if count < m or not self.arrays else []
        if not self.bounded and len(slow_at) < m:
            self._bound(slow, rows, labels, columns)
        for j in slow_at:
            self._reference(int(items[j]), int(labels[j]), int(rows[j]), columns)

    def _bound(
        self, slow: np.ndarray, rows: np.ndarray, labels: np.ndarray, columns: list[BatchColumn]
    ) -> None:
        j = int(np.argmin(slow))
        sample = tuple([c.value(int(rows[j])) for c in columns])
        bounds = self.reader.bounds
        assert bounds is not None
        check_sample(sample, self.reader.path, int(labels[j]), *bounds)
        self.bounded = True
        if self.batch is not None:
            self.batch.plain = not self.swapped

    def _reference(self, item: int, label: int, row: int, columns: list[BatchColumn]) -> None:
        """Sample ``item`` read, checked and its errors named by the reference path."""
        sample = self.reader.one(item, label)
        for col, value in zip(columns, sample, strict=True):
            col.put(row, value)

    def fill(
        self, items: np.ndarray, labels: np.ndarray, rows: np.ndarray, columns: list[BatchColumn]
    ) -> None:
        """Put samples ``items`` (in range, in offset order; errors naming ``labels``) in rows
        ``rows`` of ``columns`` by :meth:`SpanReader.many`, the reference."""
        got = self.reader.many(items.tolist(), labels.tolist())
        for k, sample in zip(rows.tolist(), got, strict=True):
            for col, value in zip(columns, sample, strict=True):
                col.put(k, value)

    def close(self) -> None:
        """Let go of the file's mapping (its reader is closing the file); returns None."""
        if self.batch is not None:
            self.batch.close()  # no batch reads it again, and its view of the mapping goes
        self.batch = None
        if self.objects is not None:
            self.objects.close()
        if self.mapped is not None:
            # a batch read elsewhere may still hold a view: the mapping goes with it then
            with contextlib.suppress(BufferError):
                self.mapped.close()
            self.mapped = None

    def advise(self, items: np.ndarray) -> None:
        """Ask the kernel to read the spans of samples ``items`` now, asynchronously."""
        for _, field, _ in self.arrays:
            starts, ends = field.starts[items].tolist(), field.ends[items].tolist()
            for lo, hi in zip(starts, ends, strict=True):
                os.posix_fadvise(self.fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)

    @staticmethod
    def _direct(field: ArrayItems) -> np.ndarray:
        """Which of the file's samples ``field`` reads from their payloads (uint8 flags;
        empty: all)."""
        if not field.exceptions and not field.definers:
            return np.zeros(0, np.uint8)
        starts = field.starts.tolist()
        return np.fromiter(
            (field.direct(i, s) for i, s in enumerate(starts)), np.uint8, len(starts)
        )
