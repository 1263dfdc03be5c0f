"""Decompress-to-cache: the way to a compressed file that has no seek points of its own.

A single-block xz file or a plain zstd file (one frame, or frames without a seek table) can only
be decoded from its start. :class:`CachedCopy` decodes it once, streaming, into a cache file (see
:mod:`~pickleshard.io.compressed.cachedir` for where, and how a rewrite of the compressed file is
noticed), then serves that copy as a :class:`~pickleshard.io.LocalFile`: random reads are
``pread`` again and the scanner walks its ``mmap``. The copy may take ``cache_bytes`` at most:
a file that decompresses to more (known up front from the xz index or the zstd frame header, or
found while decoding) raises :class:`~pickleshard.errors.DecompressedTooLargeError` naming the
file, its decompressed size and the budget, and leaves no partial copy.
"""

from __future__ import annotations

import lzma
import mmap
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ...errors import CorruptPickleError, DecompressedTooLargeError
from ..base import AccessPattern, ByteSource
from ..identity import FileIdentity
from ..local import LocalFile
from ..reader import open_reader
from .cachedir import cache_file, write_atomically
from .decoders import Decoder, damaged, require

__all__ = ["DEFAULT_CACHE_BYTES", "CachedCopy", "spill"]

DEFAULT_CACHE_BYTES = 16 << 30  # a decompressed copy's budget when none is given
STEP = 1 << 20


def _too_large(name: str, size: int, budget: int, exact: bool) -> DecompressedTooLargeError:
    what = f"{size} bytes" if exact else f"more than {size} bytes"
    return DecompressedTooLargeError(
        name,
        f"decompresses to {what}, over the {budget}-byte budget of a decompressed copy "
        "(cache_bytes); it has no seek points to read it in place: recompress it with several "
        "blocks (xz -T0 or --block-size) or as seekable zstd, or decompress it yourself",
    )


def _xz_chunks(raw: BinaryIO) -> Iterator[bytes]:
    with lzma.open(raw, "rb") as fh:
        while chunk := fh.read(STEP):
            yield chunk


def _zstd_chunks(raw: BinaryIO) -> Iterator[bytes]:
    dctx = require("zstd").ZstdDecompressor()
    obj, pending, inside = dctx.decompressobj(), b"", False
    while chunk := pending or raw.read(STEP):
        pending, inside = b"", True
        yield obj.decompress(chunk)
        if obj.eof:  # the next frame (zstd files may hold several, one after another)
            pending, obj, inside = obj.unused_data, dctx.decompressobj(), False
    if inside:
        raise EOFError("the last zstd frame ends before its end")


class CachedCopy(Decoder):
    """The decompressed copy of ``source`` (a ``kind`` file that is ``identity`` now) in
    ``folder``, made on first open; ``size`` when known up front (else None)."""

    def __init__(
        self,
        kind: str,
        source: ByteSource,
        identity: FileIdentity,
        folder: Path,
        cache_bytes: int,
        size: int | None,
    ) -> None:
        self.kind, self.name = kind, source.name
        if size is not None and size > cache_bytes:
            raise _too_large(source.name, size, cache_bytes, exact=True)
        target = cache_file(folder, source.name, identity, "raw")
        self.how = "cache reused"
        if not target.exists():
            self.how = "cache built"
            write_atomically(target, lambda fh: self._decode(source, fh, cache_bytes, size))
        self._file = LocalFile(target)
        self.size = self._file.size

    def _decode(self, source: ByteSource, out: BinaryIO, budget: int, size: int | None) -> None:
        chunks = _xz_chunks if self.kind == "xz" else _zstd_chunks
        written = 0
        with open_reader(source) as raw:
            try:
                for chunk in chunks(raw):
                    written += len(chunk)
                    if written > budget:
                        raise _too_large(self.name, budget, budget, exact=False)
                    out.write(chunk)
            except DecompressedTooLargeError:
                raise
            except Exception as exc:
                raise damaged(self.kind, self.name, exc, raw.tell()) from None
        if size is not None and written != size:
            raise CorruptPickleError(
                self.name, f"the {self.kind} data decodes to {written} bytes, its index says {size}"
            )

    def readinto(self, offset: int, view: memoryview) -> int:
        return self._file.readinto_at(offset, view)

    def map(self) -> Any:
        return self._file.map()

    def advise(self, pattern: AccessPattern) -> None:
        self._file.advise(pattern)

    def close(self) -> None:
        self._file.close()


def spill(decoder: Decoder, folder: Path) -> Any:
    """All of ``decoder``'s bytes, decoded in order into an unlinked temporary file in
    ``folder`` (the system's temporary folder where that cannot be written) and mapped
    read-only: what a scan walks, held by the page cache rather than this process's memory.
    The file is gone once the map is closed."""
    if decoder.size == 0:
        return b""
    where = folder if os.access(folder, os.W_OK) else None  # None: the system's folder
    with tempfile.TemporaryFile(dir=where) as fh:
        view = memoryview(bytearray(4 * STEP))
        pos = 0
        while pos < decoder.size:
            got = decoder.readinto(pos, view[: min(len(view), decoder.size - pos)])
            if got == 0:
                raise CorruptPickleError(
                    decoder.name, f"the {decoder.kind} data ends after {pos} decompressed bytes"
                )
            fh.write(view[:got])
            pos += got
        fh.flush()
        return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
