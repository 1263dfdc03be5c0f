"""The next file's examined bytes read while this one is walked: an index build's reads overlapped.

A scan through a :class:`~pickleshard.scan.scratch.ScanScratch` has two halves: the reads that
fill the scratch (a ``pread`` a sample; a dense file storage must deliver: read whole) and the
walk over it (compiled, but building Python objects: the GIL held). One after another, the
first open of 8 files of 2,500 12 KB arrays spent about a third of its time in the reads.
:class:`ScanAhead` runs them a file ahead of the caller, in the compiled core's
:class:`~pickleshard._cscan.FillThread`: while the caller walks file ``k``, that thread fills
file ``k + 1`` into the other of two scratches, and the caller's scan of ``k + 1``
(:meth:`ScanAhead.take`, from :func:`~pickleshard.scan.access.scan_view`) finds it there. The
first file of all the caller reads itself while the thread reads the second, so that both
scratches' pages are faulted in at once (a scratch's first touch, a fault per sample's page,
is most of a first file's read).

The thread is a C thread that never holds the GIL. A Python thread was tried first and gained
nothing: it needs the GIL to start each fill and to return from it, and with the caller's walk
holding it, each of those waits for the interpreter's switch interval (5 ms), longer than the
fill itself (8 fresh first opens each way: 0.056-0.078 s against 0.050-0.080 s without it).
Medians of 8-10 fresh first opens of 8 x 2,500 12 KB arrays, on a loaded 2-core machine:
0.092 s without the C thread, 0.079 s with it, 0.063 s with the caller reading the first file
(protocol 4, files just written); 0.078, 0.071 and 0.055 s at protocol 5.

The file to come is opened, its access pattern chosen
(:func:`~pickleshard.scan.access.choose_pattern`) and its scratch sized in the caller's thread,
when it takes the file before it; only the reads run in the C thread. What was read is used
only for the same file: the path the caller opens, and the same device, inode, size, mtime and
ctime at the caller's ``fstat`` as when the read began. Anything else (a file replaced between
the two, a failed read, a file the caller does not take in order) leaves the caller to read it
itself, as without this module: errors are always the caller's to raise.

Memory: two scratches of at most ``budget`` resident bytes each (the caller's own scratch is
then left untouched). A forked child holds a copy of the thread's record but no thread: there
the thread refuses work and is never joined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..io import ByteSource, storage_read_bytes
from ..io.local import LocalFile
from ..picklekit.compiled import CORE
from .access import choose_pattern, fits_scratch
from .scratch import MOST, WINDOW, ScanScratch
from .sparse import SKIP

__all__ = ["ScanAhead", "Taken"]


@dataclass(frozen=True)
class Taken:
    """A file read ahead: the scratch holding its examined bytes, the access pattern chosen
    for it, and the bytes storage delivered for it (None where that is not counted)."""

    buffer: Any
    pattern: str
    fetched: int | None


@dataclass
class _Pending:
    k: int
    source: LocalFile
    stamp: tuple[int, ...]
    pattern: str
    scratch: ScanScratch
    buffer: Any
    before: int | None


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ScanAhead:
    """Reads ``paths``' examined bytes a file ahead of :meth:`take` (in this order), into two
    scratches of ``budget`` bytes each; :meth:`close` stops the thread and unmaps them. Without
    the compiled core it reads nothing ahead (every :meth:`take` is None)."""

    def __init__(self, paths: Sequence[str], budget: int) -> None:
        self._paths = list(paths)
        self._where = {p: k for k, p in enumerate(self._paths)}
        self._scratches = (ScanScratch(budget), ScanScratch(budget))
        self._filler: Any = CORE.FillThread() if CORE is not None else None
        self._pending: _Pending | None = None
        self._taken = -1  # the caller's last file taken
        # the thread reads the second file while the caller reads the first itself (into the
        # first scratch): the two scratches' pages are faulted in at once, on two cores
        self._start(1)

    def _start(self, k: int) -> None:
        """Start reading file ``k`` (when there is one and it may be read ahead)."""
        if self._filler is None or k >= len(self._paths):
            return
        source = LocalFile(self._paths[k])
        try:
            fd = source.fileno()
            stamp = _stamp(os.fstat(fd))
            pattern = choose_pattern(source)
            scratch = self._scratches[k % 2]
            if not fits_scratch(scratch, source.size, pattern):
                source.close()
                return
            source.advise(pattern)
            buf, how = scratch.prepare(fd, source.size, dense=pattern == "sequential")
            before = storage_read_bytes(self._filler.tid)
            self._filler.submit(fd, buf, source.size, how, WINDOW, MOST, SKIP)
        except Exception:
            source.close()
            return
        self._pending = _Pending(k, source, stamp, pattern, scratch, buf, before)

    def _finish(self) -> tuple[_Pending, int | None] | None:
        """Wait for the read in flight: it and the bytes storage delivered for it, or None when
        there was none or it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        try:
            got = int(self._filler.wait())
        except OSError:
            return None
        finally:
            pending.source.close()
        after = storage_read_bytes(self._filler.tid)
        pending.scratch.filled(got)
        fetched = None if pending.before is None or after is None else after - pending.before
        return pending, fetched

    def take(self, source: ByteSource) -> Taken | None:
        """What was read ahead of ``source`` (the caller's open file), waiting for the read
        while it runs; None when it was not (the caller reads the file). Starts the next file's
        read before it returns. Where the thread is already reading the next file (the first
        file of all), the caller reads this one here, into its scratch. The scratch handed out
        is the caller's until its next :meth:`take` or :meth:`close`."""
        k = self._where.get(source.name)
        fd = source.fileno()
        if k is None or k <= self._taken or fd is None:
            return None
        self._taken = k
        if self._pending is not None and self._pending.k == k + 1:
            return self._read_here(k, source, fd)
        if self._pending is not None and self._pending.k > k:
            return None
        finished = self._finish()  # ours, or one the caller passed over: its scratch is free
        self._start(k + 1)
        if finished is None or finished[0].k != k:
            return None
        pending, fetched = finished
        try:
            if _stamp(os.fstat(fd)) != pending.stamp:
                return None
        except OSError:
            return None
        return Taken(pending.buffer, pending.pattern, fetched)

    def _read_here(self, k: int, source: ByteSource, fd: int) -> Taken | None:
        """File ``k`` read in the caller's thread into scratch ``k % 2`` (the thread's read of
        file ``k + 1`` is in the other), or None where the scratch would not take it."""
        pattern = choose_pattern(source)
        scratch = self._scratches[k % 2]
        if not fits_scratch(scratch, source.size, pattern):
            return None
        source.advise(pattern)
        buf = scratch.read(fd, source.size, dense=pattern == "sequential")
        return Taken(buf, pattern, None)  # its reads are the caller's thread's: counted there

    def close(self) -> None:
        """Wait for a read in flight, stop the thread, unmap the scratches."""
        if self._pending is not None:
            self._finish()
        if self._filler is not None:
            self._filler.close()
        for scratch in self._scratches:
            scratch.close()
