"""Safe encodings of sample values: bytes that plain code decodes without ``pickle``.

A value becomes a *member* ``(kind, bytes)``; the kind says how to decode it and doubles as the
WebDataset file extension, so ``webdataset``'s standard decoders read every kind but ``pss``:

==========  ============  ====================================================================
kind        extension     bytes
==========  ============  ====================================================================
``NPY``     ``npy``       an ``ndarray`` of any non-object dtype, exactly as ``np.save`` writes
                          it: ``np.load(io.BytesIO(b), allow_pickle=False)``
``SCALAR``  ``scalar.npy`` a numpy scalar (``np.float32(1.5)``): ``np.save`` of the 0-d array;
                          the value is ``np.load(...)[()]``
``CLS``     ``cls``       a Python ``int`` of at most ``MAX_TEXT_INT_BITS`` bits: ASCII decimal
                          (WebDataset's class label); a bigger one is ``PSS`` (exact bytes)
``JSON``    ``json``      a value JSON represents exactly: ``None``, ``bool``, ``int`` (at most
                          ``MAX_TEXT_INT_BITS`` bits),
                          ``float`` (``NaN``/``Infinity`` as Python's ``json`` writes them),
                          ``str``, and ``list``/``dict`` (string keys) of those; UTF-8
``PSS``     ``pss``       anything else :func:`encode_pss` can write (:mod:`~.pss`)
==========  ============  ====================================================================

The PSS codec is in :mod:`pickleshard.formats.pss`, ``.npy`` bytes in
:mod:`pickleshard.formats.npy`; both are re-exported here.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

import numpy as np

from .npy import decode_npy, encode_npy, raw_bytes
from .pss import decode_pss, encode_pss, sample_digest

__all__ = [
    "MAX_TEXT_INT_BITS",
    "MemberKind",
    "decode_member",
    "decode_npy",
    "decode_pss",
    "encode_member",
    "encode_npy",
    "encode_pss",
    "is_json_exact",
    "raw_bytes",
    "sample_digest",
]

_MAX_DEPTH = 200
# Ints as decimal text only while every Python reads them back: int('...') refuses more digits
# than sys.get_int_max_str_digits() (4300 by default, 640 at the lowest setting); 2000 bits
# is 603 digits. Bigger ints go to PSS, which stores their two's-complement bytes exactly.
MAX_TEXT_INT_BITS = 2000


class MemberKind(IntEnum):
    """How one encoded value is stored; ``ext`` is its WebDataset extension."""

    NPY = 0
    SCALAR = 1
    CLS = 2
    JSON = 3
    PSS = 4

    @property
    def ext(self) -> str:
        return _EXTENSIONS[self]


_EXTENSIONS = {
    MemberKind.NPY: "npy",
    MemberKind.SCALAR: "scalar.npy",
    MemberKind.CLS: "cls",
    MemberKind.JSON: "json",
    MemberKind.PSS: "pss",
}


# ---- members ----------------------------------------------------------------------------------


def is_json_exact(value: Any, depth: int = 0) -> bool:
    """True when ``json.loads(json.dumps(value))`` gives back the same types and values."""
    t = type(value)
    if t is int:
        return bool(value.bit_length() <= MAX_TEXT_INT_BITS)
    if value is None or t is bool or t is float or t is str:
        return True
    if depth > _MAX_DEPTH:
        return False
    if t is list:
        return all(is_json_exact(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and is_json_exact(v, depth + 1) for k, v in value.items())
    return False


def _plain_ndarray(value: Any) -> bool:
    return type(value) is np.ndarray and not value.dtype.hasobject


def encode_member(value: Any) -> tuple[MemberKind, bytes]:
    """Encode one field value; see the module docstring for the kinds. Raises ``TypeError``."""
    parts: list[Any] = []
    if _plain_ndarray(value):
        encode_npy(value, parts.append)
        return MemberKind.NPY, b"".join(parts)
    if isinstance(value, np.generic) and not value.dtype.hasobject:
        encode_npy(np.asarray(value), parts.append)
        return MemberKind.SCALAR, b"".join(parts)
    if type(value) is int and value.bit_length() <= MAX_TEXT_INT_BITS:
        return MemberKind.CLS, str(value).encode("ascii")
    if is_json_exact(value):
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            return MemberKind.JSON, text.encode("utf-8")
        except (UnicodeEncodeError, ValueError, RecursionError):
            pass  # lone surrogates, or nesting json cannot handle: PSS passes them
    return MemberKind.PSS, encode_pss(value)


def decode_member(kind: int, data: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`encode_member`. Raises ``ValueError`` on malformed bytes."""
    if kind == MemberKind.NPY:
        return decode_npy(data)
    if kind == MemberKind.SCALAR:
        arr = decode_npy(data)
        if arr.ndim != 0:
            raise ValueError(f"a scalar member holds an array of shape {arr.shape}")
        return arr[()]
    try:
        if kind == MemberKind.CLS:
            text = bytes(data)
            if not text.strip().lstrip(b"-").isdigit():
                raise ValueError(f"class label is not a decimal integer: {text[:40]!r}")
            return int(text)
        if kind == MemberKind.JSON:
            return json.loads(bytes(data).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"bad UTF-8: {exc}") from None
    if kind == MemberKind.PSS:
        return decode_pss(data)
    raise ValueError(f"unknown member kind {kind}")
