"""Settling a file's :class:`~pickleshard.read.plan.ReadPlan`: how each field is read in this
process, decided once, after the reads that decide it (an array item checked against a real
unpickling of one sample, an int column decoded), and handed to the compiled loader when every
field is read a way it compiles."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..errors import FileChangedError, PickleshardError
from ..io import ByteSource
from ..io.identity import FileIdentity
from ..picklekit.compiled import require
from ..safety.bounds import _NO_BOUND as NO_BOUND
from ..safety.bounds import _RECURSE_MAX as RECURSE_MAX
from ..scan import ArrayItem, IntItem, ScanResult
from .ints import IntColumn, decode_region
from .items import ArrayItems, ArrayRows, flat, same_array
from .plan import INT, ITEM, ROW, SPAN, FieldReader, ReaderStats, ReadPlan
from .spans import SpanFields

__all__ = ["compile_plan", "fetch_ranges", "make_loader", "settle_plan"]


def settle_plan(
    scan: ScanResult,
    source: ByteSource,
    stats: ReaderStats,
    spans: SpanFields,
    verify: bool,
    general: bool,
) -> ReadPlan:
    """Decide how each field of ``scan``'s file is read: ``array_row`` fields by rows, array
    items from their payloads once proven (:func:`checked_items`), int items from their
    decoded column, the rest by span (every field by span when ``general``)."""
    items = (None,) * len(scan.kinds) if general or not scan.items else scan.items
    hows: list[int] = []
    readers: list[FieldReader | None] = []
    for f, (kind, item) in enumerate(zip(scan.kinds, items, strict=True)):
        st, en = scan.starts[:, f], scan.ends[:, f]
        reader: FieldReader | None = None
        if kind == "array_row":
            spec = scan.arrays[f]
            assert spec is not None
            reader = ArrayRows(scan.path, f, spec, source, stats, st, en)
            how = ROW
        elif isinstance(item, ArrayItem):
            reader = ArrayItems(scan.path, f, item, source, stats, st, en, spans.definers, verify)
            if not checked_items(reader, spans, scan):
                reader = None
            how = SPAN if reader is None else ITEM
        elif isinstance(item, IntItem):
            reader = IntColumn(scan.path, f, source, stats, st, en)
            how = INT
        else:
            how = SPAN
        hows.append(how)
        readers.append(reader)
    return ReadPlan(tuple(hows), tuple(readers))


def fetch_ranges(
    scan: ScanResult, plan: ReadPlan | None, general: bool, items: list[int]
) -> list[tuple[int, int]]:
    """The ``(offset, n)`` a remote reader fetches ahead for samples ``items``: their bytes in
    every field not read from its int column; before the plan is settled (None), also what
    settling it reads, each int column's region, so that the first batch and the file's
    opening are one round trip, not two in a row. Which fields are ints is known before the
    plan is: :func:`settle_plan` reads every :class:`IntItem` field from its column."""
    if plan is not None:
        ints = [f for f, how in enumerate(plan.hows) if how == INT]
    else:
        ints = [] if general else [f for f, it in enumerate(scan.items) if isinstance(it, IntItem)]
    fields = [f for f in range(len(scan.kinds)) if f not in ints]
    starts, ends = scan.starts[items][:, fields], scan.ends[items][:, fields]
    out = list(zip(starts.ravel().tolist(), (ends - starts).ravel().tolist(), strict=True))
    if plan is None:
        for f in ints:
            where = decode_region(scan.starts[:, f], scan.ends[:, f])
            if where is not None:
                out.append((where[0], where[1] - where[0]))
    return out


def checked_items(reader: ArrayItems, spans: SpanFields, scan: ScanResult) -> bool:
    """Whether one of the field's samples read from its payload is the array that unpickling
    its span gives (under the reader's policy); if not (a damaged file the scan could not
    tell) the field is read by span, so errors surface as they would there. A changed file is
    raised: the plan is settled again by the next read. The check is not counted as a read."""
    f, stats = reader.field, reader.stats
    t = next(i for i in range(scan.num_samples) if i not in reader.exceptions)
    before = replace(stats)
    try:
        want = spans.check_read(t, f, t)
        got = reader.one(t, int(scan.starts[t, f]), int(scan.ends[t, f]), t)
        return same_array(want, got)
    except FileChangedError:
        raise
    except PickleshardError:
        return False
    finally:
        vars(stats).update(vars(before))


def compile_plan(
    plan: ReadPlan, loader: Any, scan: ScanResult, definers: dict[int, int]
) -> ReadPlan:
    """``plan``, given to the compiled ``loader`` (``_cscan.SpanLoader``, or None) when every
    field is read the way it compiles (at most one by span, ints with decoded values, array
    items whose dtype exports a buffer)."""
    if loader is None or sum(h == SPAN for h in plan.hows) > 1:
        return replace(plan, compiled=False, span_field=-1)
    cols: list[int] = []
    items: list[tuple[Any, ...] | None] = []
    ints: list[np.ndarray] = []
    for how, reader in zip(plan.hows, plan.readers, strict=True):
        if isinstance(reader, ArrayItems):
            spec = reader.spec
            try:  # the compiled read fills the array through the buffer protocol
                memoryview(np.empty((0,), spec.dtype))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return replace(plan, compiled=False, span_field=-1)
            nbytes = int(np.prod(spec.shape)) * spec.dtype.itemsize
            fields = (spec.shape, spec.dtype, spec.prefix, nbytes, spec.swap, spec.readonly)
            template = (
                spec.head,
                spec.tail,
                flat(spec.head_masked),
                flat(spec.tail_masked),
                np.asarray(spec.bounds, np.int64),
            )
            items.append((*fields, reader.exceptions, *template))
        elif isinstance(reader, IntColumn) and reader.values is not None:
            ints.append(reader.values)
            items.append(None)
        elif how == SPAN:
            items.append(None)
        else:
            return replace(plan, compiled=False, span_field=-1)
        cols.append(len(ints) - 1 if how == INT else -1)
    table = np.stack(ints, axis=1) if ints else np.zeros((scan.num_samples, 0), np.int64)
    loader.plan(
        scan.starts, list(plan.hows), table.astype(np.int64), cols, items, definers, np.empty
    )
    span = plan.hows.index(SPAN) if SPAN in plan.hows else -1
    return replace(plan, compiled=True, span_field=span)


def make_loader(
    scan: ScanResult,
    spans: SpanFields,
    hooked: bool,
    identity: FileIdentity | None,
    stale: Callable[[str | None, int, list[int]], Exception],
    bounded: tuple[int | None, int | None, Callable[[Any, int], object]] | None = None,
) -> Any:
    """A compiled loader (``_cscan.SpanLoader``) over ``spans``' caches, or None when the file
    has appended pickles or span arrays that are not int64. ``hooked``: spans that name a
    global load through ``spans``' lookup; ``identity`` (None: unchecked) is what the file
    must still be, ``stale`` builds the error when it is not. ``bounded``: ``(max_bytes,
    max_depth, check)``, every sample it returns is held to these bounds, tested in the same
    call, ``check(sample, label)`` (``check_sample``) deciding and raising when the test does
    not pass outright."""
    arrays = (scan.ends, scan.memo_base, scan.ext_offsets, scan.ext_keys)
    shift = spans.shifts.single
    if shift is None or any(a.dtype != np.int64 for a in arrays):
        return None
    load = spans.hooked_load if hooked else None
    loader = require().SpanLoader(
        *arrays, spans.heads, scan.protocol, shift, spans.loads(), load, spans.stats
    )
    if identity is not None:
        got = (identity.mtime_ns, identity.ctime_ns, identity.ino)
        mtime, ctime, ino = (-1 if v is None else v for v in got)  # -1: not compared
        loader.identify(identity.size, mtime, ctime, ino, stale)
    if bounded is not None:
        max_bytes, max_depth, check = bounded
        # check_sample's arguments for the compiled test; past 2**62 a bound bounds nothing
        limit = NO_BOUND if max_bytes is None else min(max_bytes, NO_BOUND)
        deepest = NO_BOUND if max_depth is None else min(max_depth, NO_BOUND)
        loader.bound(limit, deepest, deepest <= RECURSE_MAX, check)
    return loader
