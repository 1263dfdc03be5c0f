"""The decoders behind :class:`~pickleshard.io.compressed.source.CompressedSource`: one class per way
of reaching a decompressed byte at random.

- :class:`IndexedStream`: gzip through ``rapidgzip`` and bz2 through ``indexed_bzip2``. The
  first open decodes the file once, sequentially (which also checks every member's CRC and that
  the stream is complete), and saves the decoder's seek points (``export_index`` / bz2 block
  offsets); later opens load them and decode only from the seek point before each read.
- :class:`XzBlocks`: xz through ``python-xz`` when the file has several blocks (``xz -T0``,
  ``xz --block-size``): a read decodes from the start of its block.
- :class:`ZstdFrames`: zstd in the seekable format, each frame decoded by ``zstandard``.
- :class:`CachedCopy`: anything else (a single-block xz, a plain zstd file): decompressed once
  into a cache file, within a byte budget, then read as a :class:`~pickleshard.io.LocalFile`.

A decoder belongs to the process that opened it (the source reopens one after a fork); its reads
raise :class:`~pickleshard.errors.CorruptPickleError` naming the file when the compressed data is
damaged or cut short, never a library's own exception.
"""

from __future__ import annotations

import bisect
import contextlib
import importlib
import weakref
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...errors import CorruptPickleError, MissingDependencyError, PickleshardError
from ..base import AccessPattern, ByteSource
from ..local import LocalFile
from ..reader import open_reader
from .cachedir import write_atomically
from .kinds import FOOTER, ZstdSeekTable, zstd_seek_table

__all__ = [
    "GZIP_CHUNK",
    "Decoder",
    "IndexedStream",
    "XzBlocks",
    "ZstdFrames",
    "damaged",
    "require",
    "zstd_table",
]

GZIP_CHUNK = 1 << 20  # rapidgzip's chunk: a seek point per MiB, so a random read decodes <= 1 MiB
PASS = 4 << 20  # bytes per read of the first, indexing pass
_PACKAGES = {
    "gzip": ("rapidgzip", "rapidgzip"),
    "bz2": ("indexed_bzip2", "indexed_bzip2"),
    "xz": ("xz", "python-xz"),
    "zstd": ("zstandard", "zstandard"),
}


def require(kind: str, name: str | None = None) -> Any:
    """The library that reads ``kind`` (imported on first use), or a MissingDependencyError
    naming the file ``name`` and saying ``pip install 'pickleshard[compressed]'``."""
    module, package = _PACKAGES[kind]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            package, "compressed", f"reading {kind} files", path=name
        ) from None


def damaged(kind: str, name: str, exc: BaseException, where: int | None = None) -> Exception:
    """The error for ``exc``, raised by a decoder of the ``kind`` file ``name`` (its own
    :class:`~pickleshard.errors.PickleshardError` passes as is); ``where``: the compressed
    offset the decoder had reached, when it says."""
    if isinstance(exc, PickleshardError):
        return exc
    at = f" near compressed byte {where}" if where is not None else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return CorruptPickleError(
        name, f"the {kind} data is damaged or cut short{at} ({first}); the file cannot be read"
    )


class Decoder(ABC):
    """Decompressed bytes ``[0, size)`` of one compressed file, in the process that made it.
    ``how`` says how it got there (``"seek points built"``, ``"seek points loaded"``,
    ``"blocks"``, ``"frames"``, ``"cache built"``, ``"cache reused"``)."""

    size: int
    how: str
    kind: str
    name: str
    #: the decompressed offsets where decoding can start (sorted, from 0), when the format has
    #: such units and the decoder does not keep them decoded itself; None: read directly
    units: tuple[int, ...] | None = None

    @abstractmethod
    def readinto(self, offset: int, view: memoryview) -> int:
        """Fill ``view`` from decompressed ``offset`` (< size); return the bytes written."""

    @abstractmethod
    def close(self) -> None: ...

    def map(self) -> Any | None:
        """A buffer over the decompressed bytes, or None (only a cached copy has one)."""
        return None

    def advise(self, pattern: AccessPattern) -> None:  # noqa: B027 - a hint: no-op by default
        """How the decompressed bytes will be read (only a cached copy's storage cares)."""


