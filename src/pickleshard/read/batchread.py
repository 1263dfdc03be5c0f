"""Read a batch of samples as one plan: by file, in offset order, into the batch's columns.

:class:`BatchReader` is what ``PickleDataset.__getitems__`` runs. A batch's indices are sorted
once (samples are numbered file after file, in offset order within a file, so the sort groups
the batch by file and orders each file's part by offset). A column is planned per field
(:func:`plan_columns`: one ``(B, *shape)`` buffer where every file of the batch reads the field as
arrays of one dtype and shape, one int64 array where every file holds small ints, a list
otherwise); then the files fill their rows:

- the span-read files whose fields are all arrays read from their payloads and small ints
  (:class:`~pickleshard.read.filefill.FileFill`) are read by **one compiled call for the whole
  batch** (``_cscan.fill_batch``): per file, its spans copied out of its mapping (or read by
  ``preadv``, neighbours coalesced), the GIL released, every payload's framing checked after the
  reads, its ints taken from the column the plan decoded, and its identity checked once; the
  bounds are held once per file (every such sample decodes to the same size);
- any other span-read file reads its samples with :meth:`SpanReader.many`, the reference, and
  puts them in their rows;
- a file read whole is gathered from its decoded columns.

The common case, a batch whose every file is such a span-read file with the fields of the
first one read (one column plan, *tagged*), is planned in the compiled call too
(``_cscan.fill_spans``: the sort, the files' parts, the rows, the counts), so a batch costs one
Python call and its columns' allocation; the first batches, and any batch it refuses (a file not
opened yet or closed since, another plan, an index out of range), are planned here.

A batch that took far longer than a page-cache copy came from the device: the next one first
asks the kernel for all its spans (``POSIX_FADV_WILLNEED``), so a cold disk sees a queue.
A batch's array columns larger than :data:`STREAM_BYTES` are written by non-temporal stores.
Whole files are visited in order of first appearance (the order
:class:`~pickleshard.BlockShuffleSampler` plans loads for), after the span-read ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..picklekit.compiled import CORE, require
from ..scan.layouts import DecodedLayout
from ..scan.sampleform import SampleForm
from .batch import ARRAYS, INTS, OBJECTS, Allocate, BatchColumn, SampleBatch
from .filefill import FILL_GAP, FileFill, Plan
from .files import SpanFiles
from .objectcolumns import decode_objects
from .whole.gather import WholeGather

__all__ = ["BatchReader", "plan_columns"]

# a batch read slower than this (per sample, plus per byte) did not come from the page cache:
# the next batch advises the kernel of all its spans first (POSIX_FADV_WILLNEED), so a cold
# disk sees a queue of reads rather than one page fault at a time
COLD_SECONDS = 2e-6
COLD_BYTES_PER_SECOND = 1.5e9

# a batch's array bytes past this are copied by non-temporal stores (see _cscan.ps_stream):
# far more than a core's cache holds, so a cached copy would only read each line before writing it
STREAM_BYTES = 4 << 20


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
        self._wholes = WholeGather(finish)  # whole-read files' samples, each bounded once
        self.nfields, self.total, self.form = len(form.fields), total, form
        # tuples are handed out as read; other forms are built from each sample's values
        self._build: Callable[[tuple[Any, ...]], Any] = (
            tuple if form.kind == "tuple" else form.build
        )
        core = require() if CORE is not None else None
        self._compiled_fill: Any = core.fill_batch if core is not None else None
        self._compiled_read: Any = core.fill_spans if core is not None else None
        self._fills: list[FileFill | None] = []
        self._records: list[Any] = []  # each file's compiled record (FileFill.batch), or None
        self._pid = -1
        self._interned: dict[tuple[Plan, ...], list[Plan]] = {}  # files' plans, shared
        self._tags: dict[int, int] = {}  # id of an interned plan -> its tag
        # the column plan the compiled call reads batches into: (tag, [(kind, shape, dtype)])
        self._tagged: tuple[int, list[tuple[int, tuple[int, ...], np.dtype[Any]]]] | None = None
        self._row_bytes = 0  # a sample's bytes in the tagged plan's array columns
        # [advise, took_ns, nbytes, ns per sample, bytes per us]: see _cscan.fill_spans
        self._state = np.array(
            [0, 0, 0, round(COLD_SECONDS * 1e9), round(COLD_BYTES_PER_SECOND / 1e6)], np.int64
        )

    @property
    def cold(self) -> bool:
        """Whether the last batch's bytes came from the device, not the page cache (the next
        batch asks the kernel for its spans first)."""
        return bool(self._state[0])

    @cold.setter
    def cold(self, value: bool) -> None:
        self._state[0] = bool(value)

    def read(self, indices: Sequence[int], allocate: Allocate | None = None) -> SampleBatch:
        """Samples ``indices`` (negative ones count from the end), in request order."""
        if self._tagged is not None and self._compiled_read is not None:
            got = self._read_tagged(indices, allocate)
            if got is not None:
                return got
        return self._read_planned(indices, allocate)

    def _read_tagged(self, indices: Sequence[int], allocate: Allocate | None) -> SampleBatch | None:
        """The batch planned and read by one compiled call (see the module), or None where
        that call refuses it (nothing read)."""
        assert self._tagged is not None
        self._process_fills()
        tag, plan = self._tagged
        wanted = indices if type(indices) is list else np.asarray(indices, np.int64).reshape(-1)
        size = len(wanted)
        columns = [
            BatchColumn.arrays(size, shape, dtype, allocate)
            if kind == ARRAYS
            else BatchColumn.ints(size)
            for kind, shape, dtype in plan
        ]
        got = self._compiled_read(
            self._records,
            self.firsts,
            self.total,
            wanted,
            [c.data for c in columns],
            FILL_GAP,
            tag,
            self._row_bytes * size > STREAM_BYTES,
            self._state,
        )
        if got is False:
            return None
        if got is not None:  # some files' samples to finish (and count) here
            files, cuts, (items, rows, labels), slow, counts, finish = got
            bounds = cuts.tolist()
            for g in np.flatnonzero(finish).tolist():
                fill = self._fills[int(files[g])]
                assert fill is not None
                a, b = bounds[g], bounds[g + 1]
                fill.filled(int(counts[g]), slow[a:b], items[a:b], labels[a:b], rows[a:b], columns)
        return SampleBatch(columns, size, self._build, self.form.collated)

    def _read_planned(self, indices: Sequence[int], allocate: Allocate | None) -> SampleBatch:
        """The batch planned here, file by file (see the module)."""
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
        heads = np.flatnonzero(in_order[1:] != in_order[:-1]) + 1  # each file's first
        heads = np.concatenate(([0], heads)) if len(in_order) else heads
        cuts = [*heads.tolist(), len(order)]
        fills = self._process_fills()
        span: list[tuple[FileFill, int, int]] = []
        wholes: list[tuple[int, int, int]] = []
        is_span = self.is_span
        for k, pos in enumerate(in_order[heads].tolist()):
            if is_span[pos]:
                fill = fills[pos]
                if fill is None or not fill.current():  # none yet, or its file closed
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
            if self._tagged is None and len(plans) == 1 and len(fast) == len(span):
                self._tag(fast[0][0].plans)
        slow = [g for g in span if g[0].batch is None or not fitting[id(g[0].plans)]]
        # object fields decoded into their columns, all files at once; the rest by reference
        for fill, a, b in decode_objects(slow, items_o, wanted_o, order, columns) if slow else ():
            fill.fill(items_o[a:b], wanted_o[a:b], order[a:b], columns)
        for (pos, a, b), got in zip(wholes, decoded, strict=True):
            self._wholes.gather(pos, got, order[a:b], items_o[a:b], wanted_o[a:b], columns)
        return SampleBatch(columns, len(wanted), self._build, self.form.collated)

    def _process_fills(self) -> list[FileFill | None]:
        """This process's :class:`FileFill` of each file (None: not built yet); a forked
        worker starts with none of its parent's."""
        pid = os.getpid()
        if self._pid != pid:
            self._fills, self._pid = [None] * len(self.is_span), pid
            self._records = [None] * len(self.is_span)
        return self._fills

    def _tag(self, plans: list[Plan]) -> None:
        """Read the batches of files holding ``plans`` by the compiled call from now on, into
        the columns planned for them."""
        columns = plan_columns([plans], self.nfields, 1, None)
        if any(c.kind == OBJECTS for c in columns):
            return
        tag = self._tags.setdefault(id(plans), len(self._tags))
        self._tagged = (tag, [(c.kind, c.data.shape[1:], c.data.dtype) for c in columns])
        self._row_bytes = sum(c.data.nbytes for c in columns if c.kind == ARRAYS)

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
        bounds = cuts.tolist()
        if self.cold:  # every span of the batch asked for at once: the device sees a queue
            for k, (fill, _, _) in enumerate(fast):
                fill.advise(items[bounds[k] : bounds[k + 1]])
        nbytes = sum((b - a) * f.row_bytes for f, a, b in fast)
        start = time.perf_counter()
        counts = self._compiled_fill(
            [f.batch for f, _, _ in fast],
            cuts,
            items,
            rows,
            labels,
            data,
            slow,
            FILL_GAP,
            nbytes > STREAM_BYTES,
        ).tolist()
        # a page-cache copy runs at memory speed; far slower, the bytes came from the device
        took = time.perf_counter() - start
        self.cold = took > COLD_SECONDS * len(items) + nbytes / COLD_BYTES_PER_SECOND
        for k, (fill, _, _) in enumerate(fast):
            a, b, done = bounds[k], bounds[k + 1], counts[k]
            if done == b - a and fill.bounded and not fill.swapped:  # the common case
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
        if fill.batch is not None:  # read by the compiled call when its plan is the tagged one
            fill.batch.tag = self._tags.setdefault(id(fill.plans), len(self._tags))
        self._records[pos] = fill.batch
        return fill  # type: ignore[no-any-return]
