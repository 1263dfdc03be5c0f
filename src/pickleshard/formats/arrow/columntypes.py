"""Column types of the Arrow and Parquet formats: what a field's values are, and its Arrow type.

Every value of a field is given a *column type*, a small JSON-able dict whose ``"t"`` says what
the value is; a part's values, then the parts, are folded with :func:`merge_types` into one
column type per field, which fixes the field's Arrow type (:func:`arrow_type`):

==========================  ===================================  ==========================
value                       column type                          Arrow type
==========================  ===================================  ==========================
``None`` (alone)            ``{"t": "null"}``                    ``null``
Python ``int`` (int64)      ``{"t": "int", "null": b}``          ``int64``
Python ``float``            ``{"t": "float", "null": b}``        ``double``
Python ``bool``             ``{"t": "bool", "null": b}``         ``bool``
``str`` (valid UTF-8)       ``{"t": "str", "null": b}``          ``string``
``bytes``                   ``{"t": "bytes", "null": b}``        ``binary``
``list`` of the above       ``{"t": "list", "item": T, ...}``    ``list<T>``
``dict``, same str keys (+) ``{"t": "struct", "fields": ...}``   ``struct<k: T, ...>``
numpy scalar                ``{"t": "scalar", "dtype": d}``      the primitive
ndarray, one shape          ``{"t": "array", "dtype", "shape"}`` nested ``fixed_size_list``
ndarray, shapes differ (*)  ``{"t": "ragged", "dtype", "ndim"}`` ``large_list`` + shape column
anything else               ``{"t": "pickle"}``                  ``large_binary`` (pickle protocol 5)
==========================  ===================================  ==========================

Numpy bools whose bytes are not 0 or 1 (views of other data) are pickled: Arrow packs bools to bits.
(+) at least one key: Parquet has no struct of no fields.
(*) or an empty array (a dimension of 0): Arrow has no fixed-size list of size 0.
``null: true`` says some values are ``None`` (Arrow nulls). Numpy dtypes stored natively are
bool, (u)int8-64 and float16-64 in either byte order (Arrow holds them little-endian; ``dtype``
keeps the original, which the reader restores). A 0-d array is its primitive, one per row. Any
other dtype (complex, datetime64, str, structured...), a tuple, a set, a dict with non-str keys
or differing keys, a list mixing types, or a mix of types in one field falls back to ``pickle``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "PICKLE",
    "ColumnType",
    "arrow_type",
    "infer_type",
    "is_native_dtype",
    "merge_types",
    "numpy_dtype",
]

ColumnType = dict[str, Any]

PICKLE: ColumnType = {"t": "pickle"}
_LEAVES = ("int", "float", "bool", "str", "bytes")
_PYTHON = frozenset({"null", *_LEAVES, "list", "struct"})
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_MAX_DEPTH = 16  # deeper nesting is rare in samples, and Parquet's levels grow with it
_MAX_KEYS = 256  # a dict with more keys is a mapping, not a record: pickle keeps it exact
_LEAF_TYPES: dict[type, str] = {
    int: "int",
    float: "float",
    bool: "bool",
    str: "str",
    bytes: "bytes",
}
_NULL: ColumnType = {"t": "null"}


def is_native_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether Arrow holds ``dtype`` as a primitive: bool, (u)int8-64, float16-64."""
    return dtype.kind == "b" or (dtype.kind in "iuf" and dtype.itemsize in (1, 2, 4, 8))


def numpy_dtype(ct: ColumnType) -> np.dtype[Any]:
    """The numpy dtype of a ``scalar``, ``array`` or ``ragged`` column type."""
    return np.dtype(ct["dtype"])


def _leaf(t: str, null: bool = False) -> ColumnType:
    return {"t": t, "null": null}


