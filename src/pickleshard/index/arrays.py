"""The index's ``.npy`` files, opened as untrusted input: mapped without unpickling, checksummed.

:func:`load_array` opens one file once (through
:func:`~pickleshard.index.ondisk.open_index_file`, so a FIFO under its name does not hang it):
a regular file, a ``.npy`` header parsed here (never ``np.load``, never a pickle), exactly the
dtype and shape the files table implies (:func:`expected_shapes`), C order, no byte missing or
extra, and the CRC-32 the header recorded at build time (:func:`array_checksum`). What the
arrays hold is checked against the files table next, by :mod:`pickleshard.index.contents`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .checking import IndexProblem
from .files import FileEntry
from .ondisk import open_index_file

__all__ = [
    "array_checksum",
    "expected_shapes",
    "file_checksum",
    "load_array",
]


def array_checksum(data: Iterable[Any]) -> str:
    """The checksum stored in the header for an array file whose bytes are ``data`` (chunks).

    CRC-32 (zlib): it is there for accidental corruption (a flipped bit, a torn copy), which it
    catches at 1.4 GB/s here; no unkeyed checksum stops a forger, the content checks do."""
    crc = 0
    for chunk in data:
        crc = zlib.crc32(chunk, crc)
    return f"crc32:{crc:08x}"


def file_checksum(path: Path) -> str:
    """:func:`array_checksum` of the file at ``path`` (one the builder just wrote), read 4 MiB
    at a time."""
    with open(path, "rb") as fh:
        return array_checksum(iter(lambda: fh.read(1 << 22), b""))


def expected_shapes(files: list[FileEntry], nf: int) -> dict[str, tuple[int, ...]]:
    """The shape of every array of an index with this (checked) files table; ``ext_keys`` may
    have any length (``(-1,)``): the offsets say how many."""
    span = [f for f in files if f.mode == "span"]
    rows = sum(f.num_samples for f in span)
    return {
        "samples": (sum(f.num_samples for f in files),),
        "starts": (rows, nf),
        "ends": (rows, nf),
        "memo_base": (rows, nf),
        "ext_offsets": (rows * nf + len(span),),
        "ext_keys": (-1,),
        "records": (sum(int(f.scan["num_records"]) for f in span if f.scan), 3),
    }


def _read_npy_header(fh: Any, name: str) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            return np.lib.format.read_array_header_1_0(fh)
        if version == (2, 0):
            return np.lib.format.read_array_header_2_0(fh)
    except Exception as exc:  # numpy's own parser: a bounded literal_eval, never a pickle
        raise IndexProblem(name, f"is not a .npy file: {exc}") from None
    raise IndexProblem(name, f"is a .npy file of version {version}, expected 1.0 or 2.0")


def load_array(
    index_dir: Path, name: str, dtype: np.dtype[Any], shape: tuple[int, ...], checksum: str
) -> np.ndarray:
    """Map index file ``name`` read-only and return its array, once it is known to be a regular
    ``.npy`` of exactly ``dtype`` and ``shape`` (``(-1,)``: any length), in C order, with no
    byte missing or extra, whose bytes have ``checksum``. Never unpickles."""
    try:
        fh, st = open_index_file(index_dir / name)
    except OSError as exc:
        raise IndexProblem(name, f"cannot open: {exc.strerror or exc}") from None
    with fh:
        got_shape, fortran, got = _read_npy_header(fh, name)
        header_len = fh.tell()
        any_length = shape == (-1,) and len(got_shape) == 1
        if got.hasobject or got != dtype or fortran or not (got_shape == shape or any_length):
            raise IndexProblem(
                name,
                f"holds {got} {'Fortran-order ' if fortran else ''}shape {got_shape}, expected "
                f"{dtype} shape {'(any,)' if shape == (-1,) else shape}",
            )
        nbytes = math.prod(got_shape) * dtype.itemsize
        if st.st_size != header_len + nbytes:
            raise IndexProblem(
                name,
                f"is {st.st_size} bytes, expected {header_len + nbytes} for its header and data "
                "(truncated or extended)",
            )
        fh.seek(0)
        head = fh.read(header_len)
        try:
            array = np.memmap(fh, dtype=dtype, mode="r", offset=header_len, shape=got_shape)
        except (OSError, ValueError, OverflowError) as exc:
            raise IndexProblem(name, f"cannot be mapped: {exc}") from None
    data = np.asarray(array).reshape(-1).view(np.uint8) if nbytes else b""
    got_sum = array_checksum((head, data))
    if got_sum != checksum:
        raise IndexProblem(name, f"checksum {got_sum}, the header recorded {checksum}: corrupted")
    return array
