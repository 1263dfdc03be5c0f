"""Byte sources: the only code that touches storage (see :mod:`pickleshard.io.base`)."""

from .base import (
    COALESCE_GAP,
    AccessPattern,
    ByteSource,
    register_source,
    registered_sources,
)
from .compressed.source import CompressedSource, decompressing
from .counters import storage_read_bytes
from .local import LocalFile
from .opening import open_source
from .options import SourceOptions
from .reader import SourceReader, open_reader
from .remote.source import FsspecSource
from .windowed import WindowedBuffer

__all__ = [
    "COALESCE_GAP",
    "AccessPattern",
    "ByteSource",
    "CompressedSource",
    "FsspecSource",
    "LocalFile",
    "SourceOptions",
    "SourceReader",
    "WindowedBuffer",
    "decompressing",
    "open_reader",
    "open_source",
    "register_source",
    "registered_sources",
    "storage_read_bytes",
]
