"""A buffer over a source that cannot be mapped: indexing and slicing fetch windows on demand."""

from __future__ import annotations

from typing import overload

from .base import ByteSource

__all__ = ["WindowedBuffer"]

WINDOW = 64 * 1024


class WindowedBuffer:
    """``buf[i]`` and ``buf[a:b]`` over ``source``, through the last window read (``window``
    bytes, widened to a slice's length): what the pure-Python scanner walks when a source has
    no ``map()``. Memory: one window (or one slice) at a time."""

    def __init__(self, source: ByteSource, window: int = WINDOW) -> None:
        self.source = source
        self.window = window
        self._lo = 0
        self._data = b""

    def __len__(self) -> int:
        return self.source.size

    def _fetch(self, lo: int, hi: int) -> None:
        if not (self._lo <= lo and hi <= self._lo + len(self._data)):
            self._lo = lo
            self._data = self.source.read_at(lo, max(hi - lo, self.window))

    @overload
    def __getitem__(self, key: int) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> bytes: ...
    def __getitem__(self, key: int | slice) -> int | bytes:
        size = self.source.size
        if isinstance(key, slice):
            lo, hi, step = key.indices(size)
            if step != 1:
                raise ValueError("a WindowedBuffer slice takes no step")
            if hi <= lo:
                return b""
            self._fetch(lo, hi)
            return self._data[lo - self._lo : hi - self._lo]
        i = key + size if key < 0 else key
        if not 0 <= i < size:
            raise IndexError(f"{self.source.name}: byte {key} is outside its {size} bytes")
        self._fetch(i, i + 1)
        return self._data[i - self._lo]
