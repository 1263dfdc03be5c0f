"""Fields whose samples are numpy arrays read straight from their payloads.

:class:`ArrayItems` reads an :class:`~pickleshard.scan.ArrayItem` field (every sample an array
of one dtype and shape, pickled with the framing the scan proved): the payload and, in the same
read, the bytes around it, which must be that framing (else
:class:`~pickleshard.errors.FileChangedError` naming the sample). :class:`ArrayRows` reads the
rows of one big array (``array_row``), which have no framing: the file's identity check after
the reads covers them. Both read through the file's :class:`~pickleshard.io.ByteSource`; many
samples of an array item land in one ``(n, ...)`` block, each sample a view of its row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TruncatedPickleError
from ..io import ByteSource
from ..picklekit.compiled import require
from ..scan import ArrayItem, ArrayRow
from .failures import changed
from .plan import ReaderStats

__all__ = ["ArrayItems", "ArrayRows", "compiled_framing", "same_array"]

_NOT_FRAMED = (
    "the bytes around its array's payload (opcodes, dtype, shape, length) are not those indexed"
)


def same_array(want: Any, got: np.ndarray) -> bool:
    """Whether ``want`` (a real unpickling) is the array ``got`` (read from its payload): the
    same type, dtype and byte order, shape, writeability and bytes."""
    return (
        type(want) is np.ndarray
        and want.dtype == got.dtype
        and want.dtype.byteorder == got.dtype.byteorder
        and want.shape == got.shape
        and want.flags.writeable == got.flags.writeable
        and want.tobytes() == got.tobytes()
    )


def compiled_framing(spec: ArrayItem) -> Any:
    """The compiled reads' form of ``spec``'s framing (``_cscan.Framing``)."""
    return require().Framing(
        spec.head, spec.tail, flat(spec.head_masked), flat(spec.tail_masked), spec.bounds
    )


def flat(ranges: tuple[tuple[int, int], ...]) -> np.ndarray:
    """``[lo, hi)`` ranges as one flat int64 array ``lo0, hi0, lo1, ...`` (for the loader)."""
    return np.asarray(ranges, np.int64).reshape(-1)


class ArrayItems:
    """Field ``field`` of a file, an :class:`ArrayItem` ``spec`` checked for this process.

    A sample is read from its payload when it is not one of the spec's exceptions and its span
    defines no value another span refers to (:meth:`direct`); the others are read by span.
    ``verify=False`` reads the payload alone, unchecked (the cost benchmark's baseline).
    """

    def __init__(
        self,
        path: str,
        field: int,
        spec: ArrayItem,
        source: ByteSource,
        stats: ReaderStats,
        starts: np.ndarray,
        ends: np.ndarray,
        definers: dict[int, int],
        verify: bool,
    ) -> None:
        self.path, self.field, self.spec = path, field, spec
        self.source, self.stats, self.verify = source, stats, verify
        self.starts, self.ends = starts, ends  # this field's column of the span arrays
        self.exceptions = frozenset(spec.exceptions)
        self.definers = definers
        self.framing: Any = None  # the compiled Framing, built on the first compiled batch

    def direct(self, i: int, start: int) -> bool:
        """Whether sample ``i`` (its span at ``start``) is read from its payload."""
        return i not in self.exceptions and start not in self.definers

    def one(self, i: int, start: int, end: int, label: int) -> np.ndarray:
        """Sample ``i`` (a :meth:`direct` one), a fresh array; errors name ``label``."""
        spec = self.spec
        out = np.empty(spec.shape, spec.dtype)
        self._fill(out, start, end, label)
        self.stats.bytes_read += out.nbytes
        self.stats.array_items += 1
        if spec.swap:
            out.byteswap(inplace=True)
        if spec.readonly:
            out.flags.writeable = False
        return out

    def many(self, idx: list[int], labels: list[int], loader: Any = None) -> list[Any]:
        """Samples ``idx`` (in offset order) as views of the rows of one new array; None for a
        sample that is not :meth:`direct` (the caller reads it by span). With the compiled
        ``loader`` (``_cscan.SpanLoader``) and checks on, the rows are filled in one call."""
        spec = self.spec
        n = len(idx)
        rows = np.empty((n, *spec.shape), spec.dtype)
        starts = self.starts[idx].tolist()
        ends = self.ends[idx].tolist()
        todo = [k for k in range(n) if self.direct(idx[k], starts[k])]
        done = 0
        if loader is not None and self.verify and n:
            if self.framing is None:
                self.framing = compiled_framing(spec)
            fd = self.source.fileno()
            assert fd is not None  # a loader is built only over a source with a descriptor
            done = loader.fill_rows(fd, rows, self.framing, todo, starts, ends, labels)
        for k in todo[done:]:  # the reference; and the rest after a short read, its error named
            self._fill(rows[k, ...], starts[k], ends[k], labels[k])
        self.stats.array_items += len(todo)
        self.stats.bytes_read += len(todo) * (rows.nbytes // max(n, 1))
        if spec.swap:
            rows.byteswap(inplace=True)
        if spec.readonly:
            rows.flags.writeable = False  # before the views are taken: each keeps its own flag
        out: list[Any] = [None] * n
        for k in todo:
            out[k] = rows[k, ...]
        return out

    def _fill(self, out: np.ndarray, start: int, end: int, label: int) -> None:
        """Read the array whose span is ``[start, end)`` into ``out``: its payload, and in the
        same read the bytes around it, which must be the framing the scan proved."""
        spec = self.spec
        payload = out.reshape(-1).view(np.uint8)
        if not self.verify:  # the payload alone, as before the checks (the cost benchmark's)
            if self.source.readinto_at(start + spec.prefix, memoryview(payload.data)) != out.nbytes:
                raise TruncatedPickleError(self.path, "file ends inside an array", offset=start)
            return
        after = end - start - spec.prefix - out.nbytes
        if not 0 <= after <= len(spec.tail) + 9:  # no framing of the template fits this span
            raise changed(self.path, "its span does not fit the array's framing", start, [label])
        data = bytearray(end - start)
        if self.source.readinto_at(start, memoryview(data)) != len(data):
            raise TruncatedPickleError(self.path, "file ends inside an array", offset=start)
        body = spec.prefix + out.nbytes
        if not spec.framing_matches(data[: spec.prefix], data[body:]):
            raise changed(self.path, _NOT_FRAMED, start, [label])
        payload[:] = np.frombuffer(data, np.uint8, out.nbytes, spec.prefix)


class ArrayRows:
    """Field ``field`` of a file read as rows of one big array (``array_row``)."""

    def __init__(
        self,
        path: str,
        field: int,
        spec: ArrayRow,
        source: ByteSource,
        stats: ReaderStats,
        starts: np.ndarray,
        ends: np.ndarray,
    ) -> None:
        self.path, self.field, self.spec = path, field, spec
        self.source, self.stats = source, stats
        self.starts, self.ends = starts, ends

    def one(self, i: int, start: int, end: int, label: int) -> Any:
        """Row ``i`` (its bytes ``[start, end)``), a fresh array (a 0-d one as its scalar)."""
        spec = self.spec
        out = np.empty(spec.row_shape, spec.dtype)
        view = memoryview(out.reshape(-1).view(np.uint8).data)
        got = self.source.readinto_at(start, view)
        self.stats.bytes_read += got
        if got != end - start:
            raise TruncatedPickleError(self.path, "file ends inside an array row", offset=start)
        if spec.swap:
            out.byteswap(inplace=True)
        self.stats.array_rows += 1
        return out if out.ndim else out[()]

    def many(self, idx: list[int], labels: list[int], loader: Any = None) -> list[Any]:
        """Rows ``idx`` (in offset order), one by one."""
        starts, ends = self.starts[idx].tolist(), self.ends[idx].tolist()
        return [
            self.one(i, s, e, label)
            for i, s, e, label in zip(idx, starts, ends, labels, strict=True)
        ]
