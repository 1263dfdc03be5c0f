"""A batch of samples held by field: the buffers a batch read decodes into.

:class:`SampleBatch` is what a dataset's ``__getitems__`` returns: a sequence of samples (so
``default_collate`` and any code that iterates a batch keep working) whose values live in one
:class:`BatchColumn` per field. A field whose samples are arrays of one dtype and shape lives in
one ``(B, *shape)`` array, each sample a view of its row; a field of small ints in one int64
array; any other field in a list. :func:`pickleshard.collate` turns the columns into the batch's
tensors without touching a sample (see :mod:`pickleshard.read.collate`).

A column is planned before the reads (:meth:`BatchColumn.arrays` when every file of the batch
reads the field as arrays of that dtype and shape) and degrades to a list when a value that
does not fit arrives (:meth:`BatchColumn.put`): the batch stays exact whatever the files hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["ARRAYS", "DECODED", "INTS", "OBJECTS", "Allocate", "BatchColumn", "SampleBatch"]

# what a column holds: rows of one array, int64 values, values, or object values decoded into
# a table of their leaves (a read.objectcolumns.ObjectColumn: .value(k), .values(), .collated)
ARRAYS, INTS, OBJECTS, DECODED = range(4)

# (shape, dtype) -> a C-contiguous, writeable array of them (np.empty, or a shared-memory or
# pinned buffer that becomes the batch's tensor as it is)
Allocate = Callable[[tuple[int, ...], np.dtype[Any]], np.ndarray]


def _numpy_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    return np.empty(shape, dtype)


class BatchColumn:
    """One field of a batch of ``size`` samples (see the module). ``data`` is the
    ``(size, *shape)`` array (:data:`ARRAYS`), the int64 values (:data:`INTS`), the list of
    values (:data:`OBJECTS`) or their decoded table (:data:`DECODED`); ``owner`` is what the
    allocator gave for an array column (a tensor whose memory ``data`` is, or ``data``
    itself); ``fresh``: a list no value was put in yet."""

    __slots__ = ("data", "fresh", "kind", "owner", "size")

    def __init__(self, kind: int, data: Any, owner: Any = None) -> None:
        self.kind, self.data, self.size = kind, data, len(data)
        self.owner = data if owner is None else owner
        self.fresh = kind == OBJECTS

    @classmethod
    def arrays(
        cls,
        size: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        allocate: Allocate | None = None,
    ) -> BatchColumn:
        """A column of ``size`` arrays of ``shape`` and ``dtype``, one buffer for them all."""
        got = (allocate or _numpy_empty)((size, *shape), dtype)
        data = np.asarray(got)
        if data.shape != (size, *shape) or data.dtype != dtype or not data.flags.c_contiguous:
            raise ValueError(f"the allocator gave {data.dtype} {data.shape}, not {dtype} {shape}")
        return cls(ARRAYS, data, got)

    @classmethod
    def ints(cls, size: int) -> BatchColumn:
        return cls(INTS, np.zeros(size, np.int64))

    @classmethod
    def objects(cls, size: int) -> BatchColumn:
        return cls(OBJECTS, [None] * size)

    def value(self, k: int) -> Any:
        """Sample ``k``'s value as the sample read alone has it (an array row as a view)."""
        if self.kind == ARRAYS:
            return self.data[k, ...]
        if self.kind == INTS:
            return int(self.data[k])
        if self.kind == DECODED:
            return self.data.value(k)
        return self.data[k]

    def values(self) -> list[Any]:
        """Every sample's value, as :meth:`value` gives each (a column at once: the int64
        values in one ``tolist``, the decoded ones as the decoder holds them)."""
        if self.kind == ARRAYS:
            data = self.data
            return [data[k, ...] for k in range(self.size)]
        if self.kind == INTS:
            return self.data.tolist()  # type: ignore[no-any-return]
        if self.kind == DECODED:
            return self.data.values()  # type: ignore[no-any-return]
        return self.data  # type: ignore[no-any-return]

    @property
    def decodable(self) -> bool:
        """Whether a decoder may fill this column (:meth:`decoding`)."""
        return self.kind == DECODED or (self.kind == OBJECTS and self.fresh)

    def decoding(self, make: Callable[[int], Any]) -> Any:
        """The decoded table of this column, made by ``make(size)`` when it is a fresh list."""
        if self.kind != DECODED:
            assert self.fresh, "values were put in this column"
            self.kind, self.data, self.owner = DECODED, make(self.size), None
        return self.data

    def fits(self, value: Any) -> bool:
        """Whether ``value`` can be held by this column as it is planned."""
        if self.kind == OBJECTS:
            return True
        if self.kind == DECODED:
            return False
        if self.kind == INTS:
            return type(value) is int and -(1 << 63) <= value < 1 << 63
        data = self.data
        return (
            type(value) is np.ndarray
            and value.dtype == data.dtype
            and value.dtype.byteorder == data.dtype.byteorder
            and value.shape == data.shape[1:]
            and value.flags.writeable
        )

    def put(self, k: int, value: Any) -> None:
        """Set sample ``k``'s value, degrading the column to a list first if it does not fit."""
        if not self.fits(value):
            self.degrade()
        self.data[k] = value  # an array is copied into its row
        self.fresh = False

    def put_values(self, rows: list[int], values: list[Any]) -> None:
        """Set the values of samples ``rows`` (``values`` in the same order), as :meth:`put`
        does each: a list's at once, ints into an int64 column by one conversion."""
        if self.kind == OBJECTS:
            data = self.data
            for k, v in zip(rows, values, strict=True):
                data[k] = v
            self.fresh = self.fresh and not rows
            return
        if self.kind == INTS and all(type(v) is int for v in values):
            try:
                self.data[rows] = np.asarray(values, np.int64)
                return
            except OverflowError:  # one past int64: the column degrades to a list
                pass
        for k, v in zip(rows, values, strict=True):
            self.put(k, v)

    def put_rows(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Set the values of samples ``rows`` from an array of them (ints: int64 values)."""
        if self.kind in (OBJECTS, DECODED):
            for k, v in zip(rows.tolist(), values, strict=True):
                self.put(k, v if values.dtype != np.int64 else int(v))
        else:
            self.data[rows] = values

    def __getstate__(self) -> dict[str, Any]:
        # a decoded table lives in a compiled decoder: a batch pickled to another process (a
        # DataLoader worker's, returned uncollated) carries the values themselves
        if self.kind == DECODED:
            values = list(self.data.values())
            return {
                "data": values,
                "fresh": False,
                "kind": OBJECTS,
                "owner": None,
                "size": self.size,
            }
        return {name: getattr(self, name) for name in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def degrade(self) -> None:
        """Hold the values in a list from now on (each array value a view of its row)."""
        if self.kind == DECODED:
            self.data = list(self.data.values())
            self.kind, self.owner, self.fresh = OBJECTS, None, False
        elif self.kind != OBJECTS:
            self.data = [self.value(k) for k in range(self.size)]
            self.kind, self.owner = OBJECTS, None


class SampleBatch(Sequence[Any]):
    """Samples of a batch, in request order, held by field (see the module).

    ``batch[k]`` is sample ``k`` as ``ds[i]`` returns it (built by ``build`` from its field
    values, a tuple by default); :attr:`columns` are the fields. :meth:`collated` puts the
    collated fields together as ``default_collate`` does for such samples (``collated``: a
    list for tuples).
    """

    __slots__ = ("_samples", "build", "collated", "columns", "size")

    def __init__(
        self,
        columns: list[BatchColumn],
        size: int,
        build: Callable[[tuple[Any, ...]], Any] = tuple,
        collated: Callable[[list[Any]], Any] = list,
    ) -> None:
        self.columns, self.size, self.build, self.collated = columns, size, build, collated
        self._samples: list[Any] | None = None  # built by the first iteration, kept for the next

    def values(self, k: int) -> tuple[Any, ...]:
        """Sample ``k``'s field values, as a tuple."""
        return tuple([c.value(k) for c in self.columns])

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, k: int) -> Any: ...

    @overload
    def __getitem__(self, k: slice) -> list[Any]: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(self.size))]
        if not -self.size <= k < self.size:
            raise IndexError(f"sample {k} of a batch of {self.size}")
        k = k + self.size if k < 0 else k
        values = self.values(k)
        return values if self.build is tuple else self.build(values)

    def __iter__(self) -> Iterator[Any]:
        # default_collate walks a batch twice (sizes, then transposed): build the samples once,
        # column by column (a sample at a time cost more than reading it, on small objects)
        if self._samples is None:
            rows = zip(*[c.values() for c in self.columns], strict=True)
            self._samples = list(rows) if self.build is tuple else [self.build(t) for t in rows]
        return iter(self._samples)

    def __eq__(self, other: object) -> bool:
        """Equal to a list or tuple of the same samples (as ``list(self) == other``)."""
        if isinstance(other, SampleBatch | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        kinds = ", ".join(("arrays", "ints", "objects", "decoded")[c.kind] for c in self.columns)
        return f"SampleBatch(size={self.size}, columns=[{kinds}])"


class JoinedBatch(SampleBatch):
    """A batch made of other batches' samples (a mix's batch: each source read as a batch of
    its own): sample ``k`` is sample ``pos[k]`` of ``parts[src[k]]``, handed out without a copy;
    :attr:`columns` gathers the parts' columns into one buffer per field (``allocate``'s) the
    first time they are asked for, by :func:`pickleshard.collate`. The parts' samples share a
    form (the first part's ``build`` and ``collated`` serve them all)."""

    __slots__ = ("_at", "_joined", "allocate", "parts", "pos", "src")

    def __init__(
        self,
        parts: list[SampleBatch],
        src: np.ndarray,
        pos: np.ndarray,
        allocate: Allocate | None = None,
    ) -> None:
        self.parts, self.allocate = parts, allocate
        self.src, self.pos = np.asarray(src, np.intp), np.asarray(pos, np.intp)
        self._at = list(zip(self.src.tolist(), self.pos.tolist(), strict=True))  # per sample
        self.size = len(self.src)
        self.build, self.collated = parts[0].build, parts[0].collated
        self._joined: list[BatchColumn] | None = None
        self._samples = None

    def values(self, k: int) -> tuple[Any, ...]:
        part, at = self._at[k]
        got: tuple[Any, ...] = self.parts[part].values(at)
        return got

    def __iter__(self) -> Iterator[Any]:
        if self._samples is None:
            parts = [list(p) for p in self.parts]
            self._samples = [parts[part][at] for part, at in self._at]
        return iter(self._samples)

    @property
    def columns(self) -> list[BatchColumn]:
        if self._joined is None:
            self._joined = self._join()
        return self._joined

    @columns.setter
    def columns(self, value: list[BatchColumn]) -> None:
        self._joined = value

    def _join(self) -> list[BatchColumn]:
        nfields = len(self.parts[0].columns)
        out = []
        for f in range(nfields):
            cols = [p.columns[f] for p in self.parts]
            first = cols[0]
            same = all(c.kind == first.kind for c in cols)
            if same and first.kind == ARRAYS:
                shape, dtype = first.data.shape[1:], first.data.dtype
                same = all(c.data.shape[1:] == shape and c.data.dtype == dtype for c in cols)
            if same and first.kind in (ARRAYS, INTS):
                col = (
                    BatchColumn.arrays(self.size, shape, dtype, self.allocate)
                    if first.kind == ARRAYS
                    else BatchColumn.ints(self.size)
                )
                for p, c in enumerate(cols):  # one gather per part
                    rows = np.flatnonzero(self.src == p)
                    col.data[rows] = c.data[self.pos[rows]]
            else:
                col = BatchColumn.objects(self.size)
                col.data = [self.values(k)[f] for k in range(self.size)]
            out.append(col)
        return out
