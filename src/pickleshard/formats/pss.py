"""PSS ("pickleshard safe"): a tagged binary encoding of Python and numpy values, no pickle.

Little-endian, lengths as ``u64``. Each value is one tag byte then its payload: ``N`` None,
``T``/``F`` bool, ``i`` int64, ``I`` int of any size (``u32`` length + two's-complement bytes),
``f`` float64, ``c`` complex128, ``s`` str (length + UTF-8, surrogates passed through), ``b``
bytes, ``B`` bytearray, ``l`` list, ``t`` tuple, ``S`` set, ``Z`` frozenset (count + items; set
items sorted by their encoding), ``d`` dict, ``o`` OrderedDict (count + key, value pairs), ``a``
ndarray (length + ``np.save`` bytes), ``A`` object ndarray (``u8`` ndim + shape + items in C
order), ``g`` numpy scalar (length + ``np.save`` bytes of the 0-d array), ``p`` CPU torch tensor
(``p``, the dtype name as an ``s`` value, ``u8`` ndim, shape, then length + raw bytes).
Decoding never imports or calls anything named by the data; malformed bytes raise
``ValueError``.

:func:`sample_digest` hashes a sample as the SHA-256 (first 16 bytes) of its PSS encoding, so two
samples have the same digest exactly when they hold the same types, dtypes, shapes and values.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .npy import decode_npy, encode_npy, npy_header, raw_bytes

__all__ = ["decode_pss", "encode_pss", "sample_digest"]

Write = Callable[[Any], object]

_MAX_DEPTH = 200
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_C128 = struct.Struct("<dd")


def _torch_tensor_type() -> type | None:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _write_len(write: Write, n: int) -> None:
    write(_U64.pack(n))


def _encode(value: Any, write: Write, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise TypeError(f"values nested deeper than {_MAX_DEPTH} levels cannot be encoded")
    t = type(value)
    if value is None:
        write(b"N")
    elif t is bool:
        write(b"T" if value else b"F")
    elif t is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            write(b"i" + _I64.pack(value))
        else:
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            write(b"I" + struct.pack("<I", len(data)) + data)
    elif t is float:
        write(b"f" + _F64.pack(value))
    elif t is complex:
        write(b"c" + _C128.pack(value.real, value.imag))
    elif t is str:
        data = value.encode("utf-8", "surrogatepass")
        write(b"s" + _U64.pack(len(data)))
        write(data)
    elif t is bytes or t is bytearray:
        write((b"b" if t is bytes else b"B") + _U64.pack(len(value)))
        write(value)
    elif t is list or t is tuple:
        write((b"l" if t is list else b"t") + _U64.pack(len(value)))
        for v in value:
            _encode(v, write, depth + 1)
    elif t is dict or t is OrderedDict:
        write((b"d" if t is dict else b"o") + _U64.pack(len(value)))
        for k, v in value.items():
            _encode(k, write, depth + 1)
            _encode(v, write, depth + 1)
    elif t is set or t is frozenset:
        items = sorted(encode_pss(v, depth + 1) for v in value)
        write((b"S" if t is set else b"Z") + _U64.pack(len(items)))
        for item in items:
            write(item)
    elif t is np.ndarray:
        _encode_ndarray(value, write, depth)
    elif isinstance(value, np.generic) and not value.dtype.hasobject:
        _write_npy_value(b"g", np.asarray(value), write)
    elif (tensor := _torch_tensor_type()) is not None and t is tensor:
        _encode_tensor(value, write)
    else:
        raise TypeError(
            f"cannot encode a value of type {t.__module__}.{t.__qualname__} without pickle; "
            "supported: None, bool, int, float, complex, str, bytes, bytearray, list, tuple, "
            "dict, OrderedDict, set, frozenset, numpy arrays and scalars, CPU torch tensors"
        )


def _encode_ndarray(value: np.ndarray[Any, Any], write: Write, depth: int) -> None:
    if value.dtype.hasobject:
        if value.dtype != np.dtype(object):
            raise TypeError("structured arrays with object fields cannot be encoded")
        write(b"A" + bytes([value.ndim]) + b"".join(_U64.pack(n) for n in value.shape))
        for v in value.reshape(-1):
            _encode(v, write, depth + 1)
        return
    _write_npy_value(b"a", value, write)


def _write_npy_value(tag: bytes, value: np.ndarray[Any, Any], write: Write) -> None:
    """``tag``, the length, then the ``.npy`` bytes of ``value`` (array data not copied)."""
    try:
        header = npy_header(value.dtype, value.shape)
    except UnicodeEncodeError:
        parts: list[Any] = []
        encode_npy(value, parts.append)
        data = b"".join(parts)
        write(tag + _U64.pack(len(data)))
        write(data)
        return
    write(tag + _U64.pack(len(header) + value.nbytes))
    write(header)
    write(raw_bytes(value))


def _encode_tensor(value: Any, write: Write) -> None:
    if value.device.type != "cpu" or value.is_sparse or value.is_quantized:
        raise TypeError("only dense CPU torch tensors can be encoded")
    name = str(value.dtype).removeprefix("torch.")
    flat = value.detach().contiguous().reshape(-1)
    raw = flat.view(_torch_bytes_dtype()).numpy() if flat.numel() else np.empty(0, np.uint8)
    write(b"p")
    _encode(name, write, 0)
    write(bytes([value.dim()]) + b"".join(_U64.pack(n) for n in value.shape))
    write(_U64.pack(raw.nbytes))
    write(raw.data)


def _torch_bytes_dtype() -> Any:
    import torch

    return torch.uint8


def encode_pss(value: Any, depth: int = 0) -> bytes:
    """The PSS encoding of ``value`` (module docstring). Raises ``TypeError`` for other types."""
    parts: list[Any] = []
    _encode(value, parts.append, depth)
    return b"".join(parts)


class _Reader:
    def __init__(self, buf: bytes | bytearray | memoryview) -> None:
        self.view = memoryview(buf).cast("B")
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.view):
            raise ValueError(f"PSS value ends early: need {n} bytes at {self.pos}")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def u64(self) -> int:
        return int(_U64.unpack(self.take(8))[0])

    def count(self) -> int:
        n = self.u64()
        if n > len(self.view) - self.pos:  # every item takes at least one byte
            raise ValueError(f"PSS count {n} exceeds the bytes left")
        return n

    def shape(self) -> tuple[int, ...]:
        ndim = self.take(1)[0]
        return tuple(self.u64() for _ in range(ndim))


_CONSTANTS: dict[bytes, Any] = {b"N": None, b"T": True, b"F": False}


def _decode(r: _Reader, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError(f"PSS value nested deeper than {_MAX_DEPTH}")
    tag = bytes(r.take(1))
    if tag in _CONSTANTS:
        return _CONSTANTS[tag]
    if tag == b"i":
        return _I64.unpack(r.take(8))[0]
    if tag == b"I":
        (n,) = struct.unpack("<I", r.take(4))
        return int.from_bytes(r.take(n), "little", signed=True)
    if tag == b"f":
        return _F64.unpack(r.take(8))[0]
    if tag == b"c":
        re, im = _C128.unpack(r.take(16))
        return complex(re, im)
    if tag == b"s":
        try:
            return bytes(r.take(r.u64())).decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise ValueError(f"bad UTF-8 in a PSS string: {exc}") from None
    if tag in (b"b", b"B"):
        data = r.take(r.u64())
        return bytes(data) if tag == b"b" else bytearray(data)
    if tag in (b"l", b"t", b"S", b"Z"):
        items = [_decode(r, depth + 1) for _ in range(r.count())]
        kind: type = {b"l": list, b"t": tuple, b"S": set, b"Z": frozenset}[tag]
        try:
            return items if kind is list else kind(items)
        except TypeError as exc:  # damaged bytes can put a list where a set item was
            raise ValueError(f"bad PSS set: {exc}") from None
    if tag in (b"d", b"o"):
        pairs = [(_decode(r, depth + 1), _decode(r, depth + 1)) for _ in range(r.count())]
        try:
            return dict(pairs) if tag == b"d" else OrderedDict(pairs)
        except TypeError as exc:
            raise ValueError(f"bad PSS dict key: {exc}") from None
    if tag == b"a":
        return decode_npy(r.take(r.u64()))
    if tag == b"g":
        arr = decode_npy(r.take(r.u64()))
        if arr.ndim != 0:
            raise ValueError("a PSS numpy scalar holds an array")
        return arr[()]
    if tag == b"A":
        shape = r.shape()
        size = int(np.prod(shape, dtype=np.int64))
        if size > len(r.view) - r.pos:
            raise ValueError("PSS object array is larger than its bytes")
        out = np.empty(size, dtype=object)
        for k in range(size):
            out[k] = _decode(r, depth + 1)
        return out.reshape(shape)
    if tag == b"p":
        return _decode_tensor(r)
    raise ValueError(f"unknown PSS tag {tag!r} at byte {r.pos - 1}")


def _decode_tensor(r: _Reader) -> Any:
    name = _decode(r, 0)
    shape = r.shape()
    raw = bytearray(r.take(r.u64()))
    import torch

    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)


def decode_pss(buf: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode_pss`. Raises ``ValueError`` on malformed or trailing bytes."""
    r = _Reader(buf)
    value = _decode(r, 0)
    if r.pos != len(r.view):
        raise ValueError(f"{len(r.view) - r.pos} trailing bytes after a PSS value")
    return value


def sample_digest(sample: Sequence[Any]) -> bytes:
    """The first 16 bytes of the SHA-256 of the PSS encoding of ``tuple(sample)``.

    Array data is fed to the hash without a copy. SHA-256 rather than BLAKE2: CPUs with SHA
    instructions hash it 3-4x faster, and hashing is a large share of conversion time.
    """
    h = hashlib.sha256()
    _encode(tuple(sample), h.update, 0)
    return h.digest()[:16]
