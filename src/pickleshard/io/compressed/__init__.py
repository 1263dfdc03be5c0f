"""Compressed pickles (gzip, bz2, xz, zstd) as a byte source of their decompressed bytes:
:mod:`.source` (the source), :mod:`.kinds` (what a stream is), :mod:`.decoders` (one per way in),
:mod:`.copy` (decompress to a cached copy), :mod:`.cachedir`, :mod:`.units`.
"""

from .source import CompressedSource, decompressing

__all__ = ["CompressedSource", "decompressing"]
