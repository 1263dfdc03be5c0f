"""Sample values as standard encodings, each named by a WebDataset extension.

A value becomes a *member* ``(kind, bytes)``; the kind's extension says which library decodes
it, so a reader needs numpy, ``json`` and (for the last kind) ``pickle``, never pickleshard.
``webdataset``'s default decoders read every kind:

==========  ==============  ===================================================================
kind        extension       bytes, and how to decode them
==========  ==============  ===================================================================
``NPY``     ``npy``         an ``ndarray`` of any non-object dtype, exactly as ``np.save``
                            writes it: ``np.load(io.BytesIO(b))``
``SCALAR``  ``scalar.npy``  a numpy scalar (``np.float32(1.5)``) as the ``.npy`` of its 0-d
                            array: ``np.load(io.BytesIO(b))[()]``
``CLS``     ``cls``         a Python ``int`` of at most ``MAX_TEXT_INT_BITS`` bits, in ASCII
                            decimal (WebDataset's class label): ``int(b)``
``TXT``     ``txt``         a ``str`` (one UTF-8 can encode): ``b.decode()``
``JSON``    ``json``        ``None``, ``bool``, ``float`` (``NaN``/``Infinity`` as Python's
                            ``json`` writes them) and ``list``/``dict`` (string keys) of
                            JSON-exact values, UTF-8: ``json.loads(b)``
``PICKLE``  ``pickle``      anything else, pickle protocol 5: ``pickle.loads(b)``; pickleshard
                            loads it under its :class:`~pickleshard.safety.UnpicklePolicy`
==========  ==============  ===================================================================

Content digests for ``verify`` are in :mod:`.digest`, ``.npy`` bytes in :mod:`.npy`.
"""

from __future__ import annotations

import io
import json
import math
import pickle
from enum import IntEnum
from typing import Any

import numpy as np

from ..errors import UnsafePickleError
from ..safety import DEFAULT_POLICY, UnpicklePolicy
from .digest import sample_digest
from .npy import decode_npy, encode_npy, raw_bytes
from .pickled import pickle_value

__all__ = [
    "MAX_TEXT_INT_BITS",
    "MemberKind",
    "decode_member",
    "decode_npy",
    "encode_member",
    "encode_npy",
    "is_json_exact",
    "kind_of_ext",
    "pickle_value",
    "raw_bytes",
    "sample_digest",
]

_MAX_DEPTH = 200
# Ints as decimal text only while every Python reads them back: int('...') refuses more digits
# than sys.get_int_max_str_digits() (4300 by default, 640 at the lowest setting); 2000 bits
# is 603 digits. Bigger ints are pickled, which stores their bytes exactly.
MAX_TEXT_INT_BITS = 2000


class MemberKind(IntEnum):
    """How one encoded value is stored; ``ext`` is its WebDataset extension."""

    NPY = 0
    SCALAR = 1
    CLS = 2
    TXT = 3
    JSON = 4
    PICKLE = 5

    @property
    def ext(self) -> str:
        return _EXTENSIONS[self]


_EXTENSIONS = {
    MemberKind.NPY: "npy",
    MemberKind.SCALAR: "scalar.npy",
    MemberKind.CLS: "cls",
    MemberKind.TXT: "txt",
    MemberKind.JSON: "json",
    MemberKind.PICKLE: "pickle",
}
_BY_EXT = {ext: kind for kind, ext in _EXTENSIONS.items()}
# What loading damaged pickle bytes raises, besides UnpicklingError.
_UNPICKLING_ERRORS = (
    pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError
)  # fmt: skip


def kind_of_ext(ext: str) -> MemberKind:
    """The kind whose extension is ``ext``; ``ValueError`` for any other."""
    try:
        return _BY_EXT[ext]
    except KeyError:
        raise ValueError(f"unknown member extension {ext!r}") from None


def is_json_exact(value: Any, depth: int = 0) -> bool:
    """True when ``json.loads(json.dumps(value))`` gives back the same types and values."""
    t = type(value)
    if t is int:
        return bool(value.bit_length() <= MAX_TEXT_INT_BITS)
    if t is float:  # json writes NaN and inf as non-standard words, and NaN loses its sign
        return math.isfinite(value)
    if value is None or t is bool or t is str:
        return True
    if depth > _MAX_DEPTH:
        return False
    if t is list:
        return all(is_json_exact(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and is_json_exact(v, depth + 1) for k, v in value.items())
    return False


def encode_member(value: Any) -> tuple[MemberKind, bytes]:
    """Encode one field value; see the module docstring for the kinds.

    Raises ``TypeError`` naming the type for a value pickle cannot write.
    """
    t = type(value)
    if t is np.ndarray and not value.dtype.hasobject:
        parts: list[Any] = []
        encode_npy(value, parts.append)
        return MemberKind.NPY, b"".join(parts)
    if isinstance(value, np.generic) and not value.dtype.hasobject:
        parts = []
        encode_npy(np.asarray(value), parts.append)
        return MemberKind.SCALAR, b"".join(parts)
    if t is int and value.bit_length() <= MAX_TEXT_INT_BITS:
        return MemberKind.CLS, str(value).encode("ascii")
    try:
        if t is str:
            return MemberKind.TXT, value.encode("utf-8")
        if is_json_exact(value):
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
            return MemberKind.JSON, text.encode("utf-8")
    except (UnicodeEncodeError, ValueError, RecursionError):
        pass  # lone surrogates, or nesting json cannot handle: pickle keeps them exactly
    return MemberKind.PICKLE, pickle_value(value)


def decode_member(
    kind: int,
    data: bytes | bytearray | memoryview,
    policy: UnpicklePolicy = DEFAULT_POLICY,
    path: str = "",
    sample: int | None = None,
) -> Any:
    """Inverse of :func:`encode_member`; ``PICKLE`` members load under ``policy`` (a refused
    global raises :class:`~pickleshard.errors.UnsafePickleError` naming ``path`` and
    ``sample``). Raises ``ValueError`` on malformed bytes."""
    if kind == MemberKind.NPY:
        return decode_npy(data)
    if kind == MemberKind.SCALAR:
        arr = decode_npy(data)
        if arr.ndim != 0:
            raise ValueError(f"a scalar member holds an array of shape {arr.shape}")
        return arr[()]
    if kind == MemberKind.PICKLE:
        try:
            return policy.unpickler(io.BytesIO(data), path, sample=sample).load()
        except UnsafePickleError:
            raise
        except _UNPICKLING_ERRORS as exc:
            raise ValueError(f"bad pickle member: {type(exc).__name__}: {exc}") from None
    try:
        if kind == MemberKind.CLS:
            text = bytes(data)
            if not text.strip().lstrip(b"-").isdigit():
                raise ValueError(f"class label is not a decimal integer: {text[:40]!r}")
            return int(text)
        if kind == MemberKind.TXT:
            return bytes(data).decode("utf-8")
        if kind == MemberKind.JSON:
            return json.loads(bytes(data).decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"bad UTF-8: {exc}") from None
    raise ValueError(f"unknown member kind {kind}")
