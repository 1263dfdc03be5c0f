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

A dense file that storage must deliver (not in the page cache) is read whole, and its read
waits on the device, not on the CPU: there a second thread reads the file after next as well,
so that the device always has a request queued (8 files of 2,500 12 KB arrays, evicted, 14
fresh first opens each way: median 0.165 s against 0.181 s with one file ahead).

Memory: a scratch of at most ``budget`` resident bytes for each file in flight and one for the
caller's (the caller's own scratch is then left untouched): two, three while files are read
whole. A forked child holds a copy of the threads' records but no threads: there a thread
refuses work and is never joined.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..io import ByteSource, storage_read_bytes
from ..io.local import LocalFile
from ..picklekit.compiled import CORE
from .access import choose_pattern, fits_scratch
from .scratch import FILL_WHOLE, MOST, WINDOW, ScanScratch
from .sparse import SKIP

__all__ = ["DEEPEST", "ScanAhead", "Taken"]

T = TypeVar("T")
DEEPEST = 2  # files read ahead at most (two only while they are read whole from storage)


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
    filler: Any  # the FillThread reading it
    how: int  # FILL_READ or FILL_WHOLE


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _free(pool: list[T], busy: list[Any], make: Callable[[], T]) -> T:
    """The first of ``pool`` that is none of ``busy``, else a new one ``make`` gives (kept)."""
    for item in pool:
        if all(item is not b for b in busy):
            return item
    item = make()
    pool.append(item)
    return item


class ScanAhead:
    """Reads ``paths``' examined bytes ahead of :meth:`take` (in this order): a file ahead, two
    while the files are read whole from storage, each into a scratch of ``budget`` bytes that
    neither a read in flight nor the caller holds (two scratches; three with two files in
    flight); :meth:`close` stops the threads and unmaps the scratches. Without the compiled core
    it reads nothing ahead (every :meth:`take` is None)."""

    def __init__(self, paths: Sequence[str], budget: int) -> None:
        self._paths = list(paths)
        self._where = {p: k for k, p in enumerate(self._paths)}
        self._budget = budget
        self._scratches: list[ScanScratch] = []  # made as first needed
        self._held: ScanScratch | None = None  # the caller's (its file's), till its next take
        self._fillers: list[Any] = []  # FillThreads, the second started when first needed
        self._pending: list[_Pending] = []  # the reads in flight, in file order
        self._taken = -1  # the caller's last file taken
        # the threads read the next files while the caller reads the first itself (into a
        # scratch of its own): their scratches' pages are faulted in at once, on two cores
        self._refill(0)

    def _free_scratch(self) -> ScanScratch:
        """A scratch neither a read in flight nor the caller holds (made when there is none)."""
        busy = [p.scratch for p in self._pending] + [self._held]
        return _free(self._scratches, busy, lambda: ScanScratch(self._budget))

    def _idle_filler(self) -> Any:
        """A fill thread with no read in flight (one is started when every one has)."""
        assert CORE is not None  # _refill starts nothing without it
        return _free(self._fillers, [p.filler for p in self._pending], CORE.FillThread)

    def _refill(self, k: int) -> None:
        """With the caller at file ``k``: keep file ``k + 1`` in flight, and ``k + 2`` too when
        ``k + 1`` is read whole from storage (a read that waits on the device, not the CPU: a
        second one keeps a request queued while the first's data is copied, and the caller's
        walks are short beside either)."""
        if CORE is None:
            return
        while len(self._pending) < DEEPEST:
            last = self._pending[-1] if self._pending else None
            if last is not None and last.how != FILL_WHOLE:
                return  # read a window a sample, from memory: one file ahead keeps up
            k = k + 1 if last is None else last.k + 1
            if k >= len(self._paths) or not self._start(k):
                return

    def _start(self, k: int) -> bool:
        """Start reading file ``k``; False where it is not read ahead."""
        source = LocalFile(self._paths[k])
        try:
            fd = source.fileno()
            stamp = _stamp(os.fstat(fd))
            pattern = choose_pattern(source)
            scratch = self._free_scratch()
            if not fits_scratch(scratch, source.size, pattern):
                source.close()
                return False
            source.advise(pattern)
            buf, how = scratch.prepare(fd, source.size, dense=pattern == "sequential")
            filler = self._idle_filler()
            before = storage_read_bytes(filler.tid)
            filler.submit(fd, buf, source.size, how, WINDOW, MOST, SKIP)
        except Exception:
            source.close()
            return False
        self._pending.append(_Pending(k, source, stamp, pattern, scratch, buf, before, filler, how))
        return True

    def _finish(self) -> tuple[_Pending, int | None] | None:
        """Wait for the first read in flight: it and the bytes storage delivered for it, or
        None when it failed."""
        pending = self._pending.pop(0)
        try:
            got = int(pending.filler.wait())
        except OSError:
            return None
        finally:
            pending.source.close()
        after = storage_read_bytes(pending.filler.tid)
        pending.scratch.filled(got)
        fetched = None if pending.before is None or after is None else after - pending.before
        return pending, fetched

    def take(self, source: ByteSource) -> Taken | None:
        """What was read ahead of ``source`` (the caller's open file), waiting for the read
        while it runs; None when it was not (the caller reads the file). Starts the next files'
        reads before it returns. Where the thread is already reading the next file (the first
        file of all), the caller reads this one here, into its scratch. The scratch handed out
        is the caller's until its next :meth:`take` or :meth:`close`."""
        k = self._where.get(source.name)
        fd = source.fileno()
        if k is None or k <= self._taken or fd is None:
            return None
        self._taken = k
        if self._pending and self._pending[0].k == k + 1:
            return self._read_here(k, source, fd)
        finished = None
        while self._pending and self._pending[0].k <= k:  # ours, and any the caller passed over
            finished = self._finish()
        if finished is not None and finished[0].k != k:
            finished = None
        self._held = None if finished is None else finished[0].scratch
        self._refill(k)
        if finished is None:
            return None
        pending, fetched = finished
        try:
            if _stamp(os.fstat(fd)) != pending.stamp:
                return None
        except OSError:
            return None
        return Taken(pending.buffer, pending.pattern, fetched)

    def _read_here(self, k: int, source: ByteSource, fd: int) -> Taken | None:
        """File ``k`` read in the caller's thread into its scratch (the reads of the files
        after it are in flight in the others), or None where the scratch would not take it."""
        pattern = choose_pattern(source)
        scratch = self._held = self._free_scratch()
        if not fits_scratch(scratch, source.size, pattern):
            self._held = None
            return None
        source.advise(pattern)
        buf = scratch.read(fd, source.size, dense=pattern == "sequential")
        return Taken(buf, pattern, None)  # its reads are the caller's thread's: counted there

    def close(self) -> None:
        """Wait for the reads in flight, stop the threads, unmap the scratches."""
        while self._pending:
            self._finish()
        for filler in self._fillers:
            filler.close()
        for scratch in self._scratches:
            scratch.close()
