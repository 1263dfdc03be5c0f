"""Local files: ``pread``/``preadv`` on one descriptor, with readahead advice.

A fault in a normally advised mapping makes the kernel read around it (8 MiB on a disk whose
``read_ahead_kb`` is 8192), so a sparse scan through a plain mmap fetches the whole file.
``advise("random")`` sets ``POSIX_FADV_RANDOM`` on the descriptor and ``MADV_RANDOM`` on the
map, after which storage delivers only the pages touched; ``"sequential"`` keeps (and widens)
readahead for dense reads.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from typing import Any

from ..errors import UnreadableFileError
from .base import AccessPattern, ByteSource, _check_range, register_source
from .identity import FileIdentity

__all__ = ["LocalFile"]

_FADVICE = {
    "normal": getattr(os, "POSIX_FADV_NORMAL", None),
    "sequential": getattr(os, "POSIX_FADV_SEQUENTIAL", None),
    "random": getattr(os, "POSIX_FADV_RANDOM", None),
}
_MADVICE = {
    "normal": getattr(mmap, "MADV_NORMAL", None),
    "sequential": getattr(mmap, "MADV_SEQUENTIAL", None),
    "random": getattr(mmap, "MADV_RANDOM", None),
}


class LocalFile(ByteSource):
    """A regular local file read by ``pread``. The descriptor opens on first use in each
    process (so a LocalFile pickled into a DataLoader worker opens its own) and its size is
    taken then; ``identity()`` is a fresh ``fstat`` of that descriptor."""

    protocol = "file"

    def __init__(self, path: str | os.PathLike[str], pattern: AccessPattern = "normal") -> None:
        self.name = os.fspath(path)
        self.pattern: AccessPattern = pattern
        self._fd = -1
        self._pid = -1
        self._size = -1
        self._map: Any | None = None

    # -- the descriptor -------------------------------------------------------------------
    def fileno(self) -> int:
        """This process's descriptor, opened (and advised) on first use."""
        if self._pid != os.getpid():
            self._fd, self._map = -1, None  # inherited across a fork: not ours to use or close
            try:
                fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                raise UnreadableFileError(
                    self.name, f"cannot open: {exc.strerror or exc}"
                ) from None
            try:
                self._size = os.fstat(fd).st_size
            except OSError as exc:
                os.close(fd)
                raise UnreadableFileError(
                    self.name, f"cannot stat: {exc.strerror or exc}"
                ) from None
            self._fd, self._pid = fd, os.getpid()
            self._fadvise(self.pattern)
        return self._fd

    @property
    def size(self) -> int:
        self.fileno()
        return self._size

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd >= 0 and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = -1, -1

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["pattern"])  # type: ignore[misc]

    def __del__(self, _getpid: Callable[[], int] = os.getpid) -> None:
        # os.getpid bound at definition: at interpreter exit module globals (os, contextlib) may
        # be None; nothing to report to then
        if self._fd >= 0 and self._pid == _getpid():
            try:  # noqa: SIM105
                self.close()
            except Exception:
                pass

    # -- reads ------------------------------------------------------------------------------
    def readinto_at(self, offset: int, view: memoryview) -> int:
        _check_range(offset, len(view))
        fd = self.fileno()
        done = 0
        while done < len(view):
            try:
                got = os.preadv(fd, [view[done:]], offset + done)
            except OSError as exc:
                raise UnreadableFileError(
                    self.name, f"cannot read: {exc.strerror or exc}", offset=offset + done
                ) from None
            if got == 0:
                break
            done += got
        return done

    def read_at(self, offset: int, n: int) -> bytes:
        _check_range(offset, n)
        fd = self.fileno()
        try:
            data = os.pread(fd, n, offset)
        except OSError as exc:
            raise UnreadableFileError(
                self.name, f"cannot read: {exc.strerror or exc}", offset=offset
            ) from None
        if len(data) < n and offset + len(data) < self._size:  # a short read mid-file: go on
            return data + self.read_at(offset + len(data), n - len(data))
        return data

    def identity(self) -> FileIdentity:
        fd = self.fileno()  # its own UnreadableFileError ("cannot open") passes through as is
        try:
            st = os.fstat(fd)
        except OSError as exc:  # ESTALE (a file replaced on NFS), EIO
            raise UnreadableFileError(self.name, f"cannot stat: {exc.strerror or exc}") from None
        return FileIdentity.of(st)

    # -- advice and mapping -------------------------------------------------------------------
    def advise(self, pattern: AccessPattern) -> None:
        self.pattern = pattern
        if self._pid == os.getpid():
            self._fadvise(pattern)
            self._madvise(pattern)

    def _fadvise(self, pattern: AccessPattern) -> None:
        advice = _FADVICE[pattern]
        if advice is not None and self._fd >= 0:
            os.posix_fadvise(self._fd, 0, 0, advice)

    def _madvise(self, pattern: AccessPattern) -> None:
        advice = _MADVICE[pattern]
        if advice is not None and self._map is not None:
            self._map.madvise(advice)

    def map(self) -> Any:
        """A read-only mmap of the whole file (``b""`` for an empty one), advised like the
        descriptor; kept until :meth:`close`."""
        fd = self.fileno()
        if self._map is None:
            if self._size == 0:
                return b""
            try:
                self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise UnreadableFileError(self.name, f"cannot map: {exc}") from None
            self._madvise(self.pattern)
        return self._map

    def evict(self) -> None:
        """Drop the file's pages from the page cache (``POSIX_FADV_DONTNEED``): what a cold
        measurement does before each run."""
        os.posix_fadvise(self.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


register_source("file", LocalFile)
