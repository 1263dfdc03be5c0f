"""Fields of small ints, decoded from their opcodes without an unpickler.

:class:`IntColumn` decodes every value of the field at once from one read of the bytes that
hold them (when those lie within a small region of the file, as a list of ints pickled together
does), else each sample's few bytes on its own; either way each value's opcode is checked, and a
byte that is not the small int the scan found raises
:class:`~pickleshard.errors.FileChangedError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TruncatedPickleError
from ..io import ByteSource
from ..picklekit import opcodes as oc
from .failures import changed
from .plan import ReaderStats

__all__ = ["INT_REGION", "IntColumn", "decode_region"]

INT_REGION = 1 << 20  # an int field's values are decoded at once from at most this many bytes


def decode_region(starts: np.ndarray, ends: np.ndarray) -> tuple[int, int] | None:
    """The ``[lo, hi)`` an int field's values are decoded from at once (the one read that
    builds an :class:`IntColumn`: a remote reader fetches it with its first batches), or None
    when they are spread over too much of the file (then read one by one)."""
    if not len(starts):
        return None
    lo, hi = int(starts.min()), int(ends.max())
    if hi - lo > min(INT_REGION, 16 * int((ends - starts).sum())):
        return None
    return lo, hi


class IntColumn:
    """Int field ``field`` of a file; :attr:`values` holds every value when they were decoded
    at once (built with the file's plan, so the decoding is one read per process)."""

    def __init__(
        self,
        path: str,
        field: int,
        source: ByteSource,
        stats: ReaderStats,
        starts: np.ndarray,
        ends: np.ndarray,
    ) -> None:
        self.path, self.field, self.source, self.stats = path, field, source, stats
        self.starts, self.ends = starts, ends
        self.values = self._decode()

    def one(self, i: int, start: int, end: int, label: int) -> int:
        """Sample ``i``'s value (its opcode at ``[start, end)``); errors name ``label``."""
        if self.values is not None:
            return int(self.values[i])
        length = end - start
        data = self.source.read_at(start, min(max(length, 0), 14))
        self.stats.bytes_read += len(data)
        op = data[0] if data else -1
        size = oc.INT_SPAN.get(op)
        if (
            size is None
            or len(data) != length
            or length not in (size, size + 9)
            or (length > size and data[size] != oc.FRAME_OP)
        ):
            raise changed(self.path, "expected a small int here", start, [label])
        self.stats.int_items += 1
        return int.from_bytes(data[1:size], "little", signed=op == oc.BININT_OP)

    def many(self, idx: list[int], labels: list[int], loader: Any = None) -> list[Any]:
        """The values of samples ``idx`` (in offset order)."""
        if self.values is not None:
            got: list[Any] = self.values[idx].tolist()
            return got
        starts, ends = self.starts[idx].tolist(), self.ends[idx].tolist()
        return [
            self.one(i, s, e, label)
            for i, s, e, label in zip(idx, starts, ends, labels, strict=True)
        ]

    def _decode(self) -> np.ndarray | None:
        """Every value, decoded from one read of the bytes that hold them; None when those
        bytes are spread over too much of the file (then read one by one)."""
        st, en = self.starts, self.ends
        where = decode_region(st, en)
        if where is None:
            return None
        lo, hi = where
        region = self.source.read_at(lo, hi - lo)
        self.stats.bytes_read += len(region)
        if len(region) != hi - lo:
            raise TruncatedPickleError(self.path, "file ends inside an int field", offset=lo)
        u8 = np.frombuffer(region + bytes(4), np.uint8)
        at = st - lo
        ops = u8[at]
        b = [u8[at + k].astype(np.int64) for k in (1, 2, 3, 4)]
        small = np.where(ops == oc.BININT1_OP, b[0], b[0] | (b[1] << 8))
        framed = np.flatnonzero(en - st > 5)  # an int and a FRAME header after it, as scanned
        full = (b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)).astype(np.uint32).view(np.int32)
        span = oc.INT_SPAN
        size = np.select([ops == op for op in span], list(span.values()), 0)
        length = en - st  # one opcode, maybe a FRAME header after it (as the scan found)
        if not (((length == size) | (length == size + 9)) & (size > 0)).all() or (
            len(framed) and (u8[at[framed] + size[framed]] != oc.FRAME_OP).any()
        ):
            raise changed(self.path, "expected small ints in a field", lo, None)
        self.stats.int_items += len(st)
        values: np.ndarray = np.where(ops == oc.BININT_OP, full.astype(np.int64), small)
        return values
