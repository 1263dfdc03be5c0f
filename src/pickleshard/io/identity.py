"""A file's identity as the index records it, and the one comparison every read path makes.

A read that relies on an index (span offsets, a whole file's sample count) checks the file with
``os.fstat`` against the size, mtime, ctime and inode recorded when it was indexed; a write
stamps mtime and ctime at write time, so a check *after* the reads also catches a write that
raced them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

__all__ = ["FileIdentity"]


@dataclass(frozen=True)
class FileIdentity:
    """What a file must still be for the spans indexed from it to hold (``os.fstat`` fields,
    as the index's files table records them; a remote object's ``etag`` and last-modified time
    instead of ctime and inode); None: not recorded, not compared."""

    size: int
    mtime_ns: int | None = None
    ctime_ns: int | None = None
    ino: int | None = None
    etag: str | None = None

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        """The identity ``st`` (an ``os.stat``/``fstat`` result) describes."""
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)

    def differs(self, st: os.stat_result) -> str | None:
        """What of ``st`` differs from this identity, or None when nothing does."""
        return self.differs_from(FileIdentity.of(st))

    def differs_from(self, now: FileIdentity) -> str | None:
        """What of ``now`` (the file's identity today) differs from this recorded one, in
        words, or None when nothing recorded here differs."""
        if now.size != self.size:
            return f"it is {now.size} bytes, {self.size} when indexed"
        for name, want, got in (
            ("mtime", self.mtime_ns, now.mtime_ns),
            ("ctime", self.ctime_ns, now.ctime_ns),
        ):
            if want is not None and got is not None and got != want:
                return f"its {name} is {_when(got, want)}, {_when(want, got)} when indexed"
        if self.ino is not None and now.ino is not None and now.ino != self.ino:
            return f"it is inode {now.ino}, {self.ino} when indexed (another file)"
        if self.etag is not None and now.etag is not None and now.etag != self.etag:
            return f"its ETag is {now.etag}, {self.etag} when indexed (a new version)"
        return None


def _when(ns: int, other: int) -> str:
    """``ns`` (nanoseconds since the epoch) as a time a person reads, in UTC: to the
    microsecond, or to the nanosecond where ``other`` differs from it by less."""
    seconds, rest = divmod(ns, 10**9)  # integers: a float loses the microseconds
    t = datetime.fromtimestamp(seconds, tz=timezone.utc) + timedelta(microseconds=rest // 1000)
    text = t.strftime("%Y-%m-%d %H:%M:%S.%f")
    if abs(ns - other) < 1000 and ns // 1000 == other // 1000:  # same microsecond
        text += f"{ns % 1000:03d}"
    return text + " UTC"