def infer_type(value: Any, depth: int = 0) -> ColumnType:
    """The column type of one value (module docstring); ``PICKLE`` for what Arrow cannot hold."""
    t = type(value)
    leaf = _LEAF_TYPES.get(t)
    if leaf is not None:
        if leaf == "int" and not _INT64_MIN <= value <= _INT64_MAX:
            return PICKLE
        if leaf == "str":
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:  # lone surrogates: Arrow strings are strict UTF-8
                return PICKLE
        return _leaf(leaf)
    if value is None:
        return _NULL
    if t is np.ndarray:
        if not is_native_dtype(value.dtype) or _odd_bools(value):
            return PICKLE
        if value.size == 0 and value.ndim:  # Arrow has no fixed_size_list of size 0
            return {"t": "ragged", "dtype": value.dtype.str, "ndim": value.ndim}
        return {"t": "array", "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, np.generic):
        if not is_native_dtype(value.dtype) or _odd_bools(value):
            return PICKLE
        return {"t": "scalar", "dtype": value.dtype.str}
    if depth >= _MAX_DEPTH:
        return PICKLE
    if t is list:
        item: ColumnType | None = None
        for v in value:
            item = merge_types(item, infer_type(v, depth + 1))
            if item["t"] not in _PYTHON:
                return PICKLE
        return {"t": "list", "null": False, "item": item}
    if t is dict and 0 < len(value) <= _MAX_KEYS and all(type(k) is str for k in value):
        fields = []
        for k, v in value.items():
            ft = infer_type(v, depth + 1)
            if ft["t"] not in _PYTHON or not _utf8(k):
                return PICKLE
            fields.append([k, ft])
        return {"t": "struct", "null": False, "fields": fields}
    return PICKLE


def _odd_bools(value: Any) -> bool:
    """numpy bools whose bytes are not all 0 or 1: Arrow's bit-packed bools would lose them."""
    if value.dtype.kind != "b" or value.size == 0:
        return False
    return bool(np.asarray(value).view(np.uint8).max() > 1)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _nullable(ct: ColumnType) -> ColumnType:
    return ct if ct["t"] == "null" or ct.get("null") else {**ct, "null": True}


def merge_types(a: ColumnType | None, b: ColumnType) -> ColumnType:
    """The column type that holds the values of both ``a`` (``None``: no values yet) and ``b``."""
    if a is None or a == b:
        return b
    ta, tb = a["t"], b["t"]
    if ta == "pickle" or tb == "pickle":
        return PICKLE
    if ta == "null" or tb == "null":
        other = b if ta == "null" else a
        return _nullable(other) if other["t"] in _PYTHON else PICKLE
    if ta != tb:
        if {ta, tb} == {"array", "ragged"}:
            return _merge_arrays(a, b)
        return PICKLE
    null = bool(a.get("null") or b.get("null"))
    if ta in _LEAVES:
        return _leaf(ta, null)
    if ta == "list":
        if a["item"] is None or b["item"] is None:
            item = a["item"] if b["item"] is None else b["item"]
        else:
            item = merge_types(a["item"], b["item"])
        return (
            PICKLE
            if item is not None and item["t"] == "pickle"
            else {**a, "null": null, "item": item}
        )
    if ta == "struct":
        return _merge_structs(a, b, null)
    if ta in ("array", "ragged"):
        return _merge_arrays(a, b)
    return PICKLE  # two numpy scalar types


def _merge_structs(a: ColumnType, b: ColumnType, null: bool) -> ColumnType:
    keys = [k for k, _ in a["fields"]]
    if keys != [k for k, _ in b["fields"]]:
        return PICKLE  # Arrow would fill missing keys with None: not the dict that was stored
    fields = []
    for (k, fa), (_, fb) in zip(a["fields"], b["fields"], strict=True):
        ft = merge_types(fa, fb)
        if ft["t"] == "pickle":
            return PICKLE
        fields.append([k, ft])
    return {"t": "struct", "null": null, "fields": fields}


def _ndim(ct: ColumnType) -> int:
    return len(ct["shape"]) if ct["t"] == "array" else int(ct["ndim"])


def _merge_arrays(a: ColumnType, b: ColumnType) -> ColumnType:
    if a["dtype"] != b["dtype"] or _ndim(a) != _ndim(b) or _ndim(a) == 0:
        return PICKLE
    return {"t": "ragged", "dtype": a["dtype"], "ndim": _ndim(a)}


def arrow_type(ct: ColumnType | None) -> Any:
    """The Arrow type of column type ``ct`` (for ``ragged``: of its values column)."""
    import pyarrow as pa

    if ct is None or ct["t"] == "pickle":
        return pa.large_binary()
    t = ct["t"]
    simple = {
        "null": pa.null(),
        "int": pa.int64(),
        "float": pa.float64(),
        "bool": pa.bool_(),
        "str": pa.string(),
        "bytes": pa.binary(),
    }
    if t in simple:
        return simple[t]
    if t == "list":
        return pa.list_(arrow_type(ct["item"]) if ct["item"] is not None else pa.null())
    if t == "struct":
        return pa.struct([(k, arrow_type(ft)) for k, ft in ct["fields"]])
    prim = pa.from_numpy_dtype(numpy_dtype(ct).newbyteorder("="))
    if t == "scalar":
        return prim
    if t == "ragged":
        return pa.large_list(prim)
    out = prim
    for n in reversed(ct["shape"]):
        out = pa.list_(out, int(n))
    return out
