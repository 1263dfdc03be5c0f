"""Per-file metadata: the small scalar values that sit beside the columns of a top-level dict.

CIFAR's batch files are ``{b"batch_label": b"training batch 1 of 5", b"labels": [...],
b"data": uint8 (10000, 3072), b"filenames": [...]}``: ``batch_label`` describes the file, not a
sample. In a file holding one pickle, a top-level dict's value that is a small scalar
(:func:`is_metadata`) is kept as the file's metadata, and the other values are the columns. Keys
are named as field names are (:func:`field_name`: ``bytes`` keys by their text).

The metadata is stored in the index's files table as JSON (:func:`metadata_to_json`), ``bytes``
as ``{"bytes_hex": "..."}``; an index is untrusted input, so :func:`metadata_from_json` checks
what it reads back.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "MAX_METADATA_BYTES",
    "field_name",
    "is_metadata",
    "metadata_from_json",
    "metadata_to_json",
]

MAX_METADATA_BYTES = 4096
"""The longest ``str`` (in characters) or ``bytes`` value kept as file metadata: a label, not data."""

_SCALARS = (bool, int, float, type(None))


def field_name(key: object) -> str:
    """The field (or metadata) name of a dict key: ``bytes`` (Python 2 ``str`` keys read with
    ``encoding="bytes"``) by their UTF-8 text, other keys by ``str()``."""
    if isinstance(key, bytes):
        return key.decode("utf-8", "backslashreplace")
    return str(key)


def is_metadata(value: object) -> bool:
    """Whether a top-level dict's value is kept as file metadata: ``None``, a ``bool``, ``int``
    or ``float``, or a ``str``/``bytes`` of at most :data:`MAX_METADATA_BYTES`."""
    if type(value) in (str, bytes):
        return len(value) <= MAX_METADATA_BYTES  # type: ignore[arg-type]
    return type(value) in _SCALARS


def metadata_to_json(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` (values passing :func:`is_metadata`) as JSON: ``bytes`` become ``{"bytes_hex"}``,
    non-finite floats ``{"float": "nan"}`` (strict JSON has no NaN)."""
    out: dict[str, Any] = {}
    for k, v in meta.items():
        if type(v) is bytes:
            out[k] = {"bytes_hex": v.hex()}
        elif type(v) is float and not math.isfinite(v):
            out[k] = {"float": repr(v)}
        else:
            out[k] = v
    return out


def metadata_from_json(obj: Any) -> dict[str, Any]:
    """The metadata :func:`metadata_to_json` stored; ``ValueError`` saying what is wrong for
    anything it could not have written (an index is untrusted input)."""
    if not isinstance(obj, dict):
        raise ValueError("metadata is not an object")
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if type(k) is not str:
            raise ValueError("a metadata key is not a string")
        if isinstance(v, dict):
            if set(v) == {"bytes_hex"} and type(v["bytes_hex"]) is str:
                try:
                    out[k] = bytes.fromhex(v["bytes_hex"])
                except ValueError:
                    raise ValueError(f"metadata {k!r} is not hex") from None
            elif set(v) == {"float"} and v["float"] in ("nan", "inf", "-inf"):
                out[k] = float(v["float"])
            else:
                raise ValueError(f"metadata {k!r} is an object of keys {sorted(v)}")
        else:
            out[k] = v
        if not is_metadata(out[k]):
            raise ValueError(f"metadata {k!r} is not a small scalar")
    return out
