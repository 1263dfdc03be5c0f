"""What compression a stream uses, told by its first bytes, and the zstd seek table.

:func:`sniff` looks at magic bytes only (a file's name says nothing: a gzip file named ``.pkl``
is gzip). A pickle never starts with one of these: protocol 2+ starts with ``PROTO`` (``0x80``),
protocols 0/1 with an opcode letter or ``(``/``]``/``}``.

:func:`zstd_seek_table` reads the footer of the zstd *seekable format* (a skippable frame at the
end of the file listing each frame's compressed and decompressed size, written by
``zstd --seekable``-style writers, t2sz, and the reference ``seekable_format`` library): a small
fixed layout that names where frames are; the frames themselves are decoded by ``zstandard``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "MAGICS",
    "ZstdSeekTable",
    "multiblock_xz",
    "seekable_zstd",
    "sniff",
    "zstd_seek_table",
    "zstd_seek_table_bytes",
]

#: compression name -> magic bytes at offset 0
MAGICS: dict[str, bytes] = {
    "gzip": b"\x1f\x8b",
    "bz2": b"BZh",
    "xz": b"\xfd7zXZ\x00",
    "zstd": b"\x28\xb5\x2f\xfd",
}
SNIFF_BYTES = 6  # the longest magic

SEEKABLE_MAGIC = 0x8F92EAB1  # the last 4 bytes of a seekable zstd file
SKIPPABLE_MAGIC = 0x184D2A5E  # the seek table's skippable frame
FOOTER = 9  # u32 number of frames, u8 descriptor, u32 seekable magic


def sniff(head: bytes) -> str | None:
    """The compression whose magic ``head`` (the first :data:`SNIFF_BYTES` bytes) starts
    with, or None: not compressed (or not a compression we read)."""
    if len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18":
        return "zstd"  # a zstd skippable frame first (a seekable file of no data is just one)
    for name, magic in MAGICS.items():
        if head.startswith(magic):
            if name == "bz2" and not (len(head) > 3 and 0x31 <= head[3] <= 0x39):
                continue  # "BZh" + block size digit '1'..'9'
            return name
    return None


@dataclass(frozen=True)
class ZstdSeekTable:
    """Frame ``k`` occupies compressed bytes ``[c_offsets[k], c_offsets[k + 1])`` and holds
    decompressed bytes ``[d_offsets[k], d_offsets[k + 1])``."""

    c_offsets: tuple[int, ...]
    d_offsets: tuple[int, ...]

    @property
    def size(self) -> int:
        return self.d_offsets[-1]


def zstd_seek_table(tail: bytes, file_size: int) -> ZstdSeekTable | str:
    """The seek table in ``tail`` (the file's last bytes, enough to hold the whole table), or
    a reason it has none: ``"no seek table"`` for a plain zstd file, or what is wrong with a
    table that is there (its entries must cover the file exactly)."""
    if len(tail) < FOOTER or struct.unpack_from("<I", tail, len(tail) - 4)[0] != SEEKABLE_MAGIC:
        return "no seek table"
    frames, descriptor = struct.unpack_from("<IB", tail, len(tail) - FOOTER)
    entry = 12 if descriptor & 0x80 else 8
    body = frames * entry + FOOTER  # the skippable frame's content
    start = len(tail) - body - 8
    if descriptor & 0x7C or start < 0 or file_size - body - 8 < 0:
        return f"a seek table of {frames} frames that does not fit the file"
    magic, length = struct.unpack_from("<II", tail, start)
    if magic != SKIPPABLE_MAGIC or length != body:
        return "a seek table footer without its skippable frame"
    c_offsets, d_offsets = [0], [0]
    for k in range(frames):
        c, d = struct.unpack_from("<II", tail, start + 8 + k * entry)
        c_offsets.append(c_offsets[-1] + c)
        d_offsets.append(d_offsets[-1] + d)
    if c_offsets[-1] != file_size - body - 8:
        return (
            f"a seek table whose {frames} frames cover {c_offsets[-1]} compressed bytes, "
            f"not the {file_size - body - 8} before it"
        )
    return ZstdSeekTable(tuple(c_offsets), tuple(d_offsets))


def zstd_seek_table_bytes(frames: list[tuple[int, int]]) -> bytes:
    """The seek table (skippable frame and footer, no checksums) for ``frames``, each
    ``(compressed size, decompressed size)``: what a writer appends after the frames."""
    entries = b"".join(struct.pack("<II", c, d) for c, d in frames)
    footer = struct.pack("<IBI", len(frames), 0, SEEKABLE_MAGIC)
    return struct.pack("<II", SKIPPABLE_MAGIC, len(entries) + FOOTER) + entries + footer


def seekable_zstd(data: bytes, frame_size: int = 1 << 20, level: int = 3) -> bytes:
    """``data`` compressed in the zstd seekable format: independent frames of ``frame_size``
    decompressed bytes (by ``zstandard``), then their seek table. What ``zstd --seekable``
    writes, for tests, benchmarks and users who want random access to a zstd file."""
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level)
    frames, sizes = [], []
    for lo in range(0, len(data), frame_size):
        frame = cctx.compress(data[lo : lo + frame_size])
        frames.append(frame)
        sizes.append((len(frame), len(data[lo : lo + frame_size])))
    return b"".join(frames) + zstd_seek_table_bytes(sizes)


def multiblock_xz(data: bytes, block_size: int = 1 << 20) -> bytes:
    """``data`` as an xz file with one block per ``block_size`` decompressed bytes (by
    ``python-xz``), as ``xz -T0`` or ``xz --block-size`` writes it: readable in place."""
    import io
    import lzma

    import xz

    if not data:  # python-xz writes nothing for no data: an empty stream has no block
        return lzma.compress(data, format=lzma.FORMAT_XZ)
    out = io.BytesIO()
    with xz.open(out, "wb") as fh:
        for lo in range(0, len(data), block_size):
            fh.write(data[lo : lo + block_size])
            fh.change_block()
    return out.getvalue()
