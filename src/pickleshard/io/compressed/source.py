"""Compressed pickles (gzip, bz2, xz, zstd) as a byte source of their decompressed bytes.

:func:`decompressing` is what :func:`~pickleshard.io.open_source` applies to every source it
opens: it reads the first bytes, and when they are a compression's magic (whatever the file's
name: a gzip file named ``.pkl`` is gzip) it wraps the source in a :class:`CompressedSource`.
That source works over any :class:`~pickleshard.io.ByteSource` (a local file, a remote one) and
presents the decompressed bytes with random access, so the scanner, span reads, whole-file
loads, split, convert and verify read a compressed file as they read any other:

==========  ====================================================  ==============================
format      how a random read gets its bytes                      first open / later opens
==========  ====================================================  ==============================
gzip        ``rapidgzip`` from the seek point before it (1 MiB)   decode once / load seek points
bz2         ``indexed_bzip2`` from the bz2 block before it        decode once / load offsets
xz          ``python-xz`` from its block's start (multi-block)    reads the xz index only
zstd        ``zstandard``, the frame holding it (seekable format) reads the seek table only
xz, zstd    one block / no seek table: a decompressed copy        decode once / reuse the copy
==========  ====================================================  ==============================

Seek points and copies are kept in ``.pickleshard/compressed/`` next to the file, keyed by the
compressed file's identity (:mod:`~pickleshard.io.compressed.cachedir`). The source's
:meth:`~CompressedSource.identity` is the decompressed size with the compressed file's stamps
(mtime, ctime, inode); the compiled reader gets no descriptor (``fileno()`` is None), so reads go
through the Python path. The decoders need ``pip install 'pickleshard[compressed]'``.
"""

from __future__ import annotations

import bisect
import os
import pickle
import threading
from functools import partial
from pathlib import Path
from typing import Any

from ...errors import CorruptPickleError, PickleshardError, UnreadableFileError
from ..base import AccessPattern, ByteSource, _check_range
from ..handles import ProcessLocal
from ..identity import FileIdentity
from .cachedir import default_cache_dir
from .copy import DEFAULT_CACHE_BYTES, spill
from .decoders import Decoder
from .kinds import SNIFF_BYTES, sniff
from .opening import open_decoder
from .units import unit_cache

__all__ = ["CompressedSource", "decompressing"]


