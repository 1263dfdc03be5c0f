"""Which way into a compressed file: its own seek points (gzip and bz2 by an index built once, xz
blocks, zstd frames with a seek table) or, when it has none, a decompressed copy in the cache."""

from __future__ import annotations

from pathlib import Path

from ...errors import CorruptPickleError
from ..base import ByteSource
from ..identity import FileIdentity
from .cachedir import cache_file
from .copy import CachedCopy
from .decoders import Decoder, IndexedStream, XzBlocks, ZstdFrames, zstd_table
from .kinds import ZstdSeekTable

__all__ = ["open_decoder"]


def open_decoder(
    kind: str, source: ByteSource, identity: FileIdentity, folder: Path, cache_bytes: int
) -> Decoder:
    """The decoder for ``source``, a ``kind`` file that is ``identity`` now; its seek points or
    decompressed copy are kept in ``folder``; a copy may take ``cache_bytes`` at most."""
    if kind in ("gzip", "bz2"):
        suffix = "gzidx" if kind == "gzip" else "bz2idx"  # one dot-free word: see cache_file
        return IndexedStream(kind, source, cache_file(folder, source.name, identity, suffix))
    if kind == "xz":
        blocks = XzBlocks(source)
        if blocks.blocks > 1:
            return blocks
        size = blocks.size
        blocks.close()
        return CachedCopy(kind, source, identity, folder, cache_bytes, size)
    table = zstd_table(source)
    if isinstance(table, ZstdSeekTable):
        return ZstdFrames(source, table)
    if table != "no seek table":
        raise CorruptPickleError(source.name, f"the zstd file ends in {table}")
    return CachedCopy(kind, source, identity, folder, cache_bytes, None)
