"""A span of a pickle file read as a pickle of its own: ``PROTO p`` + bytes ``[start, end)`` + ``STOP``.

A *span* is a byte range ``[start, end)`` of a pickle file holding the opcodes of one element
(one sample's field, a dict key...). Read alone it is not a pickle: :class:`SpanFile` adds the
``PROTO`` and ``STOP`` around it and serves it to an unpickler as a read-only file object,
fetching the bytes in windows from a ``read_at`` callable (the byte source's, an mmap slice...),
so this module never opens anything.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["WINDOW", "ReadAt", "ReadIntoAt", "SpanFile"]

WINDOW = 64 * 1024
"""Bytes a :class:`SpanFile` fetches per read unless told otherwise."""
ReadAt = Callable[[int, int], bytes]
ReadIntoAt = Callable[[int, memoryview], int]


class SpanFile:
    """``PROTO protocol`` + bytes ``[start, end)`` of a file + ``STOP``, as a read-only file.

    Bytes come from ``read_at(offset, n)`` (``os.pread``, an mmap slice...) in windows of
    ``window`` bytes; a read of ``window`` bytes or more goes straight to ``readinto_at`` /
    ``read_at`` without passing through a window, so a large payload is copied once. ``offset``
    is the file offset of the next span byte; :meth:`skip` moves past bytes without reading them.
    ``bytes_read`` counts the bytes fetched from the file.
    """

    def __init__(
        self,
        read_at: ReadAt,
        start: int,
        end: int,
        protocol: int,
        *,
        readinto_at: ReadIntoAt | None = None,
        window: int = WINDOW,
    ) -> None:
        self.start, self.end = start, end  # the span (``_end`` moves on a short read)
        self._read_at = read_at
        self._readinto_at = readinto_at
        self._window = window
        self._end = end
        self._next = start  # file offset of the first byte not yet fetched
        self._buf = bytes((0x80, protocol))
        self._i = 0
        self._tail = b"."
        self._tail_in_buf = False
        self.bytes_read = 0

    @property
    def offset(self) -> int:
        """File offset of the next byte of the span (meaningless once ``STOP`` was returned)."""
        return self._next - (len(self._buf) - self._i) + self._tail_in_buf

    def _fetch(self, n: int) -> bytes:
        n = min(n, self._end - self._next)
        if n <= 0:
            return b""
        data = self._read_at(self._next, n)
        self._next += len(data)
        self.bytes_read += len(data)
        if len(data) < n:  # the file is shorter than the span: never add STOP, let it fail
            self._end, self._tail = -1, b""
        return data

    def _fill(self, need: int) -> None:
        data = self._buf[self._i :] + self._fetch(
            max(self._window, need - (len(self._buf) - self._i))
        )
        if self._next >= self._end and self._tail:
            data, self._tail, self._tail_in_buf = data + self._tail, b"", True
        self._buf, self._i = data, 0

    def read(self, n: int) -> bytes:
        avail = len(self._buf) - self._i
        if n > avail:
            if n - avail >= self._window and self._next + n - avail <= self._end:
                head = self._buf[self._i :]
                self._buf, self._i = b"", 0
                return head + self._fetch(n - avail)
            self._fill(n)
        out = self._buf[self._i : self._i + n]
        self._i += len(out)
        return out

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n, avail = len(view), len(self._buf) - self._i
        direct = n - avail >= self._window and self._next + n - avail <= self._end
        if direct and self._readinto_at is not None:
            view[:avail] = self._buf[self._i :]
            self._buf, self._i = b"", 0
            got = self._readinto_at(self._next, view[avail:])
            self._next += got
            self.bytes_read += got
            return avail + got
        data = self.read(n)
        view[: len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        while True:
            nl = self._buf.find(b"\n", self._i)
            if nl >= 0:
                return self.read(nl + 1 - self._i)
            avail = len(self._buf) - self._i
            self._fill(avail + self._window)
            if len(self._buf) - self._i == avail:
                return self.read(avail)

    def skip(self, n: int) -> None:
        avail = len(self._buf) - self._i
        if n <= avail:
            self._i += n
            return
        self._next += n - avail
        self._buf, self._i = b"", 0
