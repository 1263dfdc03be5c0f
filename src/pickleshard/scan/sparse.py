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

Windows are requested in batches (:meth:`~pickleshard.io.ByteSource.read_ranges`, concurrent
for remote sources): after a jump, the next windows are predicted at the same stride (samples
of one file are usually the same length), ``1, 2, 4, ... MAX_AHEAD`` of them while the
predictions keep hitting; a miss costs one window.
"""

from __future__ import annotations

import mmap
from bisect import bisect_right
from typing import Any

from ..io import ByteSource
from ..picklekit.extent import SHORT, extent
from ..picklekit.opcodes import F_LEN1, F_LEN8U, FORM, HEAD

__all__ = ["SKIP", "WINDOW", "sparse_buffer"]

SKIP = 4096  # payloads at least this long are never read by a scan (inert's placeholder size)
WINDOW = 2048  # bytes fetched at each place the walk lands
MAX_AHEAD = 32  # windows predicted ahead, at most
SLACK = 256  # a predicted window starts this much early (memo ids and frames shift offsets)
DENSE = 0.5  # fetched more than this share of what was walked: fetch the rest whole


class _Mirror(mmap.mmap):
    """An anonymous mapping the scan walks like a file's map. The walker drops the pages of
    a file's map it has passed (MADV_DONTNEED): here that would zero what was fetched."""

    def madvise(self, option: int, start: int = 0, length: int = 0) -> None:
        if option != getattr(mmap, "MADV_DONTNEED", None):
            super().madvise(option, start, length or len(self) - start)


class _Windows:
    """Fetched windows (start, bytes), in offset order, copied into ``mirror`` as they come."""

    def __init__(self, source: ByteSource, mirror: Any) -> None:
        self.source, self.mirror = source, mirror
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
        for (lo, _), got in zip(ranges, self.source.read_ranges(ranges, gap=0), strict=True):
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
    mirror = _Mirror(-1, size)
    win = _Windows(source, mirror)
    pos, ahead, stride, last_jump = 0, 1, 0, -1
    while pos < size:
        if win.fetched > DENSE * pos + (1 << 20):  # dense opcodes: the rest in one read
            mirror[pos:size] = source.read_at(pos, size - pos)
            break
        found = win.find(pos)
        if found is None:
            wanted = [(pos, WINDOW)]
            if stride > 0:  # the windows the same stride predicts, fetched with this one
                wanted += [(pos + k * stride - SLACK, WINDOW) for k in range(1, ahead + 1)]
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
                hit = win.find(nxt) is not None
                ahead = min(MAX_AHEAD, ahead * 2) if hit else 1
                stride = nxt - last_jump
            if payload >= SKIP:
                last_jump = nxt
        pos = nxt
    return mirror
