"""The external-reference tables of a scan, and the :class:`ScanResult` they complete.

:func:`element_table` numbers every element (sample field, dict key, opaque field) of a file and
finds, from the walk's memo definitions and GETs, which memo keys each refers to that an earlier
element defined (:class:`~pickleshard.picklekit.memotables.ElementTable`); :func:`externals` lays them out per
(sample, field) as CSR arrays; :func:`assemble` builds the result, with each field's fast path.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotSpanIndexableError
from ..picklekit.memotables import ElementTable, MemoRefusal, sorted_unique
from ..picklekit.walker import Walked
from .fastpath import array_item, int_item
from .inspector import Inspector
from .matching import Field
from .model import ScanResult

__all__ = ["assemble", "element_table", "externals"]


def element_table(w: Walked, leaves: list[tuple[np.ndarray, np.ndarray]]) -> ElementTable:
    starts = np.concatenate([s for s, _ in leaves]) if leaves else np.zeros(0, np.int64)
    ends = np.concatenate([e for _, e in leaves]) if leaves else np.zeros(0, np.int64)
    starts, first = sorted_unique(starts)
    as_np = [
        np.frombuffer(a, np.int64) if len(a) else np.zeros(0, np.int64)
        for a in (w.defs, w.get_offs, w.get_keys)
    ]
    try:
        return ElementTable(starts, ends[first], *as_np)
    except MemoRefusal as exc:
        raise NotSpanIndexableError(w.name, exc.reason, offset=exc.offset) from None


def externals(table: ElementTable, elem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSR externals of every (sample, field) element ``elem`` of ``table`` (-1: none),
    in row-major order; gathered ``_ROWS`` samples at a time to keep temporaries small."""
    counts = np.zeros(elem.size, np.int64)
    if len(table.starts):
        flat = elem.ravel()
        np.subtract(
            table.ext_offsets[1:][flat], table.ext_offsets[:-1][flat], out=counts, where=flat >= 0
        )
    ext_offsets = np.zeros(elem.size + 1, np.int64)
    np.cumsum(counts, out=ext_offsets[1:])
    ext_keys = np.empty(int(ext_offsets[-1]), np.int64)
    nf = elem.shape[1]
    for lo in range(0, len(elem), _ROWS):
        a, b = lo * nf, min(len(elem), lo + _ROWS) * nf
        c = counts[a:b]
        if not c.any():
            continue
        pick = np.maximum(elem.ravel()[a:b], 0)
        base = ext_offsets[a:b]
        src = np.arange(int(base[0]), int(ext_offsets[b]), dtype=np.int64)
        src += np.repeat(table.ext_offsets[pick] - base, c)
        ext_keys[ext_offsets[a] : ext_offsets[b]] = table.ext_keys[src]
    return ext_offsets, ext_keys


_ROWS = 1 << 15  # samples whose externals are gathered at a time


def assemble(
    w: Walked,
    table: ElementTable,
    insp: Inspector,
    layout: str,
    names: tuple[str, ...],
    cols: list[Field],
) -> ScanResult:
    n, nf = len(cols[0].starts), len(cols)
    starts = np.stack([c.starts for c in cols], axis=1).astype(np.int64).reshape(n, nf)
    ends = np.stack([c.ends for c in cols], axis=1).astype(np.int64).reshape(n, nf)
    elem = np.full((n, nf), -1, np.int64)
    for f, c in enumerate(cols):
        if c.array is None:
            elem[:, f] = np.searchsorted(table.starts, c.starts)
    ext_offsets, ext_keys = externals(table, elem)
    items = tuple(
        int_item(insp, starts[:, f], ends[:, f])
        or array_item(
            insp, starts[:, f], ends[:, f], ext_offsets[f::nf], ext_offsets[f + 1 :: nf], ext_keys
        )
        if c.array is None and n >= 2 and len(w.records) == 1 and w.protocol >= 3
        else None
        for f, c in enumerate(cols)
    )
    return ScanResult(
        path=w.name,
        size=w.size,
        protocol=w.protocol,
        layout=layout,
        fields=names,
        kinds=tuple("pickle" if c.array is None else "array_row" for c in cols),
        arrays=tuple(c.array for c in cols),
        starts=starts,
        ends=ends,
        memo_base=np.where(
            elem >= 0, table.base[np.maximum(elem, 0)] if len(table.starts) else -1, -1
        ).astype(np.int64),
        ext_offsets=ext_offsets,
        ext_keys=ext_keys,
        records=np.array(w.records, np.int64).reshape(-1, 3),
        shared=table.shared(),
        bytes_read=w.size - w.skipped + insp.bytes_read,
        engine=w.engine,
        global_ops=w.global_ops,
        items=items if any(a is not None for a in items) else (),
    )
