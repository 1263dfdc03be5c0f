"""Whether an index still describes the files on disk: which changed, went away or appeared.

An indexed file has changed when its identity (size, ``st_mtime_ns``, ``st_ctime_ns``,
``st_ino``, as :meth:`~pickleshard.io.ByteSource.identity` reports them) differs from its row,
or its :func:`~pickleshard.index.files.fingerprint` does. The ctime catches a rewrite that
restores size and mtime (``os.utime`` sets the ctime too) and changes only bytes the
fingerprint does not sample. Rows of an index written before ctime and inode were stored are
checked without them. There is no cheaper full-content re-check: a copy of the dataset
(``cp -a``, ``rsync -a``, a restored backup) has new inodes and ctimes, so every copied file
reads as changed (and as *relinked*: same size, mtime and fingerprint, which
:class:`~pickleshard.errors.StaleIndexError` points out) and the index must be rebuilt; so does
a file whose mode or owner changed. Moving or renaming the dataset's directory keeps both: its
index stays fresh. A file that cannot be opened is compared by ``os.stat`` alone: changed when
that differs, else its :class:`~pickleshard.errors.UnreadableFileError` is raised.

Skipped files count as indexed: one that changes or goes away makes the index stale. They are
compared by ``os.stat``, which opens nothing (a file skipped as unreadable stays unreadable).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import StaleIndexError, UnreadableFileError
from ..io import open_source
from ..io.identity import FileIdentity
from ..io.listing import ResolvedSource
from ..io.options import SourceOptions
from ..io.remote.listing import is_url
from .files import FileEntry, SkippedFile, fingerprint, skipped_identity

__all__ = ["Staleness", "check_fresh", "find_stale"]


@dataclass(frozen=True)
class Staleness:
    """Relative paths, each list sorted: indexed files that ``changed`` (of which
    ``relinked`` differ only by inode or ctime), were ``removed``, or were ``added``."""

    changed: list[str]
    removed: list[str]
    added: list[str]
    relinked: list[str]

    def __bool__(self) -> bool:
        return bool(self.changed or self.removed or self.added)


_FRESH, _CHANGED, _RELINKED, _REMOVED = range(4)


def _compare(path: Path | str, entry: FileEntry, options: SourceOptions | None) -> int:
    """How the file at ``path`` (opened with ``options``) stands against its row: one open, an
    ``fstat``, and the fingerprint's 8 blocks when the identity matches (or differs by inode
    or ctime alone)."""
    source = open_source(path, options)
    source.advise("random")  # the fingerprint reads 8 scattered blocks
    try:
        source.fileno()  # the open's own error (identity() words it as a failed stat)
        now = source.identity()
    except UnreadableFileError as exc:
        source.close()
        if is_url(path):  # listed a moment ago: a failure to read it, not a removal
            raise
        return _unopenable(Path(path), entry, exc)
    with source:
        if entry.identity.differs_from(now) is None:
            return _FRESH if fingerprint(source) == entry.fingerprint else _CHANGED
        same_bytes = FileIdentity(entry.size, entry.mtime_ns).differs_from(now) is None
        if same_bytes and fingerprint(source) == entry.fingerprint:
            return _RELINKED
        return _CHANGED


def _unopenable(path: Path, entry: FileEntry, error: UnreadableFileError) -> int:
    """A file that cannot be opened, compared by ``os.stat`` (which opens nothing): gone,
    changed (a ``chmod`` moves the ctime), or unchanged, whose contents cannot be checked
    then: ``error`` is raised, naming it."""
    try:
        now = FileIdentity.of(os.stat(path))
    except OSError:
        return _REMOVED
    if entry.identity.differs_from(now) is None:
        raise error
    return _CHANGED


def _skipped_changed(path: Path, record: SkippedFile) -> bool | None:
    """Whether a skipped file differs from its record; None when it cannot be stat'ed now."""
    try:
        now = FileIdentity.of(os.stat(path))
    except OSError:
        return None
    then = skipped_identity(record)
    return then is None or then.differs_from(now) is not None


def find_stale(
    files: list[FileEntry], skipped: list[SkippedFile], source: ResolvedSource
) -> Staleness:
    """The files of ``source`` (opened with its options) that differ from an index's ``files``
    table and ``skipped`` records (see the module docstring for what counts as changed)."""
    indexed = {f.path: f for f in files}
    skips = {s["path"]: s for s in skipped}
    current = set(source.files)
    known = set(indexed) | set(skips)
    removed = sorted(known - current)
    added = sorted(current - known)
    changed: list[str] = []
    relinked: list[str] = []
    for rel in sorted(current & known):
        path = source.absolute(rel)
        if rel in skips:
            if _skipped_changed(path, skips[rel]):  # gone since it was listed: not a change
                changed.append(rel)
            continue
        verdict = _compare(path, indexed[rel], source.options)
        if verdict == _REMOVED:
            removed.append(rel)
        elif verdict != _FRESH:
            changed.append(rel)
            if verdict == _RELINKED:
                relinked.append(rel)
    return Staleness(changed, sorted(removed), added, relinked)


def check_fresh(
    index_path: Path, files: list[FileEntry], skipped: list[SkippedFile], source: ResolvedSource
) -> None:
    """Raise :class:`StaleIndexError` (for the index at ``index_path``) naming every file of
    ``source`` changed, removed or added since the index was built."""
    stale = find_stale(files, skipped, source)
    if stale:
        raise StaleIndexError(
            index_path,
            changed=stale.changed,
            removed=stale.removed,
            added=stale.added,
            relinked=stale.relinked,
        )
