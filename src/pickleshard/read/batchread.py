"""Read a batch of samples as one plan: by file, in offset order, into the batch's columns.

:class:`BatchReader` is what ``PickleDataset.__getitems__`` runs. A batch's indices are checked
once and grouped by file; a column is planned per field (:func:`plan_columns`: one
``(B, *shape)`` buffer where every file of the batch reads the field as arrays of one dtype and
shape, one int64 array where every file holds small ints, a list otherwise); then each file
fills its rows:

- a span-read file whose fields are all arrays read from their payloads and small ints
  (:class:`FileFill`) is read by one compiled call per array field
  (``SpanLoader.fill_items``: the file's spans in offset order, neighbours coalesced into one
  ``preadv``, the GIL released, every payload's framing checked after), its ints taken from the
  column the plan decoded, the file's identity checked once after the reads, and the bounds
  held once (every such sample decodes to the same size);
- any other span-read file reads its samples with :meth:`SpanReader.many`, the reference, and
  puts them in their rows;
- a file read whole is gathered from its decoded columns (an array column by one fancy index).

Whole files are visited in order of first appearance (the order
:class:`~pickleshard.BlockShuffleSampler` plans loads for), after the span-read ones.
"""

from __future__ import annotations

import itertools
import mmap
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..picklekit.compiled import require
from ..safety.bounds import check_sample
from ..scan.layouts import DecodedLayout
from .batch import ARRAYS, INTS, Allocate, BatchColumn, SampleBatch
from .files import SpanFiles
from .ints import IntColumn
from .items import ArrayItems, compiled_framing
from .plan import INT, ITEM, ReadPlan
from .reader import Opened, SpanReader

__all__ = ["FILL_GAP", "BatchReader", "FileFill", "plan_columns"]

# spans of one file closer than this are read by one preadv, the bytes between them included
# (a pickled list's memo and framing opcodes between its items; never a sample's worth)
FILL_GAP = 4096

Plan = tuple[Any, ...]  # ("arrays", shape, dtype) | ("ints",) | () (a list of values)


def _span_plan(plan: ReadPlan, f: int) -> Plan:
    """What a span-read file's ``plan`` holds in field ``f`` for the batch's column."""
    how, reader = plan.hows[f], plan.readers[f]
    if how == ITEM and isinstance(reader, ArrayItems) and not reader.spec.readonly:
        return ("arrays", tuple(reader.spec.shape), np.dtype(reader.spec.dtype))
    if how == INT and isinstance(reader, IntColumn) and reader.values is not None:
        return ("ints",)
    return ()


def _value_plan(value: Any) -> Plan:
    """What a column planned from one of its values would hold."""
    if type(value) is np.ndarray and value.flags.writeable and value.dtype.kind in "biufc":
        return ("arrays", value.shape, value.dtype)
    if type(value) is int and -(1 << 63) <= value < 1 << 63:
        return ("ints",)
    return ()


def plan_columns(
    plans: list[list[Plan]], nfields: int, size: int, allocate: Allocate | None
) -> list[BatchColumn]:
    """The batch's columns, ``size`` rows each, from what each file of the batch holds in each
    field (``plans[file][field]``): a kind all files agree on, else a list of values."""
    columns = []
    for f in range(nfields):
        kinds = {p[f] for p in plans}
        only = kinds.pop() if len(kinds) == 1 else ()
        if only and only[0] == "arrays" and all(d > 0 for d in only[1]):
            columns.append(BatchColumn.arrays(size, only[1], only[2], allocate))
        elif only and only[0] == "ints":
            columns.append(BatchColumn.ints(size))
        else:
            columns.append(BatchColumn.objects(size))
    return columns


def _mapping(fd: int, size: int) -> Any:
    """File ``fd`` mapped read-only (its first ``size`` bytes), or None where it cannot be."""
    if size <= 0:
        return None
    try:
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except (OSError, ValueError, OverflowError):
        return None  # a file that cannot be mapped is read by preadv


