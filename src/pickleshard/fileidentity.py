"""A file's identity as the index records it, and the one comparison every read path makes.

A read that relies on an index (span offsets, a whole file's sample count) checks the file with
``os.fstat`` against the size, mtime, ctime and inode recorded when it was indexed; a write
stamps mtime and ctime at write time, so a check *after* the reads also catches a write that
raced them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["FileIdentity"]


@dataclass(frozen=True)
class FileIdentity:
    """What a file must still be for the spans indexed from it to hold (``os.fstat`` fields,
    as the index's files table records them); None: not recorded, not compared."""

    size: int
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    ino: int | None = None

    def differs(self, st: os.stat_result) -> str | None:
        """What of ``st`` differs from this identity, or None when nothing does."""
        if st.st_size != self.size:
            return f"it is {st.st_size} bytes, {self.size} when indexed"
        for name, want in (("mtime", self.mtime_ns), ("ctime", self.ctime_ns)):
            got = getattr(st, f"st_{name}_ns")
            if want is not None and got != want:
                return f"its {name} is {got} ns, {want} when indexed"
        if self.ino is not None and st.st_ino != self.ino:
            return f"it is inode {st.st_ino}, {self.ino} when indexed (another file)"
        return None
