"""A local file's scan without mapping the file: the bytes it examines read into a reused buffer.

Mapping a file to walk it costs, on the machines measured, as much as the walk itself: the
kernel maps the pages around every fault (64 KiB) and unmaps them all again when the file is
closed. For 8 files of 2,500 12 KB arrays, a scan was ~12 ms a file, ~6 ms of it mapping and
unmapping; for 150 KB arrays one fault per sample, ~12 ms a file. A scan examines only the
opcodes and the payloads shorter than :data:`~pickleshard.scan.sparse.SKIP` (the scan of a
remote object relies on the same fact, :mod:`pickleshard.scan.sparse`), so
:func:`fill_examined` reads just those with ``pread`` (a window at each place the opcode chain
lands, one per sample of an array file) into a :class:`ScanScratch`: an anonymous mapping kept
from one file to the next, whose pages are faulted in once. The scan then walks the scratch as
it would the file's map; bytes it never examines hold whatever an earlier file left there.

Only inside :func:`scratch_scope` (an index build in the caller's thread opens one), for a
local file whose examined bytes fit :data:`SCRATCH_BYTES` of memory: a dense file (every page
examined) up to that size, a sparse one (one page in :data:`~pickleshard.scan.access.SPARSE_PAGES`
or fewer) up to that many times it. Elsewhere a scan maps the file as before: the results are
the same (the scan tests compare both against ``pickle.load``).

Reading a dense file's examined bytes out of a map populated at once (``MAP_POPULATE``, then
copied under a SIGBUS guard) was measured and is not used: it depends on how the page cache
holds the file. For 8 files of 2,500 12 KB arrays it took 3.3 ms of maps plus the copies after
the files had been read by large sequential reads, but 30-40 ms against 21-26 ms of ``pread``
for files just written (the first open's usual case), and medians of 8 fresh first opens were
no better with it (0.080 against 0.079 s; 0.074 against 0.071 s). The walk never runs over a
file's own map here: a file cut short under it would kill the process. An index build reads
each file while the one before it is walked (:mod:`pickleshard.scan.ahead`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..picklekit.compiled import CORE
from ..picklekit.extent import SHORT, extent
from ..picklekit.opcodes import F_LEN1, F_LEN8U, FORM, HEAD
from .sparse import SKIP

__all__ = [
    "FILL_READ",
    "FILL_WHOLE",
    "MOST",
    "SCRATCH_BYTES",
    "WINDOW",
    "ScanScratch",
    "current_scratch",
    "fill_examined",
    "learned_window",
    "scratch_scope",
]

FILL_READ, FILL_WHOLE = 0, 1  # how a scratch is filled (ScanScratch.prepare; the compiled
# core's FILL_* are the same numbers)
SCRATCH_BYTES = 64 << 20  # examined bytes a scratch may hold (its resident pages), at most
WINDOW = 256  # bytes read where the chain lands first (then learned: learned_window, at most
# this): an array sample's opcodes, a FRAME's head
# (256 rather than 512: a first open of 8 files of 150 KB arrays 35.5 against 36.5 ms, of
# 12 KB arrays 57.2 against 58.3; fewer scratch pages touched and bytes copied per sample)
MOST = 256 << 10  # ... doubled while the chain walks off their ends (small opcodes), to this


def learned_window(need: int, window: int) -> int:
    """The window read where the chain lands after a skipped payload: ``need`` (the bytes the
    last window held up to that payload) doubled, rounded up to 32, from 32 to ``window``. A
    file of samples alike then reads each sample's opcodes in one read of about their size
    (12 KB arrays at protocol 5: 64 bytes a sample, not :data:`WINDOW`); one whose next run is
    longer than the last twice reads on (the window doubles, as anywhere)."""
    need = (2 * need + 31) // 32 * 32
    return window if need >= window else max(need, 32)


def fill_examined_py(fd: int, out: Any, size: int, window: int, most: int, skip: int) -> int:
    """The pure-Python reference of ``pickleshard._cscan.fill_examined``: the same reads, the
    same bytes of ``out`` written, the same result."""
    if size < 0 or len(out) < size or window < 16 or most < window:
        raise ValueError(f"fill of {size} bytes into a {len(out)}-byte buffer")
    got = pos = lo = have = 0
    w = window

    def fill(at: int, n: int) -> int:
        n = max(0, min(n, size - at))
        data = os.pread(fd, n, at)
        if len(data) < n:
            raise OSError(f"the file ended before byte {size} while it was scanned (it changed)")
        out[at : at + len(data)] = data
        return len(data)

    while pos < size:
        if pos < lo or pos >= have:
            if pos == have and pos:
                w = min(w * 2, most)
            got += fill(pos, w)
            lo, have = pos, min(pos + w, size)
        nxt = extent(out[lo:have], pos - lo, size - lo)
        if nxt == SHORT:
            w = min(w * 2, most)
            got += fill(have, w)
            have = min(have + w, size)
            continue
        if nxt < 0:
            break
        nxt += lo
        op = out[pos]
        if F_LEN1 <= FORM[op] <= F_LEN8U:
            if nxt - pos - HEAD[op] >= skip:
                w = learned_window(pos + HEAD[op] - lo, window)
            elif nxt > have:
                got += fill(have, nxt - have)
                have = nxt
        pos = nxt
    return got


def fill_examined(fd: int, out: Any, size: int) -> int:
    """Read every byte a scan of the first ``size`` bytes of ``fd`` examines into ``out``
    (compiled when built, else :func:`fill_examined_py`); the bytes read."""
    if CORE is not None:
        return int(CORE.fill_examined(fd, out, size, WINDOW, MOST, SKIP))
    return fill_examined_py(fd, out, size, WINDOW, MOST, SKIP)


COLD_READ = 1 << 20  # bytes a read of a file storage must deliver asks for at once (1 MiB
# reads measured 0.14-0.19 s for 8 files of 30 MB, 8 MiB reads 0.20-0.23 s, pickle.load 0.19-0.28)


def _cached(fd: int, size: int) -> bool:
    """Whether the page cache holds the middle and the last page of the file (a read that
    would wait on storage fails at once with ``RWF_NOWAIT``); True where that cannot be asked."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None or size == 0:
        return True
    probe = bytearray(1)
    try:
        for at in (size // 2, size - 1):
            os.preadv(fd, [probe], at, flag)
    except BlockingIOError:
        return False
    except OSError:  # a file system without RWF_NOWAIT: read as if cached
        return True
    return True


def _read_whole(fd: int, out: Any, size: int) -> int:
    """Read the first ``size`` bytes of ``fd`` into ``out`` in :data:`COLD_READ` pieces."""
    view = memoryview(out)
    try:
        pos = 0
        while pos < size:
            got = os.preadv(fd, [view[pos : min(size, pos + COLD_READ)]], pos)
            if got == 0:
                raise OSError(
                    f"the file ended before byte {size} while it was scanned (it changed)"
                )
            pos += got
    finally:
        view.release()
    return size


class ScanScratch:
    """The reused buffer of :mod:`pickleshard.scan.scratch`: an anonymous mapping resized to each
    file (same-sized files reuse its pages), holding at most ``budget`` bytes examined.
    Counters: ``files`` scanned through it, ``bytes_read`` into it."""

    def __init__(self, budget: int = SCRATCH_BYTES) -> None:
        self.budget = budget
        self.files = 0
        self.bytes_read = 0
        # what reads the next files ahead of the scans (a ScanAhead; set by scratch_scope)
        self.ahead: Any = None
        self._map: mmap.mmap | None = None

    def _small_pages(self) -> None:
        """Small pages for the scratch, never transparent huge ones. A huge page costs less to
        fault in than the 512 small ones it replaces (the first of 8 files of 2,500 12 KB arrays:
        3.4 ms against 6-9), but where the kernel compacts memory to find one for a mapping
        advised so (``defrag`` ``madvise``, its default) a fault waited 20-220 ms, one try
        in three, in this machine's repeated runs. A sparse scan touches a page per sample: a
        huge page would zero 2 MiB for each (150 KB arrays: 41 ms against 29)."""
        assert self._map is not None
        advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
        if advice is not None:
            with contextlib.suppress(OSError):  # a kernel built without them
                self._map.madvise(advice)

    def fits(self, examined: int) -> bool:
        """Whether a scan that examines at most ``examined`` bytes may read into it."""
        return 0 < examined <= self.budget

    def read(self, fd: int, size: int, dense: bool = False) -> mmap.mmap:
        """The scratch holding every byte a scan of ``fd``'s first ``size`` bytes examines,
        exactly ``size`` bytes long (the walkers take its length for the file's). A ``dense``
        file (every page examined) that storage must deliver is read whole, in large reads, as
        ``pickle.load`` reads it: a read per sample would wait on storage once per window."""
        buf, how = self.prepare(fd, size, dense)
        got = _read_whole(fd, buf, size) if how == FILL_WHOLE else fill_examined(fd, buf, size)
        self.filled(got)
        return buf

    def prepare(self, fd: int, size: int, dense: bool) -> tuple[mmap.mmap, int]:
        """The scratch sized for a file of ``size`` bytes, and how :meth:`read` fills it:
        :data:`FILL_WHOLE` (a dense file storage must deliver) or :data:`FILL_READ`."""
        if self._map is None or len(self._map) != size:
            self._resize(size)
        assert self._map is not None
        return self._map, FILL_WHOLE if dense and not _cached(fd, size) else FILL_READ

    def filled(self, got: int) -> None:
        """Count a file filled into the scratch with ``got`` bytes read."""
        self.files += 1
        self.bytes_read += got

    def _resize(self, size: int) -> None:
        if self._map is not None:
            try:
                self._map.resize(size)
                return
            except (BufferError, OSError, SystemError):  # a view still held, or no mremap
                self.close()
        # private: a shared anonymous map is a fixed-size shmem object, and growing it with
        # mremap leaves the new pages unbacked (reads into them fail with EFAULT)
        self._map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._small_pages()

    def close(self) -> None:
        """Unmap the scratch (a later :meth:`read` maps a new one)."""
        if self._map is not None:
            # a view of it that outlives the scan keeps its memory until the view goes
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None


_local = threading.local()


def current_scratch() -> ScanScratch | None:
    """The scratch of the innermost :func:`scratch_scope` open in this thread, or None."""
    return getattr(_local, "scratch", None)


@contextmanager
def scratch_scope(
    budget: int = SCRATCH_BYTES, ahead: Callable[[int], Any] | None = None
) -> Iterator[ScanScratch]:
    """Scans of local files in this thread read into one :class:`ScanScratch` until the block
    ends (then it is unmapped); the scratch is yielded for its counters. ``ahead(budget)``: what
    reads the files to come while each is walked (a
    :class:`~pickleshard.scan.ahead.ScanAhead`), closed with the block."""
    outer = current_scratch()
    scratch = ScanScratch(budget)
    _local.scratch = scratch
    try:
        scratch.ahead = ahead(budget) if ahead is not None else None
        yield scratch
    finally:
        _local.scratch = outer
        if scratch.ahead is not None:
            scratch.ahead.close()
        scratch.close()
