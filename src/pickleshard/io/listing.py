"""Resolve a dataset source (a directory, a glob, or a list of files) to a sorted file list."""

from __future__ import annotations

import contextlib
import glob
import os
import stat
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..errors import DatasetNotFoundError, NoPickleFilesError, NotRegularFileError
from .filenames import PICKLE_PATTERNS, SNIFF_BYTES, is_pickle_name, starts_like_pickle
from .found import describe_directory
from .options import SourceOptions
from .remote.listing import is_url, resolve_url, resolve_urls
from .resolved import ResolvedSource

__all__ = ["PICKLE_PATTERNS", "ResolvedSource", "Source", "check_regular_file", "resolve_source"]

INDEX_DIRNAME = ".pickleshard"

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
)


def _file_kind(mode: int) -> str:
    """What ``mode`` (an ``st_mode``) says a path is, in words: ``"a FIFO (named pipe)"``..."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def check_regular_file(path: str | os.PathLike[str]) -> os.stat_result:
    """``os.stat(path)`` (symlinks followed) if ``path`` is a regular file; else raise
    :class:`NotRegularFileError` saying what it is, and what a symlink points to.

    Nothing is opened: opening a FIFO blocks until a writer comes, and a device such as
    ``/dev/zero`` never ends. A missing path raises ``FileNotFoundError`` (callers report it).
    """
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode):
        return st
    what = _file_kind(st.st_mode)
    if os.path.islink(path):
        what = f"a symlink to {os.path.realpath(path)}, {what}"
    raise NotRegularFileError(
        path, f"is {what}, not a regular file; only regular files are read as data files"
    )


def _check_found(path: Path) -> None:
    """Refuse a found file that is not regular; a dangling link is reported when it is read."""
    with contextlib.suppress(FileNotFoundError):
        check_regular_file(path)


def _has_magic(text: str) -> bool:
    return glob.has_magic(text)


def _sniffed(path: Path) -> bool:
    """Whether a file without an extension is a pickle by its first bytes
    (:func:`~pickleshard.io.filenames.starts_like_pickle`); anything that is not a readable
    regular file is not (left out quietly, as a file of another name is)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # opening a FIFO would block
        with open(path, "rb") as fh:
            return starts_like_pickle(fh.read(SNIFF_BYTES))
    except OSError:
        return False


def _scan_directory(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != INDEX_DIRNAME)
        for name in filenames:
            path = Path(dirpath) / name
            if is_pickle_name(name):
                found.append(path)
                _check_found(path)
            elif not Path(name).suffix and _sniffed(path):  # CIFAR-10's data_batch_1
                found.append(path)
    return found


def resolve_source(source: Source, options: SourceOptions | None = None) -> ResolvedSource:
    """Return the root and sorted relative paths of the pickle files ``source`` names, with
    ``options`` (what its files are opened with; a URL is listed with them too).

    A URL (``s3://bucket/prefix/``, ``gs://``, ``https://``...) is listed through fsspec (see
    :mod:`pickleshard.io.remote.listing`); its root is a URL.

    A directory is searched recursively for ``*.pkl``, ``*.pickle``, ``*.pk``, ``*.p`` and the
    compressed ``*.gz``, ``*.bz2``, ``*.xz``, ``*.zst`` (read decompressed, see pickleshard.io;
    compressed tar archives such as ``*.tar.gz`` are not pickles and are passed over), and for
    files without an extension whose first bytes start a pickle (CIFAR-10's ``data_batch_1``;
    others, such as a ``LICENSE``, are left out), skipping ``.pickleshard/``; a string with glob characters is expanded (``**`` recurses);
    a list names files directly. The root is the directory itself, or the deepest directory
    common to all files.
    """
    found = _resolve(source, options)
    return found if options is None else replace(found, options=options)


def _resolve(source: Source, options: SourceOptions | None) -> ResolvedSource:
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if is_url(text):  # s3://, gs://, http(s)://...: listed through fsspec
            return resolve_url(text, INDEX_DIRNAME, options)
        path = Path(text)
        if path.is_dir():
            files = _scan_directory(path)
            if not files:
                found = describe_directory(path, INDEX_DIRNAME)
                raise NoPickleFilesError(path, PICKLE_PATTERNS, found)
            root = path.resolve()
            # Relative to the directory as walked, not to resolved targets: a symlinked file
            # keeps its own name (and a dangling one is reported by that name).
            rel = sorted(os.path.relpath(f, path) for f in files)
            return ResolvedSource(root, tuple(rel), True)
        if _has_magic(text):
            # directories are passed over; any other match must be a regular file
            matches = [Path(m) for m in glob.glob(text, recursive=True) if not Path(m).is_dir()]
            for m in matches:
                _check_found(m)
            matches = [m for m in matches if m.is_file()]
            if not matches:
                raise NoPickleFilesError(text, [text])
            return _from_files(matches)
        if os.path.lexists(path):
            _check_found(path)
        if path.is_file():
            return _from_files([path])
        raise DatasetNotFoundError(path, "directory or file")
    if source and all(is_url(p) for p in source):  # a list of URLs: each object must exist
        return resolve_urls([os.fspath(p) for p in source], options)
    paths = [Path(os.fspath(p)) for p in source]
    if not paths:
        raise NoPickleFilesError("<empty file list>", PICKLE_PATTERNS)
    for p in paths:
        if not p.exists():
            raise DatasetNotFoundError(p, "file")
        check_regular_file(p)
    return _from_files(paths)


def _from_files(paths: Sequence[Path]) -> ResolvedSource:
    absolute = sorted({p.resolve() for p in paths})
    root = Path(os.path.commonpath([p.parent for p in absolute]))
    rel = tuple(os.path.relpath(p, root) for p in absolute)
    return ResolvedSource(root, rel, False)
