"""Files rewritten behind the index's back: what the staleness tests share."""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path

BLOCK, BLOCKS = 4096, 8  # the fingerprint's sampling (pickleshard.index.fingerprint)


def big_file(folder: Path) -> Path:
    """A ~200 KB ``(x, y)`` file: 100 runs of 2000 equal bytes, far more than 8 x 4 KiB blocks."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "big.pkl"
    xs = [bytes([i % 251]) * 2000 for i in range(100)]
    path.write_bytes(pickle.dumps((xs, list(range(100))), 4))
    return path


def sampled_blocks(size: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` byte ranges the fingerprint reads of a file of ``size`` bytes."""
    step = (size - BLOCK) // (BLOCKS - 1)
    return [(k * step, k * step + BLOCK) for k in range(BLOCKS)]


def unsampled_payload_offset(path: Path) -> int:
    """An offset inside a sample payload of a :func:`big_file` that no fingerprint block covers."""
    data = path.read_bytes()
    blocks = sampled_blocks(len(data))
    for i in range(100):
        start = data.index(bytes([i % 251]) * 2000)
        for off in range(start, start + 2000):
            if not any(lo <= off < hi for lo, hi in blocks):
                return off
    raise AssertionError("every payload byte is sampled")


def write_keeping_times(path: Path, data: bytes) -> None:
    """Overwrite ``path`` with ``data`` in place (same inode), then put its old atime and mtime
    back exactly: a file changed behind an index's back."""
    st = path.stat()
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def rewrite_keeping_size_and_mtime(path: Path, offset: int) -> None:
    """Flip a byte in place (same inode), then put the old atime and mtime back exactly."""
    st = path.stat()
    time.sleep(0.02)  # past the file system's timestamp tick, so the ctime surely moves
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    write_keeping_times(path, bytes(data))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
    )
    assert after.st_ctime_ns != st.st_ctime_ns
