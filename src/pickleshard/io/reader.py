"""A file object over a byte source, for readers that want one (``pickle.Unpickler``)."""

from __future__ import annotations

import io
import os

from .base import ByteSource

__all__ = ["SourceReader", "open_reader"]


class SourceReader(io.RawIOBase):
    """An unbuffered, seekable, read-only file over ``source``: ``readinto`` is one
    :meth:`ByteSource.readinto_at` at the position, so a storage failure raises the source's
    :class:`~pickleshard.errors.UnreadableFileError`. Closing it leaves ``source`` open."""

    def __init__(self, source: ByteSource) -> None:
        super().__init__()
        self.source = source
        self.name = source.name
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(b).cast("B")
        got = self.source.readinto_at(self._pos, view) if self._pos < self.source.size else 0
        self._pos += got
        return got

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.source.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def open_reader(source: ByteSource, buffer_size: int = 1 << 16) -> io.BufferedReader:
    """A buffered file object over ``source`` (reads larger than ``buffer_size`` go straight
    into the caller's buffer); closing it leaves ``source`` open."""
    return io.BufferedReader(SourceReader(source), buffer_size)
