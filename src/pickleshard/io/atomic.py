"""Atomic file writes: a file appears at its destination whole, or not at all.

Every writer of pickleshard that replaces a file (an index header, a converted shard, a split
chunk, a seek-point table, a manifest) writes a temporary file in the destination's directory
(same file system, so the rename is atomic) and ``os.replace``-s it over the destination once
it is complete. On any failure (a full disk, an exception, a ``KeyboardInterrupt``) the
temporary file is removed and the destination is left as it was. A process killed before the
rename leaves its temporary file, named ``{destination}.tmp-{pid}-{random}``, which a resumed
run recognises by the ``.tmp-`` in its name.

- :func:`atomic_path` yields the temporary path, for a writer that opens the file itself.
- :func:`atomic_file` yields the temporary file opened for binary writing.
- :func:`write_bytes_atomic` writes bytes in one call.
- :class:`AtomicWrite` is the same for a writer whose file stays open across calls.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["TMP_MARK", "AtomicWrite", "atomic_file", "atomic_path", "write_bytes_atomic"]

TMP_MARK = ".tmp-"  # in the name of every temporary file these write


class AtomicWrite:
    """A write of ``dest`` through :attr:`tmp`, a new path next to it: :meth:`commit` renames
    it over ``dest``, :meth:`abort` removes it (what a failed commit does too)."""

    def __init__(self, dest: str | os.PathLike[str]) -> None:
        self.dest = Path(dest)
        # the pid says which process wrote it; the random part keeps two writers of one
        # destination apart (threads, or hosts that share the folder and a pid)
        self.tmp = self.dest.with_name(
            f"{self.dest.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        )

    def commit(self) -> None:
        """Rename the temporary file over the destination (removed instead if that fails)."""
        try:
            os.replace(self.tmp, self.dest)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove the temporary file, if there is one (an error doing so is not reported: the
        caller is already handling the error that made it abort)."""
        with contextlib.suppress(OSError):
            self.tmp.unlink()


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary path next to ``dest``, to write a file at; renamed over ``dest`` when the
    block ends without an error, removed when it raises."""
    write = AtomicWrite(dest)
    try:
        yield write.tmp
    except BaseException:
        write.abort()
        raise
    write.commit()


@contextlib.contextmanager
def atomic_file(
    dest: str | os.PathLike[str], *, fsync: bool = False, buffering: int = -1
) -> Iterator[BinaryIO]:
    """A new temporary file next to ``dest``, open for binary writing; closed and renamed over
    ``dest`` when the block ends without an error (after ``os.fsync`` when ``fsync``: the bytes
    are on disk before the name points at them), removed when it raises."""
    with atomic_path(dest) as tmp, open(tmp, "wb", buffering=buffering) as fh:
        yield fh
        if fsync:
            fh.flush()
            os.fsync(fh.fileno())


def write_bytes_atomic(dest: str | os.PathLike[str], data: bytes, *, fsync: bool = False) -> None:
    """Write ``data`` as the whole of ``dest``, atomically (see :func:`atomic_file`)."""
    with atomic_file(dest, fsync=fsync) as fh:
        fh.write(data)
