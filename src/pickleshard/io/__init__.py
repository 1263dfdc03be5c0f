"""Byte sources: the only code that touches storage (see :mod:`pickleshard.io.base`)."""

from .base import (
    COALESCE_GAP,
    AccessPattern,
    ByteSource,
    open_source,
    register_source,
    registered_sources,
)
from .compressed import CompressedSource, decompressing
from .counters import storage_read_bytes
from .local import LocalFile
from .reader import SourceReader, open_reader
from .windowed import WindowedBuffer

__all__ = [
    "COALESCE_GAP",
    "AccessPattern",
    "ByteSource",
    "CompressedSource",
    "LocalFile",
    "SourceReader",
    "WindowedBuffer",
    "decompressing",
    "open_reader",
    "open_source",
    "register_source",
    "registered_sources",
    "storage_read_bytes",
]