class FileFill:
    """How one span-read file's samples are put in a batch's rows, decided once per reader and
    process from its settled plan: :meth:`fill` reads the array fields by the compiled
    ``fill_items`` and takes the ints from their decoded column when :meth:`fits` the batch's
    columns; anything else goes through :meth:`SpanReader.many`, the reference."""

    def __init__(self, reader: SpanReader, here: Opened, plan: ReadPlan) -> None:
        fd, loader = here.fd, here.loader
        self.reader, self.fd, self.loader = reader, fd, loader
        self.plans = [_span_plan(plan, f) for f in range(len(plan.hows))]
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
        self.take: Any = require().take_into if compiled else None
        # the file mapped whole, read by memcpy (see SpanLoader.fill_items); None: by preadv
        self.mapped = _mapping(fd, reader.identity.size) if self.arrays else None
        # per array field, which samples are read from their payloads (not an exception, no
        # span defining a shared value) as uint8 flags; empty where all are
        self.direct = [self._direct(field) for _, field, _ in self.arrays]
        # these samples (fixed arrays, int64 ints) all decode to one size and depth: held to
        # the bounds once, by the first one read
        self.bounded = reader.bounds is None

    def fits(self, columns: list[BatchColumn]) -> bool:
        """Whether the compiled path can fill ``columns`` (every array field planned as
        arrays of this file's dtype and shape)."""
        if not self.compiled:
            return False
        for f, field, _ in self.arrays:
            data = columns[f].data
            if columns[f].kind != ARRAYS or data.shape[1:] != field.spec.shape:
                return False
            if data.dtype != field.spec.dtype:
                return False
        return True

    def fill(
        self, items: np.ndarray, labels: np.ndarray, rows: np.ndarray, columns: list[BatchColumn]
    ) -> None:
        """Put samples ``items`` (in range, in offset order; errors naming ``labels``) in rows
        ``rows`` of ``columns``."""
        reader = self.reader
        if not self.fits(columns):
            got = reader.many(items.tolist(), labels.tolist())
            for k, sample in zip(rows.tolist(), got, strict=True):
                for col, value in zip(columns, sample, strict=True):
                    col.put(k, value)
            return
        m = len(items)
        slow = np.zeros(m, np.uint8)  # samples left to the reference, read one by one
        short = False
        for f, values in self.ints:
            data = columns[f].data
            if columns[f].kind == INTS:
                self.take(values, items, rows, data)
            else:
                columns[f].put_rows(rows, values[items])
        for (f, field, framing), direct in zip(self.arrays, self.direct, strict=True):
            data = columns[f].data
            done = self.loader.fill_items(
                self.fd,
                data,
                framing,
                field.starts,
                field.ends,
                direct,
                items,
                rows,
                labels,
                slow,
                FILL_GAP,
                self.mapped,
            )
            if field.spec.swap:
                mine = rows[slow == 0]
                data[mine] = data[mine].byteswap()
            short = short or done < m
            field.stats.array_items += done
            field.stats.bytes_read += done * data[0].nbytes
        self.loader.same_file(self.fd, labels)  # after the reads: a raced write shows by now
        slow_at = np.flatnonzero(slow).tolist() if short else []
        if not self.bounded and len(slow_at) < m:
            j = int(np.argmin(slow))
            sample = tuple([c.value(int(rows[j])) for c in columns])
            check_sample(sample, reader.path, int(labels[j]), *reader.bounds)  # type: ignore[misc]
            self.bounded = True
        for j in slow_at:  # the reference reads, checks and names the errors
            sample = reader.one(int(items[j]), int(labels[j]))
            for col, value in zip(columns, sample, strict=True):
                col.put(int(rows[j]), value)

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


