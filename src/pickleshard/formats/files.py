"""File plumbing shared by the formats: atomic JSON, a streaming ``.npy`` writer, raw copies.

Every final file is written under a temporary name in the same directory and renamed into
place (:mod:`pickleshard.io.atomic`), so a file that exists under its final name is complete. Copies stream through a buffer of
:data:`COPY_CHUNK` bytes: memory does not grow with the data.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..io.atomic import AtomicWrite, write_bytes_atomic

__all__ = [
    "COPY_CHUNK",
    "NO_SPACE",
    "NpyWriter",
    "atomic_write_json",
    "copy_bytes",
    "iter_raw_chunks",
]

COPY_CHUNK = 8 << 20
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a full file system or quota


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON (keys in insertion order, so output is reproducible),
    atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=1) + "\n").encode())


def copy_bytes(src: Path, dst: IO[bytes], offset: int = 0, length: int | None = None) -> int:
    """Append ``length`` bytes of ``src`` from ``offset`` (default: to its end) to ``dst``.

    Uses ``os.copy_file_range`` (the kernel copies, no buffer here) where the system has it,
    else reads and writes :data:`COPY_CHUNK` bytes at a time.
    """
    copied = 0
    with open(src, "rb") as fh:
        if hasattr(os, "copy_file_range"):
            size = os.fstat(fh.fileno()).st_size
            want_all = size - offset if length is None else length
            dst.flush()  # the kernel writes at the descriptor's offset: nothing may sit buffered
            try:
                while copied < want_all:
                    n = os.copy_file_range(
                        fh.fileno(), dst.fileno(), want_all - copied, offset + copied
                    )
                    if n == 0:
                        break
                    copied += n
            except OSError as exc:  # not supported between these files: copy through Python
                if exc.errno in (*NO_SPACE, errno.EIO):
                    raise  # a real write error, not a missing feature
        fh.seek(offset + copied)
        while length is None or copied < length:
            want = COPY_CHUNK if length is None else min(COPY_CHUNK, length - copied)
            chunk = fh.read(want)
            if not chunk:
                break
            dst.write(chunk)
            copied += len(chunk)
    if length is not None and copied != length:
        raise OSError(f"{src}: expected {length} bytes from offset {offset}, found {copied}")
    return copied


def iter_raw_chunks(path: Path, dtype: np.dtype[Any], row: int | None = None) -> Any:
    """Yield ``path`` (raw bytes, no header) as 1-d arrays of ``dtype``, or 2-d of ``row`` columns."""
    width = 1 if row is None else row
    step = max(1, COPY_CHUNK // max(1, dtype.itemsize * width)) * width
    with open(path, "rb") as fh:
        while True:
            chunk = np.fromfile(fh, dtype=dtype, count=step)
            if chunk.size == 0:
                return
            yield chunk if row is None else chunk.reshape(-1, row)


class NpyWriter:
    """Write one ``.npy`` file of known dtype and shape by appending its C-order bytes.

    The header is written first; :meth:`close` checks that exactly ``prod(shape) * itemsize``
    bytes came, then renames the temporary file to ``path``. :meth:`abort` removes it.
    """

    def __init__(self, path: Path, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(n) for n in shape)
        self.expected = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self.written = 0
        self._write = AtomicWrite(path)
        self.fh: IO[bytes] = open(self._write.tmp, "wb")  # noqa: SIM115 - closed in close()/abort()
        header = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": self.shape,
        }
        try:
            np.lib.format.write_array_header_1_0(self.fh, header)
        except ValueError:
            self.fh.seek(0)
            self.fh.truncate()
            np.lib.format.write_array_header_2_0(self.fh, header)

    def write(self, data: Any) -> None:
        """Append raw bytes, or an array (converted to this file's dtype, C order)."""
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data, dtype=self.dtype).reshape(-1).view(np.uint8).data
        self.written += len(memoryview(data).cast("B"))
        self.fh.write(data)

    def copy_from(self, src: Path, offset: int = 0, length: int | None = None) -> None:
        """Append bytes of file ``src`` (see :func:`copy_bytes`)."""
        self.written += copy_bytes(src, self.fh, offset, length)

    def close(self) -> None:
        self.fh.close()
        if self.written != self.expected:
            self._write.abort()
            raise ValueError(
                f"{self.path}: wrote {self.written} data bytes, expected {self.expected}"
            )
        self._write.commit()

    def abort(self) -> None:
        self.fh.close()
        self._write.abort()
