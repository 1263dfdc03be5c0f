"""The buffer a scan walks over a source that cannot be mapped (a remote object): only the bytes
the scan examines are fetched, by ranges, several windows per request batch.

A scan examines opcodes and the payloads shorter than :data:`SKIP` (the walker steps over a
payload from its length prefix; the inspector turns payloads of :data:`SKIP` bytes or more
into placeholders without reading them: :data:`pickleshard.safety.inert._TEXT_PLACEHOLDER_MIN`).
:func:`sparse_buffer` walks the opcodes with :func:`~pickleshard.picklekit.extent.extent` over
fetched windows, jumps over every payload of :data:`SKIP` bytes or more, and writes what it
fetched into an anonymous mapping the size of the object (pages never written cost no memory).
The scan then walks that mapping as it would a local file's map. A file of 150 KB arrays is
fetched at about one :data:`WINDOW` per sample.

Windows are requested in batches (:meth:`~pickleshard.io.ByteSource.read_blocks`, concurrent
for remote sources): after a jump, the next windows are predicted at the same stride (samples
of one file are usually the same length), ``1, 2, 4, ... MAX_AHEAD`` of them: doubled each time
the walk uses up the windows predicted, back to one when it lands between them (a wrong
prediction); a miss costs one window. Windows closer together than the source's
:meth:`~pickleshard.io.ByteSource.coalesce_gap` (a remote store's latency times bandwidth: the
bytes one round trip is worth) go out as one request, kept whole.

A dense file is fetched like a download instead. When :data:`NEAR_MISSES` windows in a row had
to be fetched after the walk stepped off a window's end or jumped over a payload shorter than
that gap (samples of a few KB, or no large payloads at all: the walk would fetch most of the
file a window at a time, one round trip each), the object is read whole instead. One of at
most :data:`IN_MEMORY` bytes is fetched by one request and its bytes are the buffer the scan
walks: copied into a fresh mirror, every page written for the first time, it cost as much CPU
again as the download itself (an index build fetches several files at once, so one stream a
file still fills the link). A larger one is read by one
:meth:`~pickleshard.io.ByteSource.readinto_at` (a remote source fetches it in large windows,
several in flight) into a mirror backed by an unlinked temporary file, so that a downloaded
file sits in the page cache, not in this process's anonymous memory. Files no longer than
:data:`WHOLE_BELOW` are read whole at once.
"""

from __future__ import annotations

import mmap
import tempfile
from bisect import bisect_right
from typing import Any

from ..io import ByteSource
from ..io.base import coalesce
from ..picklekit.extent import SHORT, extent
from ..picklekit.opcodes import F_LEN1, F_LEN8U, FORM, HEAD

__all__ = ["SKIP", "WINDOW", "sparse_buffer"]

SKIP = 4096  # payloads at least this long are never read by a scan (inert's placeholder size)
WINDOW = 2048  # bytes fetched at each place the walk lands
MAX_AHEAD = 64  # windows predicted ahead, at most (one round trip for all of them)
SLACK = 256  # a predicted window starts this much early (memo ids and frames shift offsets)
DENSE = 0.5  # fetched more than this share of what was walked: fetch the rest whole
NEAR_MISSES = 2  # windows in a row fetched within the coalescing gap: download the rest
WHOLE_BELOW = 64 << 10  # an object this short is one request
IN_MEMORY = 64 << 20  # a larger mirror is a temporary file's mapping (page cache, not heap)


class _Mirror(mmap.mmap):
    """An anonymous mapping the scan walks like a file's map. The walker drops the pages of
    a file's map it has passed (MADV_DONTNEED): here that would zero what was fetched."""

    def madvise(self, option: int, start: int = 0, length: int = 0) -> None:
        if option != getattr(mmap, "MADV_DONTNEED", None):
            super().madvise(option, start, length or len(self) - start)


def _mirror(size: int) -> _Mirror:
    """A zeroed mapping of ``size`` bytes: anonymous, or over an unlinked sparse temporary file
    when larger than :data:`IN_MEMORY` (the mapping holds the file open)."""
    if size <= IN_MEMORY:
        return _Mirror(-1, size)
    with tempfile.TemporaryFile(prefix="pickleshard-scan-") as fh:
        fh.truncate(size)  # a hole: no disk used until written
        return _Mirror(fh.fileno(), size)


