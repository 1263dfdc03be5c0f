"""Which file names a directory or prefix listing takes as pickles."""

from __future__ import annotations

from fnmatch import fnmatch

__all__ = ["ARCHIVE_SUFFIXES", "PICKLE_PATTERNS", "is_pickle_name"]

PICKLE_PATTERNS = ("*.pkl", "*.pickle", "*.pk", "*.p", "*.gz", "*.bz2", "*.xz", "*.zst")

#: compressed tar archives, which the compressed patterns above would otherwise take
ARCHIVE_SUFFIXES = (".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst")


def is_pickle_name(name: str) -> bool:
    """Whether a listed file called ``name`` (no directory part) is taken as a pickle:
    it matches :data:`PICKLE_PATTERNS` and is not a compressed tar archive (``x.tar.gz``)."""
    lowered = name.lower()
    if lowered.endswith(ARCHIVE_SUFFIXES):
        return False
    return any(fnmatch(name, pattern) for pattern in PICKLE_PATTERNS)