class IndexedStream(Decoder):
    """gzip or bz2 read through its library's seek points, kept in ``points``."""

    def __init__(self, kind: str, source: ByteSource, points: Path) -> None:
        lib = require(kind, source.name)
        self.kind, self.name, self.compressed = kind, source.name, source.size
        # a local file by name: the library preads it itself, without the GIL
        target: Any = source.name if isinstance(source, LocalFile) else open_reader(source)
        try:
            if kind == "gzip":
                self._f = lib.RapidgzipFile(target, parallelization=1, chunk_size=GZIP_CHUNK)
            else:
                self._f = lib.IndexedBzip2File(target, parallelization=1)
        except Exception as exc:
            raise damaged(kind, self.name, exc) from None
        # closed when dropped, and at exit (its threads must stop before the interpreter does);
        # a forked child's copy is closed at the fork by the source holding it (a second close
        # does nothing)
        weakref.finalize(self, self._f.close)
        self.how = "seek points loaded" if self._load(points) else "seek points built"
        if self.how == "seek points built":
            self._build(points)
        self.size = self._f.size()
        # the seek points' decompressed offsets: a unit each, decoded once into the unit cache
        # (rapidgzip's own chunk cache is a few chunks; indexed_bzip2 keeps none)
        starts = {int(v) for v in self._f.block_offsets().values() if v < self.size}
        self.units = tuple(sorted(starts | {0}))

    def _load(self, points: Path) -> bool:
        try:
            if self.kind == "gzip":
                with open(points, "rb") as fh:
                    self._f.import_index(fh)
            else:
                table = np.load(points)
                self._f.set_block_offsets({int(a): int(b) for a, b in table})
        except (OSError, ValueError, RuntimeError):
            return False  # missing, or unreadable: rebuilt
        return True

    def _build(self, points: Path) -> None:
        """Decode the whole stream once (checking it) and save the seek points it left."""
        view = memoryview(bytearray(PASS))
        total = 0
        try:
            while got := self._f.readinto(view):
                total += got
            ended = self._compressed_pos()
        except Exception as exc:
            raise damaged(self.kind, self.name, exc, self._compressed_pos()) from None
        # a gzip cut short decodes what it holds without a word: the decoding must end where
        # the file does (rapidgzip and indexed_bzip2 count the bits they consumed)
        if ended != self.compressed or self._f.size() != total:
            raise CorruptPickleError(
                self.name,
                f"the {self.kind} data is cut short or damaged: decoding stopped at compressed "
                f"byte {ended} of {self.compressed} (after {total} decompressed bytes)",
            )
        write = self._write_gzip if self.kind == "gzip" else self._write_bz2
        with contextlib.suppress(OSError):  # unwritable: the next open decodes the file again
            write_atomically(points, write)

    def _write_gzip(self, fh: BinaryIO) -> None:
        self._f.export_index(fh)

    def _write_bz2(self, fh: BinaryIO) -> None:
        offsets = sorted(self._f.block_offsets().items())
        np.save(fh, np.array(offsets, dtype=np.int64).reshape(-1, 2))

    def _compressed_pos(self) -> int | None:
        try:
            return int(self._f.tell_compressed()) // 8  # the libraries count bits
        except Exception:
            return None

    def readinto(self, offset: int, view: memoryview) -> int:
        done = 0
        try:
            self._f.seek(offset)
            while done < len(view) and (got := self._f.readinto(view[done:])):
                done += got
        except Exception as exc:
            raise damaged(self.kind, self.name, exc, self._compressed_pos()) from None
        return done

    def close(self) -> None:
        self._f.close()


class XzBlocks(Decoder):
    """A multi-block xz file through ``python-xz``: a read decodes from its block's start."""

    how = "blocks"

    def __init__(self, source: ByteSource) -> None:
        lib = require("xz", source.name)
        self.name = source.name
        target: Any = source.name if isinstance(source, LocalFile) else open_reader(source)
        try:
            self._f = lib.open(target, "rb")
            self.size = len(self._f)
            self.units = tuple(int(b) for b in self._f.block_boundaries)
            self.blocks = len(self.units)
        except Exception as exc:
            raise damaged("xz", self.name, exc) from None

    def readinto(self, offset: int, view: memoryview) -> int:
        try:
            self._f.seek(offset)
            data = self._f.read(len(view))
        except Exception as exc:
            raise damaged("xz", self.name, exc) from None
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()


class ZstdFrames(Decoder):
    """A zstd file in the seekable format: the frame holding a byte is read and decoded whole
    (the last one decoded is kept)."""

    how = "frames"

    def __init__(self, source: ByteSource, table: ZstdSeekTable) -> None:
        self._zstd = require("zstd", source.name)
        self.source, self.name, self.table = source, source.name, table
        self.size = table.size
        self.units = table.d_offsets[:-1]
        self._dctx = self._zstd.ZstdDecompressor()
        self._frame, self._data = -1, b""

    def _decoded(self, k: int) -> bytes:
        if k != self._frame:
            c, d = self.table.c_offsets, self.table.d_offsets
            want = d[k + 1] - d[k]
            raw = self.source.read_at(c[k], c[k + 1] - c[k])
            try:
                data = self._dctx.decompress(raw, max_output_size=want) if want else b""
            except Exception as exc:
                raise damaged("zstd", self.name, exc, c[k]) from None
            if len(data) != want:
                raise CorruptPickleError(
                    self.name,
                    f"zstd frame {k} at compressed byte {c[k]} decodes to {len(data)} bytes, "
                    f"its seek table says {want}: damaged",
                )
            self._frame, self._data = k, data
        return self._data

    def readinto(self, offset: int, view: memoryview) -> int:
        d = self.table.d_offsets
        done = 0
        while done < len(view) and offset + done < self.size:
            k = bisect.bisect_right(d, offset + done) - 1
            data = self._decoded(k)
            lo = offset + done - d[k]
            n = min(len(view) - done, len(data) - lo)
            view[done : done + n] = data[lo : lo + n]
            done += n
        return done

    def close(self) -> None:
        self._frame, self._data = -1, b""


def zstd_table(source: ByteSource) -> ZstdSeekTable | str:
    """The seek table of the zstd file ``source``, or why it has none."""
    tail = source.read_at(max(0, source.size - FOOTER), FOOTER)
    if len(tail) == FOOTER and tail[-4:] == b"\xb1\xea\x92\x8f":
        frames, descriptor = int.from_bytes(tail[:4], "little"), tail[4]
        span = frames * (12 if descriptor & 0x80 else 8) + FOOTER + 8
        if span <= source.size:
            tail = source.read_at(source.size - span, span)
    return zstd_seek_table(tail, source.size)