class CompressedSource(ByteSource):
    """The decompressed bytes of ``inner``, a ``kind`` (``"gzip"``, ``"bz2"``, ``"xz"``,
    ``"zstd"``) file. ``cache_dir`` holds its seek points or decompressed copy (default: see
    :func:`~pickleshard.io.compressed.cachedir.default_cache_dir`); a copy may take ``cache_bytes``
    at most. The decoder opens on first use in each process; ``how`` then says how it got its
    seek points (``"seek points built"``, ``"seek points loaded"``, ``"blocks"``, ``"frames"``,
    ``"cache built"``, ``"cache reused"``)."""

    protocol = "compressed"

    def __init__(
        self,
        inner: ByteSource,
        kind: str,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.inner, self.kind, self.name = inner, kind, inner.name
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_bytes = cache_bytes
        self._lock = threading.Lock()
        # A forked child closes the decoder it inherited at the fork: the threads of rapidgzip's
        # and indexed_bzip2's stayed in the parent, and one left open aborts the child at exit.
        # (opened by a function of the source's settings, not a method: no reference cycle, so
        # the decoder closes as soon as the source is dropped)
        self._here = ProcessLocal(
            partial(_open_decoding, inner, kind, self.cache_dir, cache_bytes),
            _Decoding.close,
            close_inherited=True,
        )

    def _folder(self) -> Path:
        return _folder(self.cache_dir, self.name)

    def _open(self) -> Decoder:
        return self._here.get().decoder

    @property
    def how(self) -> str:
        return self._open().how

    def describe(self) -> dict[str, Any]:
        """``{"format": kind, "compressed_size", "size", "seek": how}``: what ``inspect`` says."""
        return {
            "format": self.kind,
            "compressed_size": self.compressed_size,
            "size": self.size,
            "seek": self.how,
        }

    @property
    def compressed_size(self) -> int:
        """The size of the compressed file."""
        return self.inner.size

    @property
    def size(self) -> int:
        return self._open().size

    def readinto_at(self, offset: int, view: memoryview) -> int:
        _check_range(offset, len(view))
        decoder = self._open()
        n = max(0, min(len(view), decoder.size - offset))
        if n == 0:
            return 0
        units = decoder.units
        if units is None:
            with self._lock:  # a decoder has one position
                return decoder.readinto(offset, view[:n])
        done = 0
        while done < n:  # unit by unit, each decoded once and kept in this process's cache
            pos = offset + done
            k = bisect.bisect_right(units, pos) - 1
            lo, hi = units[k], units[k + 1] if k + 1 < len(units) else decoder.size
            key = (self._here.get().key, lo)
            data = unit_cache().get(key, partial(self._decode, decoder, lo, hi))
            m = min(n - done, hi - pos)
            view[done : done + m] = data[pos - lo : pos - lo + m]
            done += m
        return n

    def _decode(self, decoder: Decoder, lo: int, hi: int) -> bytes:
        out = bytearray(hi - lo)
        with self._lock:
            got = decoder.readinto(lo, memoryview(out))
        if got != hi - lo:
            raise CorruptPickleError(
                self.name, f"the {self.kind} unit at decompressed byte {lo} ends after {got} bytes"
            )
        return bytes(out)

    def identity(self) -> FileIdentity:
        """The decompressed size and the compressed file's mtime, ctime and inode. After a
        rewrite of the compressed file, its new decompressed size (decoded again to learn it; a
        rewrite that no longer decodes reports its compressed size)."""
        opened = self._here.get().opened
        now = self.inner.identity()
        size = self.size if now == opened else self._size_of_rewrite(now)
        return FileIdentity(size, now.mtime_ns, now.ctime_ns, now.ino)

    def _size_of_rewrite(self, now: FileIdentity) -> int:
        fresh = pickle.loads(pickle.dumps(self.inner))  # sources pickle by name: a new handle
        try:
            decoder = open_decoder(self.kind, fresh, now, self._folder(), self.cache_bytes)
        except PickleshardError:
            return now.size
        finally:
            fresh.close()
        decoder.close()
        return decoder.size

    def close(self) -> None:
        self._here.close()
        self.inner.close()

    def advise(self, pattern: AccessPattern) -> None:
        self.inner.advise(pattern)
        here = self._here.peek()
        if here is not None:
            here.decoder.advise(pattern)

    def map(self) -> Any:
        """The decompressed bytes, mapped: the decompressed copy's mmap (xz and zstd without
        seek points), or else a temporary file decoded in full on the first call, in this
        process (what a scan walks: it reads every byte anyway; this keeps them out of the
        process's memory). Kept until :meth:`close`."""
        here = self._here.get()
        mapped = here.decoder.map()
        if mapped is None:
            if here.spilled is None:
                with self._lock:
                    here.spilled = spill(here.decoder, self._folder())
            mapped = here.spilled
        return mapped

    def __getstate__(self) -> dict[str, Any]:
        return {
            "inner": self.inner,
            "kind": self.kind,
            "cache_dir": self.cache_dir,
            "cache_bytes": self.cache_bytes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["inner"],
            state["kind"],
            cache_dir=state["cache_dir"],
            cache_bytes=state["cache_bytes"],
        )

    def __repr__(self) -> str:
        return f"CompressedSource({self.kind}, {self.name!r})"


class _Decoding:
    """One process's decoding of a :class:`CompressedSource`: its decoder, the compressed
    file's identity when it opened (and so the key of its decoded units), and the temporary file :meth:`CompressedSource.map`
    decoded in full (None until then)."""

    __slots__ = ("decoder", "key", "opened", "spilled")

    def __init__(self, decoder: Decoder, opened: FileIdentity, key: tuple[object, ...]) -> None:
        self.decoder, self.opened, self.key = decoder, opened, key
        self.spilled: Any = None

    def close(self) -> None:
        if self.spilled is not None and self.spilled != b"":
            self.spilled.close()
        self.spilled = None
        self.decoder.close()


def _folder(cache_dir: str | None, name: str) -> Path:
    return Path(cache_dir) if cache_dir else default_cache_dir(name)


def _open_decoding(
    inner: ByteSource, kind: str, cache_dir: str | None, cache_bytes: int
) -> _Decoding:
    now = inner.identity()
    decoder = open_decoder(kind, inner, now, _folder(cache_dir, inner.name), cache_bytes)
    return _Decoding(decoder, now, (inner.name, now.size, now.mtime_ns, now.ctime_ns, now.ino))


def decompressing(source: ByteSource) -> ByteSource:
    """``source`` itself, or a :class:`CompressedSource` over it when its first bytes are a
    compression's magic. A source that cannot be read yet is returned as is (its error comes
    again on its first read, where it did before)."""
    if isinstance(source, CompressedSource):
        return source
    try:
        head = source.read_at(0, SNIFF_BYTES)
    except UnreadableFileError:
        return source
    kind = sniff(head)
    return source if kind is None else CompressedSource(source, kind)
