"""Writers of compressed test files, one per way a compressed file can be read (by the
standard library and the package's optional backends; never hand-made streams)."""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable
from pathlib import Path

from pickleshard.io.compressed.kinds import multiblock_xz, seekable_zstd

__all__ = ["COMPRESSORS", "SUFFIX", "compress_to"]


def _zstd_plain(data: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor().compress(data)


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "bz2": bz2.compress,
    "xz-blocks": lambda data: multiblock_xz(data, 16 << 10),
    "xz-single": lambda data: lzma.compress(data, format=lzma.FORMAT_XZ),
    "zstd-seekable": lambda data: seekable_zstd(data, frame_size=16 << 10),
    "zstd-plain": _zstd_plain,
}
SUFFIX = {
    "gzip": ".gz",
    "bz2": ".bz2",
    "xz-blocks": ".xz",
    "xz-single": ".xz",
    "zstd-seekable": ".zst",
    "zstd-plain": ".zst",
}
KIND = {name: name.split("-")[0] for name in COMPRESSORS}


def compress_to(path: Path, data: bytes, how: str) -> Path:
    """Write ``data`` compressed ``how`` (a key of :data:`COMPRESSORS`) to ``path``."""
    path.write_bytes(COMPRESSORS[how](data))
    return path
