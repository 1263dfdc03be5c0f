"""``.npy`` bytes in memory: written as ``np.save`` writes them, read back without pickle.

:func:`encode_npy` writes the header (cached per dtype and shape) and the array's C-order bytes
without copying them; :func:`decode_npy` parses a header once per distinct header (cached) and
returns a writable copy of the data. Object dtypes are refused both ways: they need pickle.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["decode_npy", "encode_npy", "map_npy", "npy_header", "raw_bytes"]

Write = Callable[[Any], object]

_HEADER_CACHE_MAX = 1024

_npy_headers: dict[tuple[np.dtype[Any], tuple[int, ...]], bytes] = {}
_npy_parsed: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}


def raw_bytes(arr: np.ndarray[Any, Any]) -> memoryview:
    """The C-order bytes of ``arr`` without a copy when it is already C-contiguous."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    if flat.dtype.itemsize == 0:
        return memoryview(b"")
    return flat.view(np.uint8).data


def npy_header(dtype: np.dtype[Any], shape: tuple[int, ...]) -> bytes:
    key = (dtype, shape)
    header = _npy_headers.get(key)
    if header is None:
        d = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
        buf = io.BytesIO()
        try:
            np.lib.format.write_array_header_1_0(buf, d)
        except ValueError:  # header over 64 KiB (a huge structured dtype): format 2.0
            buf = io.BytesIO()
            np.lib.format.write_array_header_2_0(buf, d)
        header = buf.getvalue()
        if len(_npy_headers) >= _HEADER_CACHE_MAX:
            _npy_headers.clear()
        _npy_headers[key] = header
    return header


def encode_npy(arr: np.ndarray[Any, Any], write: Write) -> None:
    """Write ``arr`` as ``np.save`` would (C order, no pickle) through ``write``."""
    try:
        header = npy_header(arr.dtype, arr.shape)
    except UnicodeEncodeError:  # non-latin-1 field names need format 3.0: let numpy do it all
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        write(buf.getvalue())
        return
    write(header)
    write(raw_bytes(arr))


def decode_npy(buf: bytes | bytearray | memoryview) -> np.ndarray[Any, Any]:
    """A writable array from ``.npy`` bytes; object dtypes are refused. Raises ``ValueError``."""
    view = memoryview(buf).cast("B")
    if len(view) < 10 or view[:6].tobytes() != b"\x93NUMPY":
        raise ValueError("not .npy bytes (bad magic)")
    major = view[6]
    if major == 1:
        start, hlen = 10, view[8] | view[9] << 8
    elif major in (2, 3) and len(view) >= 12:
        start, hlen = 12, int.from_bytes(view[8:12], "little")
    else:
        raise ValueError(f"unsupported or truncated .npy header (format version {major})")
    head = view[: start + hlen].tobytes()
    parsed = _npy_parsed.get(head)
    if parsed is None:
        parsed = _parse_header(head[start:], major, start + hlen)
        if len(_npy_parsed) >= _HEADER_CACHE_MAX:
            _npy_parsed.clear()
        _npy_parsed[head] = parsed
    dtype, shape, offset, count = parsed
    if len(view) - offset != count * dtype.itemsize:
        raise ValueError(
            f".npy data holds {len(view) - offset} bytes, expected {count * dtype.itemsize}"
        )
    if not count or not dtype.itemsize:
        return np.empty(shape, dtype=dtype)
    flat: np.ndarray[Any, Any] = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    out: np.ndarray[Any, Any] = flat.reshape(shape).copy()
    return out


def _parse_header(
    text: bytes, major: int, offset: int
) -> tuple[np.dtype[Any], tuple[int, ...], int, int]:
    """``(dtype, shape, data offset, element count)`` of a header's dict text."""
    try:
        d = ast.literal_eval(text.decode("utf8" if major == 3 else "latin1"))
        dtype = np.lib.format.descr_to_dtype(d["descr"])
        shape = tuple(int(n) for n in d["shape"])
        fortran = bool(d["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise ValueError(f"bad .npy header: {exc}") from None
    if dtype.hasobject:
        raise ValueError(".npy holds an object dtype, which only loads through pickle")
    if fortran and len(shape) > 1:
        raise ValueError("Fortran-order .npy is not produced by pickleshard")
    if any(n < 0 for n in shape):
        raise ValueError(f"bad .npy shape {shape}")
    count = 1
    for n in shape:
        count *= n
    return dtype, shape, offset, count


# What numpy raises on a damaged .npy file: a short header is EOFError, a garbled one a
# tokenize or syntax error from parsing the header's dict literal.
_HEADER_ERRORS = (EOFError, SyntaxError, tokenize.TokenError, TypeError, KeyError)


def map_npy(path: str | os.PathLike[str]) -> np.ndarray[Any, Any]:
    """``np.load(path, mmap_mode="r", allow_pickle=False)`` as a plain ndarray view.

    A damaged file raises ``ValueError`` (``OSError`` if it cannot be read), whatever numpy's
    header parser ran into.
    """
    try:
        mm = np.load(path, mmap_mode="r", allow_pickle=False)
    except _HEADER_ERRORS as exc:
        raise ValueError(
            f"{os.fspath(path)}: not a valid .npy file: {type(exc).__name__}: {exc}"
        ) from None
    # A plain ndarray view of the map: indexing a np.memmap subclass costs more per call.
    return np.asarray(mm).view(np.ndarray)
