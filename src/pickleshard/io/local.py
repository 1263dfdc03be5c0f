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
from typing import Any

from ..errors import UnreadableFileError
from .base import AccessPattern, ByteSource, _check_range, register_source
from .handles import ProcessLocal
from .identity import FileIdentity

__all__ = ["LocalFile", "map_readonly"]

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


class _OpenFile:
    """One process's descriptor of a :class:`LocalFile`, its size then, and its map once made."""

    __slots__ = ("fd", "map", "size")

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size = fd, size
        self.map: Any | None = None

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)


class _Opener:
    """Opens a :class:`LocalFile`'s descriptor, advised with the file's current pattern (a
    callable apart from the LocalFile, so that the descriptor closes as soon as the file is
    dropped, with no reference cycle to wait for)."""

    __slots__ = ("name", "pattern")

    def __init__(self, name: str, pattern: AccessPattern) -> None:
        self.name, self.pattern = name, pattern

    def __call__(self) -> _OpenFile:
        try:
            fd = os.open(self.name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UnreadableFileError(self.name, f"cannot open: {exc.strerror or exc}") from None
        try:
            opened = _OpenFile(fd, os.fstat(fd).st_size)
        except OSError as exc:
            os.close(fd)
            raise UnreadableFileError(self.name, f"cannot stat: {exc.strerror or exc}") from None
        _fadvise(opened, self.pattern)
        return opened


class LocalFile(ByteSource):
    """A regular local file read by ``pread``. The descriptor opens on first use in each
    process (so a LocalFile pickled into a DataLoader worker opens its own) and its size is
    taken then; ``identity()`` is a fresh ``fstat`` of that descriptor."""

    protocol = "file"

    def __init__(self, path: str | os.PathLike[str], pattern: AccessPattern = "normal") -> None:
        self.name = os.fspath(path)
        self._opener = _Opener(self.name, pattern)
        self._file = ProcessLocal(self._opener, _OpenFile.close)

    @property
    def pattern(self) -> AccessPattern:
        """How the file will be read (the advice given to its descriptor and map)."""
        return self._opener.pattern

    # -- the descriptor -------------------------------------------------------------------
    def fileno(self) -> int:
        """This process's descriptor, opened (and advised) on first use."""
        return self._file.get().fd

    @property
    def size(self) -> int:
        return self._file.get().size

    def close(self) -> None:
        self._file.close()

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "pattern": self.pattern}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["name"], state["pattern"])  # type: ignore[misc]

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
        opened = self._file.get()
        try:
            data = os.pread(opened.fd, n, offset)
        except OSError as exc:
            raise UnreadableFileError(
                self.name, f"cannot read: {exc.strerror or exc}", offset=offset
            ) from None
        if len(data) < n and offset + len(data) < opened.size:  # a short read mid-file: go on
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
        self._opener.pattern = pattern  # what a descriptor opened later is advised
        opened = self._file.peek()
        if opened is not None:
            _fadvise(opened, pattern)
            _madvise(opened, pattern)

    def map(self) -> Any:
        """A read-only mmap of the whole file (``b""`` for an empty one), advised like the
        descriptor; kept until :meth:`close`."""
        opened = self._file.get()
        if opened.map is None:
            if opened.size == 0:
                return b""
            try:
                opened.map = mmap.mmap(opened.fd, 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise UnreadableFileError(self.name, f"cannot map: {exc}") from None
            _madvise(opened, self.pattern)
        return opened.map

    def evict(self) -> None:
        """Drop the file's pages from the page cache (``POSIX_FADV_DONTNEED``): what a cold
        measurement does before each run."""
        os.posix_fadvise(self.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _fadvise(opened: _OpenFile, pattern: AccessPattern) -> None:
    advice = _FADVICE[pattern]
    if advice is not None:
        os.posix_fadvise(opened.fd, 0, 0, advice)


def _madvise(opened: _OpenFile, pattern: AccessPattern) -> None:
    advice = _MADVICE[pattern]
    if advice is not None and opened.map is not None:
        opened.map.madvise(advice)


register_source("file", LocalFile)


def map_readonly(fd: int, size: int) -> Any:
    """File ``fd`` mapped read-only (its first ``size`` bytes), or None where it cannot be
    (an empty file, a pipe, a descriptor mmap refuses): the caller reads it by pread then."""
    if size <= 0:
        return None
    try:
        return mmap.mmap(fd, size, prot=mmap.PROT_READ)
    except (OSError, ValueError, OverflowError):
        return None
