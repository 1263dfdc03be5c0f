"""Resolve a dataset source (a directory, a glob, or a list of files) to a sorted file list."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import DatasetNotFoundError, NoPickleFilesError

__all__ = ["PICKLE_PATTERNS", "ResolvedSource", "Source", "resolve_source"]

PICKLE_PATTERNS = ("*.pkl", "*.pickle", "*.pk", "*.p")
INDEX_DIRNAME = ".pickleshard"

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclass(frozen=True)
class ResolvedSource:
    """``root`` is the directory every file is stored relative to; ``files`` are relative paths."""

    root: Path
    files: tuple[str, ...]
    is_directory: bool

    def absolute(self, rel: str) -> Path:
        return self.root / rel


def _has_magic(text: str) -> bool:
    return glob.has_magic(text)


def _scan_directory(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != INDEX_DIRNAME)
        for name in filenames:
            if any(Path(name).match(p) for p in PICKLE_PATTERNS):
                found.append(Path(dirpath) / name)
    return found


def resolve_source(source: Source) -> ResolvedSource:
    """Return the root and sorted relative paths of the pickle files ``source`` names.

    A directory is searched recursively for ``*.pkl``, ``*.pickle``, ``*.pk`` and ``*.p``
    (skipping ``.pickleshard/``); a string with glob characters is expanded (``**`` recurses);
    a list names files directly. The root is the directory itself, or the deepest directory
    common to all files.
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        path = Path(text)
        if path.is_dir():
            files = _scan_directory(path)
            if not files:
                raise NoPickleFilesError(path, PICKLE_PATTERNS)
            root = path.resolve()
            # Relative to the directory as walked, not to resolved targets: a symlinked file
            # keeps its own name (and a dangling one is reported by that name).
            rel = sorted(os.path.relpath(f, path) for f in files)
            return ResolvedSource(root, tuple(rel), True)
        if _has_magic(text):
            matches = [Path(m) for m in glob.glob(text, recursive=True) if Path(m).is_file()]
            if not matches:
                raise NoPickleFilesError(text, [text])
            return _from_files(matches)
        if path.is_file():
            return _from_files([path])
        raise DatasetNotFoundError(path, "directory or file")
    paths = [Path(os.fspath(p)) for p in source]
    if not paths:
        raise NoPickleFilesError("<empty file list>", PICKLE_PATTERNS)
    for p in paths:
        if not p.exists():
            raise DatasetNotFoundError(p, "file")
    return _from_files(paths)


def _from_files(paths: Sequence[Path]) -> ResolvedSource:
    absolute = sorted({p.resolve() for p in paths})
    root = Path(os.path.commonpath([p.parent for p in absolute]))
    rel = tuple(os.path.relpath(p, root) for p in absolute)
    return ResolvedSource(root, rel, False)
