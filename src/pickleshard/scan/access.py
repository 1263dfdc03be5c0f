"""How a scan reads its file: the access pattern chosen per file, and the buffer it walks.

The compiled walker is one C call over a buffer, so the storage's readahead decides what a scan
fetches, not the walk. A fault in a normally advised mapping makes the kernel read around it
(8 MiB where ``read_ahead_kb`` is 8192): a scan of 150 KB arrays examines 0.05% of a file and
fetches all of it. :func:`choose_pattern` therefore looks at the first :data:`PROBE_BYTES` of
the file (fetched by any scan anyway) before the walk: when the opcodes there lie on fewer than
one page in :data:`SPARSE_PAGES` (their mean distance is 64 KiB or more), the file is read
``"random"`` (storage delivers only the pages touched); otherwise ``"sequential"`` (dense
opcodes want readahead: a page at a time they would cost one storage round trip each).

Measured on this machine class (``python -m bench scan --cold``; 8 files of 150 KB float32
arrays, 1.2 GB, evicted): the scans fetched 2.9% of the bytes (100% with default advice) and
took 0.7-0.9 s against 2.7-4.3 s for ``pickle.load``. What is left is one page per sample, one
storage round trip each: the device's random-read rate bounds it, not the bytes.
"""

from __future__ import annotations

import mmap
from typing import Any

from ..io import AccessPattern, ByteSource, storage_read_bytes
from ..picklekit import opcodes as oc
from ..picklekit.compiled import CORE
from ..picklekit.extent import extent
from .scratch import ScanScratch, current_scratch
from .sparse import sparse_buffer

__all__ = [
    "PROBE_BYTES",
    "SPARSE_PAGES",
    "choose_pattern",
    "fetched_since",
    "fits_scratch",
    "scan_buffer",
    "scan_view",
]

PROBE_BYTES = 256 << 10  # the head examined to choose the pattern
PROBE_OPCODES = 1024  # ... or this many opcodes, whichever ends first (dense files end early)
PAGE = 4096
SPARSE_PAGES = 16  # opcodes on under one page in 16 (64 KiB apart or more): read "random"
WILLNEED_BYTES = 256 << 20  # a dense file's head asked for at once (see scan_buffer)