class BatchReader:
    """Reads batches of a dataset's samples (see the module).

    ``firsts`` is the first global index of each file, ``is_span`` which files are read by
    span (through ``spans``), ``whole(pos)`` a whole-read file's decoded columns (from the
    dataset's cache), ``finish(values, pos, index)`` what a whole-read sample goes through
    (its bounds); ``nfields`` the samples' field count, ``total`` the dataset's.
    """

    def __init__(
        self,
        firsts: Sequence[int],
        is_span: Sequence[bool],
        spans: SpanFiles,
        whole: Callable[[int], DecodedLayout],
        finish: Callable[[tuple[Any, ...], int, int], Any],
        nfields: int,
        total: int,
    ) -> None:
        self.firsts = np.asarray(firsts, np.int64)
        self.is_span, self.spans, self.whole, self.finish = list(is_span), spans, whole, finish
        self.nfields, self.total = nfields, total

    def read(self, indices: Sequence[int], allocate: Allocate | None = None) -> SampleBatch:
        """Samples ``indices`` (negative ones count from the end), in request order."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self.total
        if len(wanted) and (int(wanted.min()) < -n or int(wanted.max()) >= n):
            bad = next(int(i) for i in wanted.tolist() if not -n <= i < n)
            raise IndexError(f"sample index {bad} out of range for a dataset of {n} samples")
        if len(wanted) and wanted.min() < 0:
            wanted = np.where(wanted < 0, wanted + n, wanted)
        files = np.searchsorted(self.firsts, wanted, "right") - 1
        items = wanted - self.firsts[files]
        order = np.lexsort((items, files))  # by file, then item: offset order within a file
        in_order, items_o, wanted_o = files[order], items[order], wanted[order]
        cuts = [0, *(np.flatnonzero(in_order[1:] != in_order[:-1]) + 1).tolist(), len(order)]
        fills: list[tuple[FileFill, int, int]] = []
        wholes: list[tuple[int, np.ndarray]] = []
        is_span = self.is_span
        for a, b in itertools.pairwise(cuts):
            pos = int(in_order[a]) if a < b else -1
            if pos < 0:
                continue
            if is_span[pos]:
                fills.append((self._fill(pos), a, b))
            else:
                wholes.append((pos, order[a:b]))
        plans = [fill.plans for fill, _, _ in fills]
        decoded: list[DecodedLayout] = []
        wholes.sort(key=lambda pg: int(pg[1].min()))  # in order of first appearance
        for pos, g in wholes:  # loaded before the columns are planned: their values say
            got = self.whole(pos)
            decoded.append(got)
            plans.append([_value_plan(col[int(items[g[0]])]) for col in got.columns])
        columns = plan_columns(plans, self.nfields, len(wanted), allocate)
        for fill, a, b in fills:
            fill.fill(items_o[a:b], wanted_o[a:b], order[a:b], columns)
        for (pos, g), got in zip(wholes, decoded, strict=True):
            self._gather(pos, got, g, items[g], wanted[g], columns)
        return SampleBatch(columns, len(wanted))

    def _fill(self, pos: int) -> FileFill:
        """File ``pos``'s :class:`FileFill`, kept with its reader's file as this process
        opened it (a reader opened anew, or a forked worker's, builds its own)."""
        reader = self.spans.reader(pos)
        here, plan = reader.opened()
        fill = here.batch
        if fill is None:
            fill = here.batch = FileFill(reader, here, plan)
        return fill  # type: ignore[no-any-return]

    def _gather(
        self,
        pos: int,
        got: DecodedLayout,
        rows: np.ndarray,
        items: np.ndarray,
        labels: np.ndarray,
        columns: list[BatchColumn],
    ) -> None:
        """Put samples ``items`` of a file read whole in rows ``rows``, each through
        ``finish`` (its bounds)."""
        its, rows_l, labels_l = items.tolist(), rows.tolist(), labels.tolist()
        for k, i, label in zip(rows_l, its, labels_l, strict=True):
            sample = self.finish(tuple([col[i] for col in got.columns]), pos, label)
            for col, value in zip(columns, sample, strict=True):
                col.put(k, value)