class _Windows:
    """Fetched windows (start, bytes), in offset order, copied into ``mirror`` as they come;
    requested windows within ``gap`` bytes of each other are fetched (and kept) as one."""

    def __init__(self, source: ByteSource, mirror: Any, gap: int) -> None:
        self.source, self.mirror, self.gap = source, mirror, gap
        self.starts: list[int] = []
        self.data: list[bytes] = []
        self.fetched = 0

    def find(self, pos: int) -> tuple[int, bytes] | None:
        k = bisect_right(self.starts, pos) - 1
        if k >= 0 and pos < self.starts[k] + len(self.data[k]):
            return self.starts[k], self.data[k]
        return None

    def fetch(self, ranges: list[tuple[int, int]]) -> None:
        size = self.source.size
        ranges = [(lo, min(n, size - lo)) for lo, n in ranges if 0 <= lo < size]
        blocks = coalesce(ranges, self.gap)
        for (lo, _, _), got in zip(blocks, self.source.read_blocks(blocks), strict=True):
            self.mirror[lo : lo + len(got)] = got
            self.fetched += len(got)
            k = bisect_right(self.starts, lo)
            self.starts.insert(k, lo)
            self.data.insert(k, got)


def sparse_buffer(source: ByteSource) -> Any:
    """A buffer of ``source.size`` bytes holding every byte a scan of ``source`` examines
    (the others read as zeros); see the module docstring."""
    size = source.size
    if size == 0:
        return b""
    mirror = _mirror(size)
    gap = source.coalesce_gap()
    if size <= max(WHOLE_BELOW, 2 * gap):
        source.readinto_at(0, memoryview(mirror))
        return mirror
    win = _Windows(source, mirror, gap)
    pos, ahead, stride, last_jump = 0, 1, 0, -1
    horizon = 0  # the end of the last window predicted
    near = skipped = 0  # misses in a row that followed a short skip; the skip that led to pos
    while pos < size:
        found = win.find(pos)
        if found is None:
            near = near + 1 if skipped <= gap else 0
        if near >= NEAR_MISSES or win.fetched > DENSE * pos + (1 << 20):
            # dense: the whole object like a download
            if size <= IN_MEMORY:  # one request, its bytes walked as they came (no copy)
                whole: bytes = source.read_blocks([(0, size, [0])])[0]
                return whole
            lo = pos if found is None else found[0]  # ``pos`` may lie in a window
            source.readinto_at(lo, memoryview(mirror)[lo:size])
            break
        if found is None:
            wanted = [(pos, WINDOW)]
            if stride > 0:  # the windows the same stride predicts, fetched with this one
                wanted += [(pos + k * stride - SLACK, WINDOW) for k in range(1, ahead + 1)]
                horizon = wanted[-1][0] + WINDOW
            win.fetch(wanted)
            found = win.find(pos)
            assert found is not None
        lo, data = found
        nxt = extent(data, pos - lo, size - lo)
        if nxt == SHORT:  # a text line or prefix past the window: fetch from here, larger
            win.fetch([(pos, max(WINDOW, 2 * len(data)) + (pos - lo))])
            lo, data = win.find(pos) or (pos, b"")
            nxt = extent(data, pos - lo, size - lo)
        if nxt < 0:  # bad bytes: their opcode is in the mirror; the walk reports them
            break
        nxt += lo
        op = data[pos - lo]
        payload = nxt - pos - HEAD[op] if F_LEN1 <= FORM[op] <= F_LEN8U else 0
        if payload >= SKIP or nxt > lo + len(data):
            if payload < SKIP:  # a short payload past the window: the scan may read it
                win.fetch([(pos, nxt - pos)])
            elif last_jump >= 0:
                if win.find(nxt) is None:  # past what was predicted: predict further
                    ahead = min(MAX_AHEAD, ahead * 2) if nxt >= horizon else 1
                stride = nxt - last_jump
            if payload >= SKIP:
                last_jump = nxt
        skipped = payload if payload >= SKIP else 0
        pos = nxt
    return mirror
