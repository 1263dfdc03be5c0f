"""Content digests of samples: equal exactly when two samples hold the same types and values.

:func:`sample_digest` feeds a canonical description of a sample to SHA-256 (first 16 bytes): a
tag byte per value, then its bytes (``u64`` little-endian lengths and counts). Containers are
walked (set items sorted by their own description, so the digest does not depend on the hash
seed), arrays contribute their ``.npy`` header and C-order bytes without a copy, CPU torch
tensors their dtype, shape and bytes; any other value contributes its pickle (protocol 5).
Conversion stores each sample's digest in ``hashes.npy``; ``pickleshard verify`` recomputes it.
Nothing here is ever decoded: the stored values use the plain encodings of :mod:`.encoding`.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .npy import encode_npy
from .pickled import pickle_value

__all__ = ["sample_digest"]

Feed = Callable[[Any], object]

_MAX_DEPTH = 200
_U64 = struct.Struct("<Q")
_F64 = struct.Struct("<d")
_TAGS: dict[type, bytes] = {
    list: b"l",
    tuple: b"t",
    dict: b"d",
    OrderedDict: b"o",
    set: b"S",
    frozenset: b"Z",
}


def _feed(value: Any, feed: Feed, depth: int) -> None:
    t = type(value)  # exact types: a subclass may hold more than its base's bytes say
    if depth > _MAX_DEPTH:  # past this, the pickle describes the rest (and refuses a cycle)
        _feed_pickle(value, feed)
    elif value is None or t is bool:
        feed(b"N" if value is None else b"T" if value else b"F")
    elif t is int:
        data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
        feed(b"i" + _U64.pack(len(data)) + data)
    elif t is float:
        feed(b"f" + _F64.pack(value))
    elif t is complex:
        feed(b"c" + _F64.pack(value.real) + _F64.pack(value.imag))
    elif t is str:
        data = value.encode("utf-8", "surrogatepass")
        feed(b"s" + _U64.pack(len(data)))
        feed(data)
    elif t is bytes or t is bytearray:
        feed((b"b" if t is bytes else b"B") + _U64.pack(len(value)))
        feed(value)
    elif t is list or t is tuple:
        feed(_TAGS[t] + _U64.pack(len(value)))
        for v in value:
            _feed(v, feed, depth + 1)
    elif t is dict or t is OrderedDict:
        feed(_TAGS[t] + _U64.pack(len(value)))
        for k, v in value.items():
            _feed(k, feed, depth + 1)
            _feed(v, feed, depth + 1)
    elif t is set or t is frozenset:
        items = sorted(_description(v, depth + 1) for v in value)
        feed(_TAGS[t] + _U64.pack(len(items)))
        for item in items:
            feed(item)
    elif t is np.ndarray and not value.dtype.hasobject:
        feed(b"a")
        encode_npy(value, feed)
    elif t is np.ndarray:
        feed(b"A" + _U64.pack(value.ndim) + b"".join(_U64.pack(n) for n in value.shape))
        feed(str(value.dtype).encode())
        for v in value.reshape(-1):
            _feed(v, feed, depth + 1)
    elif isinstance(value, np.generic) and not value.dtype.hasobject:
        feed(b"g")
        encode_npy(np.asarray(value), feed)
    # a tensor can only exist where torch was imported: never import it here
    elif (torch := sys.modules.get("torch")) is not None and t is torch.Tensor and _plain(value):
        flat = value.detach().contiguous().reshape(-1)
        feed(b"p" + str(value.dtype).encode() + _U64.pack(value.dim()))
        feed(b"".join(_U64.pack(n) for n in value.shape))
        if flat.numel():
            feed(flat.view(torch.uint8).numpy().data)
    else:
        _feed_pickle(value, feed)


def _plain(tensor: Any) -> bool:
    """A dense CPU tensor: its bytes are its value."""
    return bool(tensor.device.type == "cpu" and not tensor.is_sparse and not tensor.is_quantized)


def _feed_pickle(value: Any, feed: Feed) -> None:
    data = pickle_value(value)
    feed(b"P" + _U64.pack(len(data)))
    feed(data)


def _description(value: Any, depth: int) -> bytes:
    parts: list[Any] = []
    _feed(value, parts.append, depth)
    return b"".join(bytes(p) for p in parts)


def sample_digest(sample: Sequence[Any]) -> bytes:
    """The first 16 bytes of the SHA-256 of ``tuple(sample)``'s description (module docstring).

    Raises ``TypeError`` for a value pickle cannot write. SHA-256 rather than BLAKE2: CPUs with
    SHA instructions hash it 3-4x faster, and hashing is a large share of conversion time.
    """
    h = hashlib.sha256()
    _feed(tuple(sample), h.update, 0)
    return h.digest()[:16]