def choose_pattern(source: ByteSource) -> AccessPattern:
    """``"random"`` when the opcodes in the first :data:`PROBE_BYTES` of ``source`` are sparse
    (one page in :data:`SPARSE_PAGES` or fewer holds any), else ``"sequential"``. A file no
    longer than the probe is ``"sequential"`` (it is read whole either way). Leaves ``source``
    advised ``"random"`` when it probed (the caller advises the pattern chosen). Bad bytes end the
    probe where they start: what is wrong with them is the walk's to report."""
    if source.size <= PROBE_BYTES:
        return "sequential"
    source.advise("random")  # the probe fetches its window and no readahead past it
    mapped = source.map()
    if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_WILLNEED"):
        # One storage read of the window, through the randomly advised map: a pread would
        # start readahead at a page another reader's readahead marked (an index's fingerprint)
        mapped.madvise(mmap.MADV_WILLNEED, 0, PROBE_BYTES)
        head = mapped[:PROBE_BYTES]
    else:
        head = source.read_at(0, PROBE_BYTES)
    pages: set[int] = set()
    pos = 2 if head[:1] == bytes((oc.PROTO_OP,)) else 0
    dense = len(head) // PAGE // SPARSE_PAGES  # more pages touched than this: dense already
    for _ in range(PROBE_OPCODES):
        if pos >= len(head):
            break
        pages.add(pos // PAGE)
        if len(pages) > dense:
            return "sequential"
        nxt = extent(head, pos, source.size)
        if nxt < 0:  # a probe: the walk reports bad bytes, with their offset
            break
        pos = nxt
    spanned = min(pos, len(head)) // PAGE + 1
    return "random" if len(pages) * SPARSE_PAGES <= spanned else "sequential"


def scan_buffer(source: ByteSource, pattern: AccessPattern | None = None) -> Any:
    """The buffer a scan walks over ``source``, advised with ``pattern`` (default: the one
    :func:`choose_pattern` picks): the source's map, or its bytes read whole when it cannot be
    mapped (the walkers index, ``find`` and ``struct.unpack_from`` into the buffer, which a
    :class:`~pickleshard.io.WindowedBuffer` does not serve). Empty sources give ``b""``. A
    source that cannot be mapped (remote) gives :func:`~pickleshard.scan.sparse.sparse_buffer`:
    the bytes the scan examines, fetched by ranges."""
    if source.fileno() is None and source.map() is None:
        return sparse_buffer(source)
    pattern = choose_pattern(source) if pattern is None else pattern
    source.advise(pattern)
    buf = source.map()
    if buf is None:
        buf = source.read_at(0, source.size)
    elif pattern == "sequential" and isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_WILLNEED"):
        # A dense file is read whole: ask for it all now, so storage streams it while the walk
        # runs behind (faults then find pages read, or in flight), where readahead would only
        # start each window when the walk reached the one before.
        buf.madvise(mmap.MADV_WILLNEED, 0, min(len(buf), WILLNEED_BYTES))
    return buf


def scan_view(source: ByteSource) -> tuple[Any, bool, int | None]:
    """:func:`scan_buffer` of ``source`` with the pattern :func:`choose_pattern` picks, and
    whether walks over it should drop the pages behind them (``walk.releaser``). Not over a
    randomly advised map: the kernel maps only the pages touched there (no fault-around), a
    page per sample at most, unmapped with the file at the scan's end; dropping them made the
    fast-path checks (:func:`~pickleshard.scan.fastpath.array_item`, which read every sample's
    head again) fault each page in a second time (150 KB arrays: 2,000 faults a file, not 1,000;
    the scan 25% slower). Inside a :func:`~pickleshard.scan.scratch.scratch_scope`, a local
    file that fits its budget is not mapped: the bytes the scan examines are read into the
    scope's reused buffer (:mod:`pickleshard.scan.scratch`), or were read there ahead of this
    scan (:mod:`pickleshard.scan.ahead`). Third: the bytes storage delivered for the file
    elsewhere than in this thread (by the read ahead), or None."""
    fd = source.fileno()
    if fd is None and source.map() is None:
        return sparse_buffer(source), True, None
    scratch = current_scratch()
    if fd is not None and scratch is not None and scratch.ahead is not None:
        taken = scratch.ahead.take(source)
        if taken is not None:  # read while the file before was walked (pickleshard.scan.ahead)
            source.advise(taken.pattern)
            return taken.buffer, False, taken.fetched
    pattern = choose_pattern(source)
    if (
        fd is not None
        and scratch is not None
        and CORE is not None
        and fits_scratch(scratch, source.size, pattern)
    ):
        # read, not mapped (pickleshard.scan.scratch): the file's pages are never mapped here
        # no WILLNEED here: a dense file storage must deliver is read whole, in large reads
        # that readahead follows (asking for it all first measured slower, 0.29 s against
        # 0.20 s for 8 files of 30 MB)
        source.advise(pattern)
        return scratch.read(fd, source.size, dense=pattern == "sequential"), False, None
    return scan_buffer(source, pattern), pattern != "random", None


def fits_scratch(scratch: ScanScratch, size: int, pattern: AccessPattern) -> bool:
    """Whether a scan of a file of ``size`` bytes read with ``pattern`` may read into
    ``scratch``: the bytes it examines (all of a dense file, at most a page in
    :data:`SPARSE_PAGES` of a sparse one) fit its budget."""
    return scratch.fits(size // SPARSE_PAGES if pattern == "random" else size)


def fetched_since(before: int | None, thread: bool = False) -> int | None:
    """Bytes storage delivered to this process (``thread``: this thread) since ``before`` (a
    :func:`storage_read_bytes` reading of the same), or None where the counter is
    unavailable."""
    now = storage_read_bytes(thread)
    return None if before is None or now is None else now - before
