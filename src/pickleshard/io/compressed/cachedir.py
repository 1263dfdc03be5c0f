"""Where a compressed file's seek points and decompressed copy are kept, and under what name.

Both are derived data of one compressed file as it is *now*: their names carry a key of the
file's identity (size, mtime, inode), so a rewritten file finds no files under its new key and
rebuilds them (the old ones are deleted when the new ones are written). They live in
``.pickleshard/compressed/`` next to the file (the folder a directory dataset's index lives in,
which the directory scan skips), or, where that cannot be written (a read-only dataset, a URL),
under ``$XDG_CACHE_HOME/pickleshard/compressed`` (``~/.cache``), keyed by the file's full
path. Every file is written to a temporary name and renamed into place, so a reader never sees
a half-written one and a crash leaves none behind.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from ..atomic import atomic_file
from ..identity import FileIdentity

__all__ = ["CACHE_SUBDIR", "cache_file", "default_cache_dir", "write_atomically"]

CACHE_SUBDIR = Path(".pickleshard") / "compressed"


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pickleshard" / "compressed"


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def default_cache_dir(name: str) -> Path:
    """The folder for the derived files of the compressed file ``name`` (a path or URL)."""
    if "://" not in name:
        here = Path(name).resolve().parent / CACHE_SUBDIR
        if _writable(here):
            return here
    return _user_cache()


def cache_file(folder: Path, name: str, identity: FileIdentity, suffix: str) -> Path:
    """The path in ``folder`` of the ``suffix`` file (``"gzidx"``, ``"raw"``...) derived from
    ``name`` as ``identity`` describes it: ``{basename}.{path key}.{identity key}.{suffix}``."""
    where = name if "://" in name else os.path.abspath(name)
    path_key = hashlib.blake2b(where.encode(), digest_size=5).hexdigest()
    stamp = f"{identity.size}:{identity.mtime_ns}:{identity.ino}".encode()
    id_key = hashlib.blake2b(stamp, digest_size=6).hexdigest()
    base = os.path.basename(name.rstrip("/")) or "data"
    return folder / f"{base}.{path_key}.{id_key}.{suffix}"


def _stale_siblings(target: Path) -> list[Path]:
    """Files of an earlier identity of the same compressed file (same path key and suffix)."""
    base, path_key, _, suffix = target.name.rsplit(".", 3)
    return [
        p
        for p in target.parent.glob(f"{glob.escape(base)}.{path_key}.*.{suffix}")
        if p != target and p.name.count(".") == target.name.count(".")
    ]


def write_atomically(target: Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a new temporary file next to ``target``, then rename it to ``target``
    and delete the files of earlier identities; on any error the temporary file is removed
    and the error raised."""
    with atomic_file(target) as fh:
        write(fh)
    for old in _stale_siblings(target):
        with contextlib.suppress(OSError):
            old.unlink()
