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

import mmap
import os
from collections.abc import Callable, Sequence
from math import prod
from typing import Any

import numpy as np

from ..picklekit.compiled import CORE, require
from ..safety.bounds import check_sample
from ..scan.layouts import DecodedLayout
from ..scan.sampleform import SampleForm
from .batch import ARRAYS, INTS, OBJECTS, Allocate, BatchColumn, SampleBatch
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


def _fits(plans: list[Plan], columns: list[BatchColumn]) -> bool:
    """Whether a file holding ``plans`` is read into ``columns`` by :func:`fill_batch`: its
    arrays' columns planned as its arrays, its ints' as int64."""
    for plan, col in zip(plans, columns, strict=True):
        if plan[:1] == ("arrays",):
            if col.kind != ARRAYS or col.data.shape[1:] != plan[1] or col.data.dtype != plan[2]:
                return False
        elif plan[:1] != ("ints",) or col.kind != INTS:
            return False
    return True


def _columns(columns: list[np.ndarray], n: int) -> np.ndarray:
    """``columns`` (each ``n`` int64 values) side by side, C-contiguous ``(n, len(columns))``."""
    if not columns:
        return np.zeros((n, 0), np.int64)
    return np.ascontiguousarray(np.stack(columns, 1), np.int64)


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
        self.reader, self.here, self.fd, self.loader = reader, here, fd, loader
        self.stats = reader.stats
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
        self.row_bytes = sum(f.spec.dtype.itemsize * prod(f.spec.shape) for _, f, _ in self.arrays)
        self.take: Any = require().take_into if compiled else None
        # the file mapped whole, read by memcpy (see SpanLoader.fill_items); None: by preadv
        self.mapped = _mapping(fd, reader.identity.size) if self.arrays else None
        # per array field, which samples are read from their payloads (not an exception, no
        # span defining a shared value) as uint8 flags; empty where all are
        self.direct = [self._direct(field) for _, field, _ in self.arrays]
        # these samples (fixed arrays, int64 ints) all decode to one size and depth: held to
        # the bounds once, by the first one read
        self.bounded = reader.bounds is None
        # the whole file's part of a batch in C (SpanLoader's reads, the ints, the identity),
        # for a batch whose columns fit and arrays that need no byte swap
        self.batch: Any = None
        if self.compiled and not any(f.spec.swap for _, f, _ in self.arrays):
            arrays, ints = self.arrays, self.ints
            n = len(reader.scan.starts)
            direct = np.zeros((0, 0), np.uint8)
            if any(len(d) for d in self.direct):
                direct = np.ones((n, len(arrays)), np.uint8)
                for k, d in enumerate(self.direct):
                    if len(d):
                        direct[:, k] = d
            self.batch = require().FileBatch(
                fd,
                loader,
                self.mapped,
                np.asarray([f for f, _, _ in arrays], np.int64),
                [fr for _, _, fr in arrays],
                _columns([a.starts for _, a, _ in arrays], n),
                _columns([a.ends for _, a, _ in arrays], n),
                direct,
                np.asarray([f for f, _ in ints], np.int64),
                _columns([v for _, v in ints], n),
            )

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
        counts, the bounds (once), and the samples it left (``slow``) read by the reference."""
        m = len(items)
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

    def _reference(self, item: int, label: int, row: int, columns: list[BatchColumn]) -> None:
        """Sample ``item`` read, checked and its errors named by the reference path."""
        sample = self.reader.one(item, label)
        for col, value in zip(columns, sample, strict=True):
            col.put(row, value)

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
        self.loader.same_file(self.fd, labels)  # after the reads: a raced write shows by now
        self.filled(m if not short else m - int(slow.sum()), slow, items, labels, rows, columns)

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
    (its bounds); ``form`` what a sample is made from its field values, ``total`` the dataset's
    sample count.
    """

    def __init__(
        self,
        firsts: Sequence[int],
        is_span: Sequence[bool],
        spans: SpanFiles,
        whole: Callable[[int], DecodedLayout],
        finish: Callable[[tuple[Any, ...], int, int], Any],
        form: SampleForm,
        total: int,
    ) -> None:
        self.firsts = np.asarray(firsts, np.int64)
        self.is_span, self.spans, self.whole, self.finish = list(is_span), spans, whole, finish
        self.nfields, self.total, self.form = len(form.fields), total, form
        # tuples are handed out as read; other forms are built from each sample's values
        self._build: Callable[[tuple[Any, ...]], Any] = (
            tuple if form.kind == "tuple" else form.build
        )
        self._compiled_fill: Any = require().fill_batch if CORE is not None else None
        self._fills: list[FileFill | None] = []
        self._pid = -1
        self._interned: dict[tuple[Plan, ...], list[Plan]] = {}  # files' plans, shared

    def read(self, indices: Sequence[int], allocate: Allocate | None = None) -> SampleBatch:
        """Samples ``indices`` (negative ones count from the end), in request order."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self.total
        # samples are numbered file after file, in offset order within a file: sorting the
        # indices orders the batch by file, then offset
        order = np.argsort(wanted, kind="stable")
        if len(wanted) and (wanted[order[0]] < 0 or wanted[order[-1]] >= n):
            if wanted[order[0]] < -n or wanted[order[-1]] >= n:
                bad = next(int(i) for i in wanted.tolist() if not -n <= i < n)
                raise IndexError(f"sample index {bad} out of range for a dataset of {n} samples")
            wanted = np.where(wanted < 0, wanted + n, wanted)
            order = np.argsort(wanted, kind="stable")
        wanted_o = wanted[order]
        in_order = np.searchsorted(self.firsts, wanted_o, "right") - 1
        items_o = wanted_o - self.firsts[in_order]
        heads = np.flatnonzero(np.diff(in_order, prepend=-1))
        cuts = [*heads.tolist(), len(order)]
        fills = self._process_fills()
        span: list[tuple[FileFill, int, int]] = []
        wholes: list[tuple[int, int, int]] = []
        is_span = self.is_span
        for k, pos in enumerate(in_order[heads].tolist()):
            if is_span[pos]:
                fill = fills[pos]
                if fill is None or fill.here.batch is not fill:  # none yet, or its file closed
                    fill = fills[pos] = self._fill(pos)
                span.append((fill, cuts[k], cuts[k + 1]))
            else:
                wholes.append((pos, cuts[k], cuts[k + 1]))
        plans = list({id(f.plans): f.plans for f, _, _ in span}.values())  # files share one
        decoded: list[DecodedLayout] = []
        # whole files in order of first appearance in the batch (as BlockShuffleSampler plans)
        wholes.sort(key=lambda w: int(order[w[1] : w[2]].min()))
        for pos, a, _ in wholes:  # loaded before the columns are planned: their values say
            got = self.whole(pos)
            decoded.append(got)
            plans.append([_value_plan(col[int(items_o[a])]) for col in got.columns])
        columns = plan_columns(plans, self.nfields, len(wanted), allocate)
        fitting = {id(p): _fits(p, columns) for p in plans[: len(plans) - len(wholes)]}
        fast = [g for g in span if g[0].batch is not None and fitting[id(g[0].plans)]]
        if fast:
            self._fill_batch(fast, len(fast) == len(span), order, items_o, wanted_o, columns)
        for fill, a, b in span if len(fast) < len(span) else ():
            if fill.batch is None or not fitting[id(fill.plans)]:
                fill.fill(items_o[a:b], wanted_o[a:b], order[a:b], columns)
        for (pos, a, b), got in zip(wholes, decoded, strict=True):
            self._gather(pos, got, order[a:b], items_o[a:b], wanted_o[a:b], columns)
        return SampleBatch(columns, len(wanted), self._build, self.form.collated)

    def _process_fills(self) -> list[FileFill | None]:
        """This process's :class:`FileFill` of each file (None: not built yet); a forked
        worker starts with none of its parent's."""
        pid = os.getpid()
        if self._pid != pid:
            self._fills, self._pid = [None] * len(self.is_span), pid
        return self._fills

    def _fill_batch(
        self,
        fast: list[tuple[FileFill, int, int]],
        every: bool,
        order: np.ndarray,
        items_o: np.ndarray,
        wanted_o: np.ndarray,
        columns: list[BatchColumn],
    ) -> None:
        """The files of ``fast`` (each with its run ``a:b`` of the batch in file order) read
        by one compiled call; ``every``: they are the whole batch."""
        if every:
            rows, items, labels = order, items_o, wanted_o
            cuts = np.asarray([a for _, a, _ in fast] + [fast[-1][2]], np.int64)
        else:
            at = np.concatenate([np.arange(a, b) for _, a, b in fast])
            rows, items, labels = order[at], items_o[at], wanted_o[at]
            cuts = np.cumsum([0] + [b - a for _, a, b in fast]).astype(np.int64)
        slow = np.zeros(len(items), np.uint8)
        data = [c.data if c.kind != OBJECTS else None for c in columns]
        counts = self._compiled_fill(
            [f.batch for f, _, _ in fast], cuts, items, rows, labels, data, slow, FILL_GAP
        ).tolist()
        bounds = cuts.tolist()
        for k, (fill, _, _) in enumerate(fast):
            a, b, done = bounds[k], bounds[k + 1], counts[k]
            if done == b - a and fill.bounded:  # the common case, kept short
                fill.stats.array_items += done * len(fill.arrays)
                fill.stats.bytes_read += done * fill.row_bytes
            else:
                fill.filled(done, slow[a:b], items[a:b], labels[a:b], rows[a:b], columns)

    def _fill(self, pos: int) -> FileFill:
        """File ``pos``'s :class:`FileFill`, kept with its reader's file as this process
        opened it (a reader opened anew builds its own)."""
        reader = self.spans.reader(pos)
        here, plan = reader.opened()
        fill = here.batch
        if fill is None:
            fill = here.batch = FileFill(reader, here, plan)
            fill.plans = self._interned.setdefault(tuple(fill.plans), fill.plans)
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
