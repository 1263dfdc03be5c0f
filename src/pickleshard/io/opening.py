"""Opening a byte source: :func:`open_source` picks the registered opener for a path or URL and
hands back what it opened, decompressed when its bytes say it is compressed.

It sits above the sources it opens: the local file, the fsspec objects and the decompressing
source (which builds on the others) each register or wrap without knowing of this module.
"""

from __future__ import annotations

import os

from . import local as _local  # noqa: F401  (registers "file")
from .base import ByteSource, registered_sources, source_opener
from .compressed.source import decompressing
from .identity import FileIdentity
from .options import SourceOptions
from .remote import source as _remote  # noqa: F401  (registers s3://, gs://, http(s)://...)

__all__ = ["open_source"]


def open_source(
    where: str | os.PathLike[str],
    options: SourceOptions | None = None,
    expected: FileIdentity | None = None,
) -> ByteSource:
    """The byte source for ``where``: a local path, or a URL whose scheme a source registered,
    opened with ``options`` (its storage options and block cache; None: fsspec's own
    configuration and no cache; a local path ignores them); a compressed file (by its magic
    bytes) comes decompressed (:mod:`pickleshard.io.compressed.source`). ``expected``: what
    the source should be (an index's record), told to it before its first read
    (:meth:`ByteSource.expect`)."""
    text = os.fspath(where)
    scheme, sep, _ = text.partition("://")
    opener = source_opener(scheme if sep else "file")
    if opener is None:
        known = ", ".join(f"{p}://" for p in registered_sources())
        raise ValueError(f"{text}: no byte source for {scheme}:// (known: {known})")
    source = opener(text) if options is None or not sep else opener(text, options)
    if expected is not None:
        source.expect(expected)
    return decompressing(source)
