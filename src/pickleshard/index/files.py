"""The files table: one row per indexed pickle file, one record per skipped one, and the content
fingerprint that tells a rewrite apart from an untouched file.

A row (:class:`FileEntry`) records the file's identity when it was indexed (size, mtime, ctime,
inode: :attr:`FileEntry.identity`), its :func:`fingerprint`, its sample count and how it is read
(``"span"`` or ``"whole"``). A skipped file (``skip_bad=True``) is a :data:`SkippedFile` record:
its error and the ``os.stat`` identity it had (:func:`skip_record`, :func:`skipped_identity`).
The fingerprint reads the data file through :mod:`pickleshard.io`, never directly.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import FileProblem
from ..io import ByteSource, open_source
from ..io.identity import FileIdentity

__all__ = [
    "FileEntry",
    "SkippedFile",
    "fingerprint",
    "skip_record",
    "skipped_identity",
]

Mode = Literal["span", "whole"]
SkippedFile = dict[str, Any]  # {"path", "error", "message", "size", "mtime_ns", "ctime_ns", "ino"}

_FINGERPRINT_BLOCK = 4096
_FINGERPRINT_BLOCKS = 8


def fingerprint(file: ByteSource | str | os.PathLike[str]) -> str:
    """A fast content fingerprint: BLAKE2b of the size and 8 evenly spread 4 KiB blocks.

    Reads at most 32 KiB whatever the file size, so checking a whole dataset stays cheap; it
    catches rewrites that keep size and mtime unless every changed byte avoids all 8 blocks.
    ``file`` is an open byte source, or a local path (read as a :class:`~pickleshard.io.LocalFile`
    advised ``"random"``: readahead around 8 scattered blocks would fetch far more than 32 KiB).
    Raises :class:`~pickleshard.errors.UnreadableFileError` naming the file.
    """
    if not isinstance(file, ByteSource):
        with open_source(file) as source:
            source.advise("random")
            return fingerprint(source)
    h = hashlib.blake2b(digest_size=16)
    size = file.size
    h.update(size.to_bytes(8, "little"))
    if size <= _FINGERPRINT_BLOCK * _FINGERPRINT_BLOCKS:
        h.update(file.read_at(0, size))
    else:
        step = (size - _FINGERPRINT_BLOCK) // (_FINGERPRINT_BLOCKS - 1)
        for block in file.read_ranges(
            [(k * step, _FINGERPRINT_BLOCK) for k in range(_FINGERPRINT_BLOCKS)]
        ):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One row of the files table. ``path`` is relative to the dataset root.

    ``mode`` is ``"span"`` when the file's samples are read in place (``scan`` holds
    :meth:`ScanResult.meta`, and its rows of the span arrays start at ``span_row``,
    ``ext_row`` and ``record_row``) or ``"whole"`` when the file is unpickled whole (``reason``
    says why). ``decoded_nbytes`` is the file's decoded size: measured for whole files,
    estimated for span files (array rows exactly, object fields from a few samples read by
    span). ``ctime_ns`` and ``ino`` are the file's ``st_ctime_ns`` and ``st_ino`` when
    indexed; None in rows written before they were stored (the staleness check then rests on
    size, mtime and fingerprint alone). ``metadata`` is the file's metadata
    (:func:`pickleshard.scan.filemeta.metadata_to_json`) and ``ambiguity`` the other plausible
    reading of an inferred layout (:meth:`pickleshard.scan.ambiguity.Ambiguity.to_json`); None
    when there is none.
    """

    path: str
    size: int
    mtime_ns: int
    fingerprint: str
    num_samples: int
    decoded_nbytes: int
    layout: str
    fields: tuple[str, ...]
    mode: Mode = "whole"
    reason: str | None = None
    scan: dict[str, Any] | None = None
    span_row: int = -1
    ext_row: int = -1
    record_row: int = -1
    ctime_ns: int | None = None
    ino: int | None = None
    etag: str | None = None  # a remote object's ETag (absent from local rows)
    metadata: dict[str, Any] | None = None
    ambiguity: dict[str, str] | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> FileEntry:
        return cls(**{**obj, "fields": tuple(obj["fields"])})

    @property
    def identity(self) -> FileIdentity:
        """What the file must still be for a read that relies on this row (span or whole)."""
        return FileIdentity(self.size, self.mtime_ns, self.ctime_ns, self.ino, self.etag)


def skip_record(path: str | os.PathLike[str], rel: str, exc: FileProblem) -> SkippedFile:
    """The record of file ``rel`` (found at ``path``), skipped for ``exc``: its error and its
    identity now. The identity comes from ``os.stat``, which opens nothing: a file skipped as
    unreadable (no read permission) still gets one, so the index stays fresh until it changes.
    """
    try:
        now: FileIdentity | None = FileIdentity.of(os.stat(path))
    except OSError:
        now = None
    return {
        "path": rel,
        "error": type(exc).__name__,
        "message": str(exc),
        "size": now.size if now else None,
        "mtime_ns": now.mtime_ns if now else None,
        "ctime_ns": now.ctime_ns if now else None,
        "ino": now.ino if now else None,
    }


def skipped_identity(record: SkippedFile) -> FileIdentity | None:
    """The identity a skipped file had when it was skipped, or None when it could not be
    stat'ed then (it then counts as changed whatever it is now); a record of an index written
    before ctime and inode were stored compares size and mtime alone."""
    if record["size"] is None or record["mtime_ns"] is None:
        return None
    return FileIdentity(
        record["size"], record["mtime_ns"], record.get("ctime_ns"), record.get("ino")
    )
